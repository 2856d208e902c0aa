//! The stable API (mongod's versioned API): a command may declare `apiVersion: "1"`, and with
//! it `apiStrict` (refuse what is not in the version) and `apiDeprecationErrors` (refuse what
//! the version deprecates). Both roles check a command's declaration before it runs.

use crate::{Code, Error, Result};
use bson::{Bson, Document};

pub const API_VERSION_ERROR: Code = Code(322, "APIVersionError");
pub const API_STRICT_ERROR: Code = Code(323, "APIStrictError");

/// The commands of API version 1 (mongod 7.0's list).
const VERSION_1: &[&str] = &[
    "abortTransaction",
    "aggregate",
    "authenticate",
    "collMod",
    "commitTransaction",
    "count",
    "create",
    "createIndexes",
    "delete",
    "drop",
    "dropDatabase",
    "dropIndexes",
    "endSessions",
    "explain",
    "find",
    "findAndModify",
    "getMore",
    "hello",
    "insert",
    "killCursors",
    "listCollections",
    "listDatabases",
    "listIndexes",
    "ping",
    "refreshSessions",
    "saslContinue",
    "saslStart",
    "update",
    "testVersion1AndVersion2",
];

/// Aggregation stages outside API version 1.
const STAGES_OUTSIDE_VERSION_1: &[&str] = &[
    "$currentOp",
    "$indexStats",
    "$listLocalSessions",
    "$listSessions",
    "$planCacheStats",
    "$search",
    "$searchMeta",
    "$listCatalog",
    "$shardedDataDistribution",
];

/// Check command `name`'s API parameters (only "1" is a version shoal has).
pub fn check(name: &str, body: &Document) -> Result<()> {
    let flag = |k: &str| match body.get(k) {
        None => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(_) => Err(Error::type_mismatch(format!("BSON field '{k}' is the wrong type, expected type 'bool'"))),
    };
    let strict = flag("apiStrict")?;
    let deprecation_errors = flag("apiDeprecationErrors")?;
    let version = match body.get("apiVersion") {
        None => {
            if strict.is_some() {
                return Err(Error::location(4886600, "Provided apiStrict without passing apiVersion"));
            }
            if deprecation_errors.is_some() {
                return Err(Error::location(4886600, "Provided apiDeprecationErrors without passing apiVersion"));
            }
            return Ok(());
        }
        Some(Bson::String(v)) => v.as_str(),
        Some(_) => return Err(Error::type_mismatch("BSON field 'apiVersion' is the wrong type, expected type 'string'")),
    };
    if version != "1" {
        return Err(Error::new(API_VERSION_ERROR, format!("API version must be \"1\", not \"{version}\"")));
    }
    if strict != Some(true) {
        return Ok(());
    }
    if !VERSION_1.contains(&name) {
        return Err(Error::new(API_STRICT_ERROR, format!("Provided apiStrict:true, but the command {name} is not in API Version 1")));
    }
    if name == "aggregate" {
        for stage in body.get_array("pipeline").map(|p| p.as_slice()).unwrap_or_default() {
            if let Some(stage) = stage.as_document().and_then(|s| s.keys().next()).filter(|s| STAGES_OUTSIDE_VERSION_1.contains(&s.as_str())) {
                return Err(Error::new(API_STRICT_ERROR, format!("{stage} is not allowed with 'apiStrict: true' in API Version 1")));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn declarations_are_checked() {
        assert!(check("distinct", &doc! {}).is_ok());
        assert!(check("distinct", &doc! {"apiVersion": "1"}).is_ok());
        assert_eq!(check("distinct", &doc! {"apiVersion": "1", "apiStrict": true}).unwrap_err().code, 323);
        assert!(check("find", &doc! {"apiVersion": "1", "apiStrict": true}).is_ok());
        assert_eq!(check("find", &doc! {"apiVersion": "2"}).unwrap_err().code, 322);
        assert_eq!(check("find", &doc! {"apiStrict": false}).unwrap_err().code, 4886600);
        let agg = doc! {"apiVersion": "1", "apiStrict": true, "pipeline": [{"$listLocalSessions": {}}]};
        assert_eq!(check("aggregate", &agg).unwrap_err().code, 323);
    }
}
