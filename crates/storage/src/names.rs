//! Database and collection names: mongod's rules for what may be created.

use super::*;

pub(crate) fn validate_db_name(db: &str) -> Result<()> {
    if db.is_empty() || db.len() > DB_NAME_LENGTH_MAX_BYTES || db.chars().any(|c| "/\\. \"$*<>:|?\0".contains(c)) {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid database name: '{db}'")));
    }
    Ok(())
}

/// System collections a client may create or write.
pub(crate) const SYSTEM_COLLECTIONS_ALLOWED: [&str; 2] = ["system.js", "system.profile"];

pub(crate) fn validate_ns(db: &str, name: &str) -> Result<()> {
    validate_db_name(db)?;
    if name.is_empty() || name.contains('$') || name.contains('\0') || name.starts_with('.') {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid collection name: {name}")));
    }
    // local.system.replset holds a replica-set member's configuration, admin.system.users
    // and admin.system.roles the users and user-defined roles (written by the user and role
    // management commands, or by a client with the privileges to, as with mongod).
    let replset_config = db == OPLOG_DB && name == "system.replset";
    let users = db == "admin" && (name == "system.users" || name == "system.roles");
    if name.starts_with("system.") && !SYSTEM_COLLECTIONS_ALLOWED.contains(&name) && !replset_config && !users {
        return Err(Error::new(Code::InvalidNamespace, format!("Invalid system namespace: {db}.{name}")));
    }
    if db.len() + 1 + name.len() > NAMESPACE_LENGTH_MAX_BYTES {
        return Err(Error::new(
            Code::InvalidNamespace,
            format!("Fully qualified namespace is too long. Namespace: {db}.{name} Max: {NAMESPACE_LENGTH_MAX_BYTES}"),
        ));
    }
    Ok(())
}
