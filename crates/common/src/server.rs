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

/// getParameter's reply from every parameter the process has (`all`): `"*"` or
/// `{allParameters: true}` gives them all, otherwise the ones the command names.
pub fn select_parameters(all: bson::Document, cmd: &bson::Document) -> crate::Result<bson::Document> {
    use crate::{Code, Error};
    let everything = match cmd.get("getParameter") {
        Some(bson::Bson::String(s)) => s == "*",
        Some(bson::Bson::Document(d)) => d.get_bool("allParameters").unwrap_or(false),
        _ => false,
    };
    if everything {
        return Ok(all);
    }
    let mut out = bson::Document::new();
    for (k, _) in cmd.iter().skip(1) {
        if crate::value::GENERIC_ARGS.contains(&k.as_str()) {
            continue;
        }
        match all.get(k) {
            Some(v) => {
                out.insert(k.clone(), v.clone());
            }
            None => return Err(Error::new(Code::InvalidOptions, "no option found to get")),
        }
    }
    if out.is_empty() {
        return Err(Error::new(Code::InvalidOptions, "no option found to get"));
    }
    Ok(out)
}

/// getLog: shoal logs to stderr, and keeps only the (empty) startupWarnings in memory.
pub fn get_log(cmd: &bson::Document) -> crate::Result<bson::Document> {
    use crate::{Code, Error};
    match cmd.get("getLog") {
        Some(bson::Bson::String(s)) if s == "*" => Ok(bson::doc! { "names": ["startupWarnings"] }),
        Some(bson::Bson::String(s)) if s == "startupWarnings" => Ok(bson::doc! { "totalLinesWritten": 0, "log": [] }),
        Some(bson::Bson::String(s)) => Err(Error::new(Code::NoSuchKey, format!("No log named '{s}'"))),
        _ => Err(Error::type_mismatch("Argument to getLog must be of type String")),
    }
}

/// Commands that exist only with `enableTestCommands` (as mongod's test commands register
/// only then): listCommands leaves them out otherwise.
pub const TEST_COMMANDS: &[&str] = &["configureFailPoint", "waitForFailPoint", "testVersion2", "testVersion1AndVersion2"];

/// The commands a transaction may run (mongod's list).
pub fn allowed_in_transaction(name: &str) -> bool {
    matches!(
        name,
        "find"
            | "getMore"
            | "killCursors"
            | "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "aggregate"
            | "distinct"
            | "create"
            | "createIndexes"
            | "prepareTransaction"
            | "commitTransaction"
            | "abortTransaction"
            | "coordinateCommitTransaction"
    )
}
