//! What a shoal process says of itself, the same for mongod's role and the router's: the
//! version drivers see and the wire protocol range it speaks.

/// The MongoDB version whose behaviour shoal follows (`buildInfo.version`, `hello`).
pub const VERSION: &str = "7.0.0";
/// The newest wire protocol version spoken: MongoDB 7.0's.
pub const MAX_WIRE_VERSION: i32 = 21;
/// `logicalSessionTimeoutMinutes`: how long an idle session lives.
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;
