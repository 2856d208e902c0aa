//! Who a connection is and what it may do, for mongod and the router alike.
//!
//! - `roles`: the built-in roles and the action each grants on a cluster, database or
//!   collection resource, and user-defined roles' privileges.
//! - `privileges`: what each command needs (`need`), and `authorize`, which both roles run
//!   before every command.
//! - `sasl`: the server side of saslStart and saslContinue around `net::scram`.
//! - This module: a connection's user (`AuthedUser`, `ConnAuth`) and the resolution of its
//!   roles through the user-defined roles they inherit (`grants_of`, at most
//!   `ROLES_RESOLVED_MAX` roles per user), over a `Directory` of users and roles: mongod's
//!   is its own admin.system.users and system.roles, the router's a copy read from the
//!   config servers.
//!
//! Users are documents as mongod keeps them in admin.system.users (`_id` "db.user",
//! credentials per mechanism, roles); user-defined roles are in admin.system.roles.

pub mod privileges;
pub mod roles;
pub mod sasl;
pub mod sessions;

pub use common::server::EXTERNAL_DB;
pub use net::key_file::{internal_key, INTERNAL_USER, INTERNAL_USER_DB};
pub use privileges::{authorize, has_secrets, redacted, SECRET_FIELDS};

use bson::Document;
use common::{Error, Result};
use net::scram;
use roles::Resource;

pub const USERS_DB: &str = "admin";
pub const USERS_COLLECTION: &str = "system.users";
/// User-defined roles, in admin as mongod keeps them (`_id` "db.role").
pub const ROLES_COLLECTION: &str = "system.roles";
/// Roles looked at, at most, in resolving one user's roles: a bound on the walk of a role
/// graph, which createRole and grantRolesToRole keep free of cycles.
const ROLES_RESOLVED_MAX: usize = 1024;
/// Failed authentications one connection may make; then it is closed, so that guessing
/// costs a new connection (and its TLS handshake) every few tries, within
/// maxIncomingConnections.
pub const FAILURES_PER_CONNECTION_MAX: u32 = 10;

/// Whether `user`@`db` is the internal user members and routers authenticate as.
pub fn is_internal(user: &str, db: &str) -> bool {
    user == INTERNAL_USER && db == INTERNAL_USER_DB
}

/// Where users and user-defined roles are read from.
pub trait Directory {
    /// The stored user document for `user`@`db`.
    fn find_user(&self, db: &str, user: &str) -> Result<Option<Document>>;
    /// The stored user-defined role `role`@`db`.
    fn find_role(&self, db: &str, role: &str) -> Result<Option<Document>>;
}

/// The credentials a user document holds for `mechanism`.
pub fn credentials_in(user_doc: &Document, mechanism: scram::Mechanism) -> Option<scram::Credentials> {
    user_doc.get_document("credentials").ok().and_then(|c| c.get_document(mechanism.name()).ok()).and_then(scram::Credentials::from_document)
}

/// The credentials `user`@`db` authenticates with by `mechanism`, if any.
pub fn credentials_of(dir: &impl Directory, db: &str, user: &str, mechanism: scram::Mechanism) -> Result<Option<scram::Credentials>> {
    if is_internal(user, db) {
        return Ok(internal_key().and_then(|k| k.credentials(mechanism)));
    }
    Ok(dir.find_user(db, user)?.and_then(|d| credentials_in(&d, mechanism)))
}

/// The mechanisms `user`@`db` has credentials for (hello's saslSupportedMechs).
pub fn mechanisms_of(dir: &impl Directory, db: &str, user: &str) -> Option<Vec<&'static str>> {
    if is_internal(user, db) {
        return internal_key().map(|_| scram::Mechanism::ALL.iter().map(|m| m.name()).collect());
    }
    let d = dir.find_user(db, user).ok()??;
    Some(mechanisms_in(&d))
}

/// The mechanisms a user document has credentials for.
pub fn mechanisms_in(user_doc: &Document) -> Vec<&'static str> {
    user_doc.get_document("credentials").map(|c| c.keys().filter_map(|k| scram::Mechanism::parse(k)).map(|m| m.name()).collect()).unwrap_or_default()
}

