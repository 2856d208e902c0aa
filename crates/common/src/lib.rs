//! Shared vocabulary of every shoal layer: the MongoDB-style error (numeric `code` plus
//! `codeName`), the limits that the wire, storage and server layers all enforce, the version
//! a process reports, and how arguments' values are read and named.
//! Kept tiny on purpose: nothing here does I/O or knows about commands.

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

#[allow(non_upper_case_globals)]
impl Code {
    pub const InternalError: Code = Code(1, "InternalError");
    pub const BadValue: Code = Code(2, "BadValue");
    pub const NoSuchKey: Code = Code(4, "NoSuchKey");
    pub const GraphContainsCycle: Code = Code(5, "GraphContainsCycle");
    pub const FailedToParse: Code = Code(9, "FailedToParse");
    pub const UserNotFound: Code = Code(11, "UserNotFound");
    pub const Unauthorized: Code = Code(13, "Unauthorized");
    pub const AuthenticationFailed: Code = Code(18, "AuthenticationFailed");
    pub const RoleNotFound: Code = Code(31, "RoleNotFound");
    pub const FileRenameFailed: Code = Code(98, "FileRenameFailed");
    pub const MechanismUnavailable: Code = Code(334, "MechanismUnavailable");
    pub const TypeMismatch: Code = Code(14, "TypeMismatch");
    pub const Overflow: Code = Code(15, "Overflow");
    pub const InvalidLength: Code = Code(16, "InvalidLength");
    pub const IllegalOperation: Code = Code(20, "IllegalOperation");
    pub const EmptyArrayOperation: Code = Code(21, "EmptyArrayOperation");
    pub const InvalidBSON: Code = Code(22, "InvalidBSON");
    pub const NamespaceNotFound: Code = Code(26, "NamespaceNotFound");
    pub const IndexNotFound: Code = Code(27, "IndexNotFound");
    pub const PathNotViable: Code = Code(28, "PathNotViable");
    pub const NonExistentPath: Code = Code(29, "NonExistentPath");
    pub const InvalidPath: Code = Code(30, "InvalidPath");
    pub const ConflictingUpdateOperators: Code = Code(40, "ConflictingUpdateOperators");
    pub const CursorNotFound: Code = Code(43, "CursorNotFound");
    pub const NamespaceExists: Code = Code(48, "NamespaceExists");
    pub const InvalidRoleModification: Code = Code(49, "InvalidRoleModification");
    pub const MaxTimeMSExpired: Code = Code(50, "MaxTimeMSExpired");
    pub const DollarPrefixedFieldName: Code = Code(52, "DollarPrefixedFieldName");
    pub const InvalidIdField: Code = Code(53, "InvalidIdField");
    pub const NotSingleValueField: Code = Code(54, "NotSingleValueField");
    pub const EmptyFieldName: Code = Code(56, "EmptyFieldName");
    pub const DottedFieldName: Code = Code(57, "DottedFieldName");
    pub const CommandNotFound: Code = Code(59, "CommandNotFound");
    pub const ImmutableField: Code = Code(66, "ImmutableField");
    pub const CannotCreateIndex: Code = Code(67, "CannotCreateIndex");
    pub const IndexAlreadyExists: Code = Code(68, "IndexAlreadyExists");
    pub const InvalidOptions: Code = Code(72, "InvalidOptions");
    pub const InvalidNamespace: Code = Code(73, "InvalidNamespace");
    pub const IndexOptionsConflict: Code = Code(85, "IndexOptionsConflict");
    pub const IndexKeySpecsConflict: Code = Code(86, "IndexKeySpecsConflict");
    pub const NetworkTimeout: Code = Code(89, "NetworkTimeout");
    pub const OperationFailed: Code = Code(96, "OperationFailed");
    pub const WriteConcernFailed: Code = Code(64, "WriteConcernFailed");
    pub const MultipleErrorsOccurred: Code = Code(65, "MultipleErrorsOccurred");
    pub const ProtocolError: Code = Code(17, "ProtocolError");
    pub const UnknownError: Code = Code(8, "UnknownError");
    pub const Interrupted: Code = Code(11601, "Interrupted");
    pub const QueryPlanKilled: Code = Code(175, "QueryPlanKilled");
    pub const NotWritablePrimary: Code = Code(10107, "NotWritablePrimary");
    pub const DuplicateKey: Code = Code(11000, "DuplicateKey");
    pub const InvalidUUID: Code = Code(207, "InvalidUUID");
    pub const NoSuchTransaction: Code = Code(251, "NoSuchTransaction");
    pub const ConversionFailure: Code = Code(241, "ConversionFailure");
    pub const BSONObjectTooLarge: Code = Code(10334, "BSONObjectTooLarge");
    pub const Location16755: Code = Code(16755, "Location16755");
    pub const Location40352: Code = Code(40352, "Location40352");
    pub const Location40353: Code = Code(40353, "Location40353");
    pub const Location31254: Code = Code(31254, "Location31254");
    pub const Location17287: Code = Code(17287, "Location17287");
    pub const Location15998: Code = Code(15998, "Location15998");
    pub const Location16410: Code = Code(16410, "Location16410");
    pub const Location40324: Code = Code(40324, "Location40324");
    pub const Location15952: Code = Code(15952, "Location15952");
    pub const Location40323: Code = Code(40323, "Location40323");
    pub const Location31253: Code = Code(31253, "Location31253");
    pub const Location16554: Code = Code(16554, "Location16554");
    pub const Location28724: Code = Code(28724, "Location28724");
    pub const Location40234: Code = Code(40234, "Location40234");
    pub const Location15973: Code = Code(15973, "Location15973");
    pub const Location15974: Code = Code(15974, "Location15974");
    pub const Location15983: Code = Code(15983, "Location15983");
    pub const Location16020: Code = Code(16020, "Location16020");
    pub const Location51270: Code = Code(51270, "Location51270");
    pub const Location51091: Code = Code(51091, "Location51091");
    pub const Location51108: Code = Code(51108, "Location51108");
    pub const Location16837: Code = Code(16837, "Location16837");
    pub const InvalidPipelineOperator: Code = Code(168, "InvalidPipelineOperator");
    pub const IDLUnknownField: Code = Code(40415, "Location40415");
    pub const IDLFailedToParse: Code = Code(40414, "Location40414");
    pub const ClientMetadataCannotBeMutated: Code = Code(186, "ClientMetadataCannotBeMutated");
    pub const ExceededMemoryLimit: Code = Code(146, "ExceededMemoryLimit");
    pub const OperationNotSupportedInTransaction: Code = Code(263, "OperationNotSupportedInTransaction");
    pub const NotImplemented: Code = Code(238, "NotImplemented");
    pub const CommandNotSupported: Code = Code(115, "CommandNotSupported");
    pub const InvalidIndexSpecificationOption: Code = Code(197, "InvalidIndexSpecificationOption");
    pub const QueryExceededMemoryLimitNoDiskUseAllowed: Code = Code(292, "QueryExceededMemoryLimitNoDiskUseAllowed");
    pub const UnknownReplWriteConcern: Code = Code(79, "UnknownReplWriteConcern");
    pub const InvalidReplicaSetConfig: Code = Code(93, "InvalidReplicaSetConfig");
    pub const NoMatchingDocument: Code = Code(47, "NoMatchingDocument");
    pub const IllegalOpMsgFlag: Code = Code(223, "IllegalOpMsgFlag");
    pub const TooManyDocumentSequences: Code = Code(233, "TooManyDocumentSequences");
    pub const ChecksumMismatch: Code = Code(288, "ChecksumMismatch");
    pub const CannotIndexParallelArrays: Code = Code(171, "CannotIndexParallelArrays");
    pub const IndexBuildAborted: Code = Code(276, "IndexBuildAborted");
    pub const AlreadyInitialized: Code = Code(23, "AlreadyInitialized");
    pub const NodeNotFound: Code = Code(74, "NodeNotFound");
    pub const NoReplicationEnabled: Code = Code(76, "NoReplicationEnabled");
    pub const NotYetInitialized: Code = Code(94, "NotYetInitialized");
    pub const NotPrimaryNoSecondaryOk: Code = Code(13435, "NotPrimaryNoSecondaryOk");
    pub const IncompleteTransactionHistory: Code = Code(217, "IncompleteTransactionHistory");
    pub const TransactionTooOld: Code = Code(225, "TransactionTooOld");
    pub const UnsatisfiableWriteConcern: Code = Code(100, "UnsatisfiableWriteConcern");
    pub const CappedPositionLost: Code = Code(136, "CappedPositionLost");
    pub const TooManyLogicalSessions: Code = Code(261, "TooManyLogicalSessions");
    pub const HostUnreachable: Code = Code(6, "HostUnreachable");
    pub const NotSecondary: Code = Code(95, "NotSecondary");
    pub const ShutdownInProgress: Code = Code(91, "ShutdownInProgress");
    pub const NewReplicaSetConfigurationIncompatible: Code = Code(103, "NewReplicaSetConfigurationIncompatible");
    pub const ConfigurationInProgress: Code = Code(109, "ConfigurationInProgress");
    pub const InvalidSyncSource: Code = Code(119, "InvalidSyncSource");
    pub const OplogStartMissing: Code = Code(120, "OplogStartMissing");
    pub const UnrecoverableRollbackError: Code = Code(127, "UnrecoverableRollbackError");
    pub const StaleTerm: Code = Code(145, "StaleTerm");
    pub const OplogOutOfOrder: Code = Code(152, "OplogOutOfOrder");
    pub const PrimarySteppedDown: Code = Code(189, "PrimarySteppedDown");
    pub const TooStaleToSyncFromSource: Code = Code(315, "TooStaleToSyncFromSource");
    pub const ExceededTimeLimit: Code = Code(262, "ExceededTimeLimit");
    pub const FailedToSatisfyReadPreference: Code = Code(133, "FailedToSatisfyReadPreference");
    pub const InterruptedDueToReplStateChange: Code = Code(11602, "InterruptedDueToReplStateChange");
    pub const NotPrimaryOrSecondary: Code = Code(13436, "NotPrimaryOrSecondary");
    pub const ShardKeyNotFound: Code = Code(61, "ShardKeyNotFound");
    pub const ShardNotFound: Code = Code(70, "ShardNotFound");
    pub const StaleConfig: Code = Code(13388, "StaleConfig");
    pub const ConflictingOperationInProgress: Code = Code(117, "ConflictingOperationInProgress");
    pub const ShardingStateNotInitialized: Code = Code(203, "ShardingStateNotInitialized");
    pub const StaleDbVersion: Code = Code(249, "StaleDbVersion");
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
