//! Shared vocabulary of every shoal layer: the MongoDB-style error (numeric `code` plus
//! `codeName`), the limits that the wire, storage and server layers all enforce, the version
//! a process reports, and how arguments' values are read and named.
//! Kept tiny on purpose: nothing here does I/O or knows about commands.

pub mod api;
pub mod labels;
pub mod metrics;
pub mod optime;
pub mod server;
pub mod value;

use bson::Document;
use std::fmt;

/// Limits shared across layers; MongoDB's values, so drivers that read them from `hello` agree.
pub mod limits {
    /// Largest BSON document a client may store (`maxBsonObjectSize`).
    pub const BSON_OBJECT_SIZE_MAX_BYTES: usize = 16 * 1024 * 1024;
    /// Internal headroom MongoDB allows for command wrappers around a max-size document.
    pub const BSON_USER_OBJECT_SLACK_BYTES: usize = 16 * 1024;
    /// Largest wire message (`maxMessageSizeBytes`).
    pub const MESSAGE_SIZE_MAX_BYTES: usize = 48_000_000;
    /// Largest number of writes in one write command (`maxWriteBatchSize`).
    pub const WRITE_BATCH_SIZE_MAX: usize = 100_000;
    /// Deepest nesting of a BSON document accepted (MongoDB: 100 for stored docs, 180 for commands).
    pub const BSON_DEPTH_MAX: usize = 180;
    /// Memory a blocking stage ($group, $sort) may hold (MongoDB: 100 MiB per stage).
    pub const AGG_MEMORY_BYTES_MAX: usize = 100 * 1024 * 1024;
}

/// MongoDB error codes used by shoal, with the `codeName` MongoDB reports for each.
/// Source: mongo/src/mongo/base/error_codes.yml.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Code(pub i32, pub &'static str);

/// Declares each code as a `Code` constant, and `Code::ALL`, every one of them.
macro_rules! codes {
    ($($name:ident = ($n:expr, $s:expr)),* $(,)?) => {
        #[allow(non_upper_case_globals)]
        impl Code {
            $(pub const $name: Code = Code($n, $s);)*
            /// Every code shoal names: how a code given only as a number gets its name.
            pub const ALL: &'static [Code] = &[$(Code::$name),*];
        }
    };
}