/// The user a connection authenticated as.
#[derive(Clone, Debug)]
pub struct AuthedUser {
    pub user: String,
    pub db: String,
    /// (role, db) pairs: the roles the user was granted.
    pub roles: Vec<(String, String)>,
    /// What those roles grant, through the roles they inherit.
    pub grants: Grants,
    /// The directory's generation when `roles` were read: a connection that sees a newer one
    /// reads its user again before its next command.
    pub generation: u64,
}

/// A connection's authentication: its user, and a SCRAM conversation under way.
#[derive(Debug, Default)]
pub struct ConnAuth {
    pub user: Option<AuthedUser>,
    pub conversation: Option<(scram::Conversation, String)>,
    /// Failed authentications on this connection so far.
    pub failures: u32,
    /// The subject of the client's verified TLS certificate (RFC 2253), the user an
    /// X.509 login names.
    pub peer_subject: Option<String>,
}

impl ConnAuth {
    /// Whether the connection's user holds `action` on `resource`.
    pub fn is_authorized(&self, action: &str, resource: &Resource) -> bool {
        self.user.as_ref().is_some_and(|u| u.grants.allow(action, resource))
    }

    /// mongod allows one user per connection: authenticating as another fails.
    pub fn check_one_user(&self, user: &str, db: &str) -> Result<()> {
        match &self.user {
            Some(u) if u.user != user || u.db != db => Err(Error::location(
                5626701,
                format!("Each client connection may only be authenticated once. Previously authenticated as: {}@{}", u.user, u.db),
            )),
            _ => Ok(()),
        }
    }
}

/// `user`@`db` with its roles and what they grant, as `dir` holds them now.
pub fn authed_user(dir: &impl Directory, user: &str, db: &str, generation: u64) -> Result<AuthedUser> {
    let roles = if is_internal(user, db) {
        vec![(roles::INTERNAL_ROLE.to_string(), "admin".to_string())]
    } else {
        dir.find_user(db, user)?.map(|d| roles_of(&d)).unwrap_or_default()
    };
    let grants = grants_of(dir, &roles)?;
    Ok(AuthedUser { user: user.to_string(), db: db.to_string(), roles, grants, generation })
}

/// What a set of roles grants: the built-in roles among them and among the roles they
/// inherit, and the privileges of the user-defined ones.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grants {
    pub builtin: Vec<(String, String)>,
    pub privileges: Vec<roles::Privilege>,
}

impl Grants {
    pub fn allow(&self, action: &str, resource: &Resource) -> bool {
        self.builtin.iter().any(|(r, d)| roles::grants(r, d, action, resource)) || self.privileges.iter().any(|p| p.grants(action, resource))
    }
}

/// The privileges of a role document's `privileges`, as stored (checked when written).
pub fn privileges_of(role_doc: &Document, role_db: &str) -> Vec<roles::Privilege> {
    role_doc.get_array("privileges").map(|a| a.iter().filter_map(|p| roles::Privilege::parse(p, role_db).ok()).collect()).unwrap_or_default()
}

/// Resolve `roles` through the user-defined roles they name (a role that no longer exists
/// grants nothing).
pub fn grants_of(dir: &impl Directory, roles: &[(String, String)]) -> Result<Grants> {
    let mut grants = Grants::default();
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut queue: std::collections::VecDeque<(String, String)> = roles.iter().cloned().collect();
    while let Some(r) = queue.pop_front() {
        if seen.contains(&r) || seen.len() >= ROLES_RESOLVED_MAX {
            continue;
        }
        seen.push(r.clone());
        if roles::exists(&r.0, &r.1) || r.0 == roles::INTERNAL_ROLE {
            grants.builtin.push(r);
        } else if let Some(d) = dir.find_role(&r.1, &r.0)? {
            grants.privileges.extend(privileges_of(&d, &r.1));
            queue.extend(roles_of(&d));
        }
    }
    Ok(grants)
}

/// (role, db) pairs of a user or role document's `roles`.
pub fn roles_of(user_doc: &Document) -> Vec<(String, String)> {
    user_doc
        .get_array("roles")
        .map(|a| {
            a.iter().filter_map(|r| r.as_document()).filter_map(|r| Some((r.get_str("role").ok()?.to_string(), r.get_str("db").ok()?.to_string()))).collect()
        })
        .unwrap_or_default()
}
