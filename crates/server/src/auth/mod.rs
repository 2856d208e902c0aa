//! mongod's users and roles: its `access::Directory` is its own admin.system.users and
//! admin.system.roles; a connection's user is re-read when users change; `check` runs
//! `access::authorize` before every command.
//!
//! - SCRAM itself is `net::scram`, its server conversation `access::sasl`; the privilege
//!   table and the roles are `access`.
//! - The commands: `commands/users.rs` (saslStart, saslContinue and user management) and
//!   `commands/roles.rs` (role management and rolesInfo).
//!
//! A connection that authenticates keeps its user's roles; every change to users bumps
//! `AuthState::generation`, and a connection that sees a new generation reads its user
//! again before its next command, so a revoked role or a dropped user takes effect at once.

pub use access::{
    grants_of as grants_in, has_secrets, internal_key, privileges_of, redacted, roles, roles_of, ConnAuth, Grants, EXTERNAL_DB, FAILURES_PER_CONNECTION_MAX,
    INTERNAL_USER, INTERNAL_USER_DB, ROLES_COLLECTION, SECRET_FIELDS, USERS_COLLECTION, USERS_DB,
};

use crate::conn::ConnState;
use crate::state::Shared;
use bson::{Bson, Document};
use common::Result;
use net::scram;
use roles::Resource;
use std::sync::atomic::{AtomicU64, Ordering};

/// mongod's directory: the users and roles in its own store.
pub struct StoreDirectory<'a>(pub &'a Shared);

impl access::Directory for StoreDirectory<'_> {
    fn find_user(&self, db: &str, user: &str) -> Result<Option<Document>> {
        find_user(self.0, db, user)
    }

    fn find_role(&self, db: &str, role: &str) -> Result<Option<Document>> {
        find_role(self.0, db, role)
    }
}

/// The credentials `user`@`db` authenticates with by `mechanism`, if any.
pub fn credentials_of(shared: &Shared, db: &str, user: &str, mechanism: scram::Mechanism) -> Result<Option<scram::Credentials>> {
    access::credentials_of(&StoreDirectory(shared), db, user, mechanism)
}

/// The mechanisms `user`@`db` has credentials for (hello's saslSupportedMechs).
pub fn mechanisms_of(shared: &Shared, db: &str, user: &str) -> Option<Vec<&'static str>> {
    access::mechanisms_of(&StoreDirectory(shared), db, user)
}

/// Server-wide authorization state.
#[derive(Debug, Default)]
pub struct AuthState {
    /// `security.authorization: enabled` / `--auth`.
    pub enabled: bool,
    /// Bumped by every change to users and roles.
    pub generation: AtomicU64,
}

impl AuthState {
    pub fn users_changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// The stored user document for `user`@`db`.
pub fn find_user(shared: &Shared, db: &str, user: &str) -> Result<Option<Document>> {
    let Some(coll) = shared.store.collection(USERS_DB, USERS_COLLECTION) else { return Ok(None) };
    Ok(coll.snapshot().find_by_id(&Bson::String(format!("{db}.{user}")))?.map(|(_, d)| d))
}

/// The stored user-defined role `role`@`db`.
pub fn find_role(shared: &Shared, db: &str, role: &str) -> Result<Option<Document>> {
    let Some(coll) = shared.store.collection(USERS_DB, ROLES_COLLECTION) else { return Ok(None) };
    Ok(coll.snapshot().find_by_id(&Bson::String(format!("{db}.{role}")))?.map(|(_, d)| d))
}

/// Whether `role`@`db` is a built-in role or a stored one.
pub fn role_exists(shared: &Shared, role: &str, db: &str) -> Result<bool> {
    Ok(roles::exists(role, db) || find_role(shared, db, role)?.is_some())
}

/// What `roles` grant, resolved through the stored roles.
pub fn grants_of(shared: &Shared, roles: &[(String, String)]) -> Result<Grants> {
    grants_in(&StoreDirectory(shared), roles)
}

/// Whether any user exists (the localhost exception ends with the first).
pub fn any_users(shared: &Shared) -> bool {
    shared.store.collection(USERS_DB, USERS_COLLECTION).is_some_and(|c| c.snapshot().count().map_or(true, |n| n > 0))
}

/// Record that the connection authenticated as `user`@`db`.
pub fn log_in(shared: &Shared, conn: &mut ConnState, user: &str, db: &str) -> Result<()> {
    conn.auth.check_one_user(user, db)?;
    let generation = shared.auth.generation.load(Ordering::SeqCst);
    conn.auth.user = Some(access::authed_user(&StoreDirectory(shared), user, db, generation)?);
    Ok(())
}

/// Re-read the connection's user if users changed since it last did; a user that is gone
/// leaves the connection unauthenticated.
fn refresh(shared: &Shared, conn: &mut ConnState) -> Result<()> {
    let generation = shared.auth.generation.load(Ordering::SeqCst);
    let Some(u) = &mut conn.auth.user else { return Ok(()) };
    if u.generation == generation || access::is_internal(&u.user, &u.db) {
        return Ok(());
    }
    match find_user(shared, &u.db, &u.user)? {
        Some(d) => {
            u.roles = roles_of(&d);
            u.grants = grants_of(shared, &u.roles)?;
            u.generation = generation;
        }
        None => conn.auth.user = None,
    }
    Ok(())
}

/// Whether the connection's user holds `action` on `resource`.
pub fn is_authorized(conn: &ConnState, action: &str, resource: &Resource) -> bool {
    conn.auth.is_authorized(action, resource)
}

/// Check that the connection may run `name` (a known command) with body `cmd` on `db`.
pub fn check(shared: &Shared, conn: &mut ConnState, db: &str, name: &str, cmd: &Document) -> Result<()> {
    if !shared.auth.enabled {
        return Ok(());
    }
    refresh(shared, conn)?;
    let loopback = conn.remote.ip().is_loopback();
    access::authorize(conn.auth.user.as_ref(), db, name, cmd, || loopback && !any_users(shared))
}
