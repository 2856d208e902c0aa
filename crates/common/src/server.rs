//! What a shoal process says of itself, the same for mongod's role and the router's: the
//! version drivers see and the wire protocol range it speaks.

/// The MongoDB version whose behaviour shoal follows (`buildInfo.version`, `hello`).
pub const VERSION: &str = "7.0.0";
/// The newest wire protocol version spoken: MongoDB 7.0's.
pub const MAX_WIRE_VERSION: i32 = 21;
/// `logicalSessionTimeoutMinutes`: how long an idle session lives.
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;
/// The database where users authenticated outside shoal (by X.509 certificate) are defined;
/// it holds no data.
pub const EXTERNAL_DB: &str = "$external";

/// buildInfo's reply, the same for every role.
pub fn build_info() -> bson::Document {
    bson::doc! {
        "version": VERSION,
        "gitVersion": concat!("shoal-", env!("CARGO_PKG_VERSION")),
        "shoalVersion": env!("CARGO_PKG_VERSION"),
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": [7, 0, 0, 0],
        "openssl": { "running": "disabled", "compiled": "disabled" },
        "buildEnvironment": { "distmod": "shoal", "target_arch": std::env::consts::ARCH, "target_os": std::env::consts::OS },
        "bits": 64,
        "debug": cfg!(debug_assertions),
        "maxBsonObjectSize": crate::limits::BSON_OBJECT_SIZE_MAX_BYTES as i32,
        "storageEngines": ["fjall", "inMemory"],
    }
}
