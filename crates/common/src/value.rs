//! Reading command arguments and naming values as MongoDB does.

use crate::{Error, Result};
use bson::spec::ElementType as T;
use bson::{Bson, Document};

/// A numeric argument as an integer: int, long, a finite double or a decimal, truncated.
pub fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(*i as i64),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.is_finite() => Some(*d as i64),
        Bson::Decimal128(d) => d.to_string().parse::<f64>().ok().map(|f| f as i64),
        _ => None,
    }
}

/// MongoDB's name of a value's type (`$type`, error messages).
pub fn type_name(v: &Bson) -> &'static str {
    match v.element_type() {
        T::Double => "double",
        T::String => "string",
        T::EmbeddedDocument => "object",
        T::Array => "array",
        T::Binary => "binData",
        T::Undefined => "undefined",
        T::ObjectId => "objectId",
        T::Boolean => "bool",
        T::DateTime => "date",
        T::Null => "null",
        T::RegularExpression => "regex",
        T::DbPointer => "dbPointer",
        T::JavaScriptCode => "javascript",
        T::Symbol => "symbol",
        T::JavaScriptCodeWithScope => "javascriptWithScope",
        T::Int32 => "int",
        T::Timestamp => "timestamp",
        T::Int64 => "long",
        T::Decimal128 => "decimal",
        T::MaxKey => "maxKey",
        T::MinKey => "minKey",
    }
}

/// Generic arguments every command accepts (MongoDB's generic_argument.idl).
pub const GENERIC_ARGS: &[&str] = &[
    "$db",
    "maxTimeMS",
    "readConcern",
    "writeConcern",
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "$clusterTime",
    "$audit",
    "$client",
    "$configServerState",
    "allowImplicitCollectionCreation",
    "$oplogQueryData",
    "$queryOptions",
    "$readPreference",
    "$replData",
    "comment",
    "clientOperationKey",
    "databaseVersion",
    "shardVersion",
    "tracking_info",
    "coordinator",
    "maxTimeMSOpOnly",
    "usesDefaultMaxTimeMS",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
    "mayBypassWriteBlocking",
    "$topologyTime",
    "readOnly",
    "help",
    "$gleStats",
];

/// Reject fields that are neither the command's own nor generic, as MongoDB's IDL parser does
/// (Location40415 "BSON field 'find.foo' is an unknown field.").
pub fn check_fields(cmd_name: &str, cmd: &Document, known: &[&str]) -> Result<()> {
    for (i, k) in cmd.keys().enumerate() {
        if i == 0 {
            continue;
        }
        if !known.contains(&k.as_str()) && !GENERIC_ARGS.contains(&k.as_str()) {
            return Err(Error::location(40415, format!("BSON field '{cmd_name}.{k}' is an unknown field.")));
        }
    }
    Ok(())
}