codes! {
    InternalError = (1, "InternalError"),
    BadValue = (2, "BadValue"),
    NoSuchKey = (4, "NoSuchKey"),
    GraphContainsCycle = (5, "GraphContainsCycle"),
    FailedToParse = (9, "FailedToParse"),
    UserNotFound = (11, "UserNotFound"),
    Unauthorized = (13, "Unauthorized"),
    AuthenticationFailed = (18, "AuthenticationFailed"),
    RoleNotFound = (31, "RoleNotFound"),
    FileRenameFailed = (98, "FileRenameFailed"),
    MechanismUnavailable = (334, "MechanismUnavailable"),
    TypeMismatch = (14, "TypeMismatch"),
    Overflow = (15, "Overflow"),
    InvalidLength = (16, "InvalidLength"),
    IllegalOperation = (20, "IllegalOperation"),
    EmptyArrayOperation = (21, "EmptyArrayOperation"),
    InvalidBSON = (22, "InvalidBSON"),
    NamespaceNotFound = (26, "NamespaceNotFound"),
    IndexNotFound = (27, "IndexNotFound"),
    PathNotViable = (28, "PathNotViable"),
    NonExistentPath = (29, "NonExistentPath"),
    InvalidPath = (30, "InvalidPath"),
    ConflictingUpdateOperators = (40, "ConflictingUpdateOperators"),
    CursorNotFound = (43, "CursorNotFound"),
    NamespaceExists = (48, "NamespaceExists"),
    InvalidRoleModification = (49, "InvalidRoleModification"),
    MaxTimeMSExpired = (50, "MaxTimeMSExpired"),
    DollarPrefixedFieldName = (52, "DollarPrefixedFieldName"),
    InvalidIdField = (53, "InvalidIdField"),
    NotSingleValueField = (54, "NotSingleValueField"),
    EmptyFieldName = (56, "EmptyFieldName"),
    DottedFieldName = (57, "DottedFieldName"),
    CommandNotFound = (59, "CommandNotFound"),
    ImmutableField = (66, "ImmutableField"),
    CannotCreateIndex = (67, "CannotCreateIndex"),
    IndexAlreadyExists = (68, "IndexAlreadyExists"),
    InvalidOptions = (72, "InvalidOptions"),
    InvalidNamespace = (73, "InvalidNamespace"),
    IndexOptionsConflict = (85, "IndexOptionsConflict"),
    IndexKeySpecsConflict = (86, "IndexKeySpecsConflict"),
    NetworkTimeout = (89, "NetworkTimeout"),
    OperationFailed = (96, "OperationFailed"),
    WriteConcernFailed = (64, "WriteConcernFailed"),
    MultipleErrorsOccurred = (65, "MultipleErrorsOccurred"),
    ProtocolError = (17, "ProtocolError"),
    UnknownError = (8, "UnknownError"),
    Interrupted = (11601, "Interrupted"),
    QueryPlanKilled = (175, "QueryPlanKilled"),
    NotWritablePrimary = (10107, "NotWritablePrimary"),
    DuplicateKey = (11000, "DuplicateKey"),
    InvalidUUID = (207, "InvalidUUID"),
    NoSuchTransaction = (251, "NoSuchTransaction"),
    ConversionFailure = (241, "ConversionFailure"),
    BSONObjectTooLarge = (10334, "BSONObjectTooLarge"),
    Location16755 = (16755, "Location16755"),
    Location40352 = (40352, "Location40352"),
    Location40353 = (40353, "Location40353"),
    Location31254 = (31254, "Location31254"),
    Location17287 = (17287, "Location17287"),
    Location15998 = (15998, "Location15998"),
    Location16410 = (16410, "Location16410"),
    Location40324 = (40324, "Location40324"),
    Location15952 = (15952, "Location15952"),
    Location40323 = (40323, "Location40323"),
    Location31253 = (31253, "Location31253"),
    Location16554 = (16554, "Location16554"),
    Location28724 = (28724, "Location28724"),
    Location40234 = (40234, "Location40234"),
    Location15973 = (15973, "Location15973"),
    Location15974 = (15974, "Location15974"),
    Location15983 = (15983, "Location15983"),
    Location16020 = (16020, "Location16020"),
    Location51270 = (51270, "Location51270"),
    Location51091 = (51091, "Location51091"),
    Location51108 = (51108, "Location51108"),
    Location16837 = (16837, "Location16837"),
    InvalidPipelineOperator = (168, "InvalidPipelineOperator"),
    IDLUnknownField = (40415, "Location40415"),
    IDLFailedToParse = (40414, "Location40414"),
    ClientMetadataCannotBeMutated = (186, "ClientMetadataCannotBeMutated"),
    ExceededMemoryLimit = (146, "ExceededMemoryLimit"),
    OperationNotSupportedInTransaction = (263, "OperationNotSupportedInTransaction"),
    NotImplemented = (238, "NotImplemented"),
    CommandNotSupported = (115, "CommandNotSupported"),
    InvalidIndexSpecificationOption = (197, "InvalidIndexSpecificationOption"),
    QueryExceededMemoryLimitNoDiskUseAllowed = (292, "QueryExceededMemoryLimitNoDiskUseAllowed"),
    UnknownReplWriteConcern = (79, "UnknownReplWriteConcern"),
    InvalidReplicaSetConfig = (93, "InvalidReplicaSetConfig"),
    NoMatchingDocument = (47, "NoMatchingDocument"),
    IllegalOpMsgFlag = (223, "IllegalOpMsgFlag"),
    TooManyDocumentSequences = (233, "TooManyDocumentSequences"),
    ChecksumMismatch = (288, "ChecksumMismatch"),
    CannotIndexParallelArrays = (171, "CannotIndexParallelArrays"),
    IndexBuildAborted = (276, "IndexBuildAborted"),
    AlreadyInitialized = (23, "AlreadyInitialized"),
    NodeNotFound = (74, "NodeNotFound"),
    NoReplicationEnabled = (76, "NoReplicationEnabled"),
    NotYetInitialized = (94, "NotYetInitialized"),
    NotPrimaryNoSecondaryOk = (13435, "NotPrimaryNoSecondaryOk"),
    IncompleteTransactionHistory = (217, "IncompleteTransactionHistory"),
    TransactionTooOld = (225, "TransactionTooOld"),
    UnsatisfiableWriteConcern = (100, "UnsatisfiableWriteConcern"),
    CappedPositionLost = (136, "CappedPositionLost"),
    TooManyLogicalSessions = (261, "TooManyLogicalSessions"),
    HostUnreachable = (6, "HostUnreachable"),
    NotSecondary = (95, "NotSecondary"),
    ShutdownInProgress = (91, "ShutdownInProgress"),
    NewReplicaSetConfigurationIncompatible = (103, "NewReplicaSetConfigurationIncompatible"),
    ConfigurationInProgress = (109, "ConfigurationInProgress"),
    InvalidSyncSource = (119, "InvalidSyncSource"),
    OplogStartMissing = (120, "OplogStartMissing"),
    UnrecoverableRollbackError = (127, "UnrecoverableRollbackError"),
    StaleTerm = (145, "StaleTerm"),
    OplogOutOfOrder = (152, "OplogOutOfOrder"),
    PrimarySteppedDown = (189, "PrimarySteppedDown"),
    TooStaleToSyncFromSource = (315, "TooStaleToSyncFromSource"),
    ExceededTimeLimit = (262, "ExceededTimeLimit"),
    FailedToSatisfyReadPreference = (133, "FailedToSatisfyReadPreference"),
    InterruptedDueToReplStateChange = (11602, "InterruptedDueToReplStateChange"),
    NotPrimaryOrSecondary = (13436, "NotPrimaryOrSecondary"),
    ShardKeyNotFound = (61, "ShardKeyNotFound"),
    ShardNotFound = (70, "ShardNotFound"),
    StaleConfig = (13388, "StaleConfig"),
    ConflictingOperationInProgress = (117, "ConflictingOperationInProgress"),
    ShardingStateNotInitialized = (203, "ShardingStateNotInitialized"),
    ClusterTimeFailsRateLimiter = (205, "ClusterTimeFailsRateLimiter"),
    StaleDbVersion = (249, "StaleDbVersion"),
    HostNotFound = (7, "HostNotFound"),
    LockTimeout = (24, "LockTimeout"),
    WriteConflict = (112, "WriteConflict"),
    TransactionCommitted = (256, "TransactionCommitted"),
    TransactionTooLarge = (257, "TransactionTooLarge"),
    TransactionExceededLifetimeLimitSeconds = (290, "TransactionExceededLifetimeLimitSeconds"),
    PreparedTransactionInProgress = (267, "PreparedTransactionInProgress"),
    SnapshotTooOld = (239, "SnapshotTooOld"),
    NotAReplicaSet = (123, "NotAReplicaSet"),
    SnapshotUnavailable = (246, "SnapshotUnavailable"),
    RetryChangeStream = (234, "RetryChangeStream"),
    ChangeStreamFatalError = (280, "ChangeStreamFatalError"),
    InvalidResumeToken = (260, "InvalidResumeToken"),
    ChangeStreamHistoryLost = (286, "ChangeStreamHistoryLost"),
    SocketException = (9001, "SocketException"),
    LegacyNotPrimary = (10058, "LegacyNotPrimary"),
    InterruptedAtShutdown = (11600, "InterruptedAtShutdown"),
}

/// A MongoDB-shaped error: serialized as `{ok: 0, errmsg, code, codeName, ...extra}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
    /// Extra fields merged into the error reply or writeError (e.g. `keyPattern`, `keyValue`).
    /// Boxed: most errors have none, and every `Result` of the code base carries this type.
    pub extra: Option<Box<Document>>,
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code: code.0, code_name: code.1, message: message.into(), extra: None }
    }
    pub fn with_extra(mut self, extra: Document) -> Error {
        self.extra = Some(Box::new(extra));
        self
    }
    pub fn bad_value(message: impl Into<String>) -> Error {
        Error::new(Code::BadValue, message)
    }
    pub fn failed_to_parse(message: impl Into<String>) -> Error {
        Error::new(Code::FailedToParse, message)
    }
    pub fn type_mismatch(message: impl Into<String>) -> Error {
        Error::new(Code::TypeMismatch, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Code::InternalError, message)
    }
    /// An error with a bare location number, as MongoDB reports `uassert`s without a named code.
    pub fn location(code: i32, message: impl Into<String>) -> Error {
        // codeName of an unnamed location is "Location<code>"; leak once per distinct code is
        // avoided by interning through a small static table of what shoal raises.
        Error { code, code_name: location_name(code), message: message.into(), extra: None }
    }
    /// An error a peer replied with: its code and codeName kept as sent. Names are interned
    /// in a bounded table so a misbehaving peer cannot grow memory by inventing names.
    pub fn remote(code: i32, code_name: &str, message: impl Into<String>) -> Error {
        Error { code, code_name: remote_name(code_name), message: message.into(), extra: None }
    }
    /// An error whose code is given as a number (a test's fail point): named as MongoDB
    /// names it when shoal knows the code, else `Location<code>` as for a bare location.
    pub fn from_number(code: i32, message: impl Into<String>) -> Error {
        match Code::ALL.iter().find(|c| c.0 == code) {
            Some(c) => Error::new(*c, message),
            None => Error { code, code_name: remote_name(&format!("Location{code}")), message: message.into(), extra: None },
        }
    }
    pub fn is(&self, code: Code) -> bool {
        self.code == code.0
    }

    /// The reply a command that failed with this error answers with.
    pub fn to_reply(&self) -> Document {
        let mut d = bson::doc! { "ok": 0.0, "errmsg": self.message.clone(), "code": self.code, "codeName": self.code_name };
        if let Some(extra) = self.extra.as_deref() {
            for (k, v) in extra {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    }
}

/// Most distinct code names interned from peers' replies; MongoDB defines about 400.
const REMOTE_NAMES_MAX: usize = 1024;

fn remote_name(name: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&known) = names.get(name) {
        return known;
    }
    if names.len() >= REMOTE_NAMES_MAX || name.len() > 64 {
        return "UnknownError";
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

fn location_name(code: i32) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashMap<i32, &'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: only codes that shoal's own source raises reach here, a few hundred at most.
    names.entry(code).or_insert_with(|| Box::leak(format!("Location{code}").into_boxed_str()))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code_name, self.code, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn location_codes_are_named_like_mongodb() {
        let e = Error::location(31254, "x");
        assert_eq!(e.code_name, "Location31254");
        let a = Error::remote(189, "PrimarySteppedDown", "x");
        let b = Error::remote(189, "PrimarySteppedDown", "y");
        assert!(a.is(Code::PrimarySteppedDown) && std::ptr::eq(a.code_name, b.code_name));
        assert_eq!(Error::remote(1, &"x".repeat(65), "long").code_name, "UnknownError");
        assert_eq!(Error::new(Code::DuplicateKey, "d").code, 11000);
    }
}
