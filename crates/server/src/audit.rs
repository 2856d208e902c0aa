//! mongod's audit records (the log itself is `audit_log`'s): authCheck records of
//! commands under authorization, creations of databases and collections (implicit ones
//! too), other DDL, user and role management, replica-set reconfiguration.
//!
//! The connection keeps a request's frame (`keep_frame`) only for a CRUD command while
//! `auditAuthorizationSuccess` is on, so that its authCheck record is queued as that frame.
//! Creations reach the records through the store handle a command writes through
//! (`Store::collecting_creations`), so implicit ones count. setAuditConfig's runtime configuration is a
//! replicated write to `config.settings`, which every member takes when it applies it
//! (`load_stored`).

pub use audit_log::{compile, Actor, Audit, Param};

use bson::{doc, Bson, Document};
use common::Result;

/// CRUD commands: their authorization checks are audited when they pass too
/// (`auditAuthorizationSuccess`); every command's refusal is.
fn is_crud(name: &str) -> bool {
    crate::commands::lookup(name).is_some_and(|s| s.crud)
}

/// The authCheck record of a command, under authorization: `refused` is the refusal's code.
/// Written from the request's frame when `keep_frame` kept it.
pub fn auth_check(shared: &crate::state::Shared, conn: &mut crate::conn::ConnState, name: &str, cmd: &Document, refused: Option<i32>) {
    let Some(audit) = &shared.audit else { return };
    // The frame belongs to this command alone (not to one it runs in turn, nor to an
    // exhaust cursor's next run).
    let frame = std::mem::take(&mut conn.audit_frame);
    if shared.auth.enabled && (refused.is_some() || (is_crud(name) && audit.authorization_success())) {
        let actor = conn.actor_ref();
        if frame.is_empty() {
            audit.log_command(actor, cmd, refused.unwrap_or(0));
        } else {
            audit.log_frame(actor, &frame, refused.unwrap_or(0));
        }
    }
    conn.audit_frame = frame;
    conn.audit_frame.clear();
}

/// A kept frame's buffer grown beyond this by a huge request is given back after it.
const FRAME_KEPT_BYTES_MAX: usize = 1 << 20;

/// Called for each message a connection receives, before it runs: keep a copy of the frame
/// (`frame`: an uncompressed OP_MSG that `wire::decode` accepted, whose body is `body`) when
/// its command's authCheck record will be written from it, that is a CRUD command while
/// `auditAuthorizationSuccess` is on; otherwise forget the last one. Copying the frame costs
/// a tenth of encoding the decoded command again.
pub fn keep_frame(shared: &crate::state::Shared, conn: &mut crate::conn::ConnState, body: Option<&Document>, frame: Option<&[u8]>) {
    if conn.audit_frame.capacity() > FRAME_KEPT_BYTES_MAX {
        conn.audit_frame = Vec::new();
    }
    conn.audit_frame.clear();
    let Some(audit) = &shared.audit else { return };
    let (Some(body), Some(frame)) = (body, frame) else { return };
    if shared.auth.enabled && audit.authorization_success() && body.keys().next().is_some_and(|name| is_crud(name)) {
        conn.audit_frame.extend_from_slice(frame);
    }
}

/// The createDatabase and createCollection records of what the command that ran created.
pub fn creations_done(shared: &crate::state::Shared, conn: &mut crate::conn::ConnState, created: Vec<storage::Created>) {
    if created.is_empty() {
        return;
    }
    let actor = conn.actor();
    for storage::Created { db, coll, new_db } in created {
        if new_db {
            shared.audit_event("createDatabase", &actor, Param::Doc(doc! {"ns": &db}), 0);
        }
        shared.audit_event("createCollection", &actor, Param::Doc(doc! {"ns": format!("{db}.{coll}")}), 0);
    }
}

/// Where setAuditConfig keeps the runtime configuration (as mongod does): a replicated
/// write, so that every member of a set takes it through the oplog, and a restart keeps it.
pub const SETTINGS_DB: &str = "config";
pub const SETTINGS_COLLECTION: &str = "settings";
pub const SETTINGS_ID: &str = "audit";

/// Take the stored runtime configuration, if there is one: at startup, and when applied
/// operations touched `config.settings`.
pub fn load_stored(shared: &crate::state::Shared) -> Result<()> {
    let Some(audit) = &shared.audit else { return Ok(()) };
    let Some(coll) = shared.store.collection(SETTINGS_DB, SETTINGS_COLLECTION) else { return Ok(()) };
    let Some((_, d)) = coll.snapshot().find_by_id(&Bson::String(SETTINGS_ID.into()))? else { return Ok(()) };
    let generation = d.get_object_id("generation").ok();
    if generation.is_some() && generation == audit.generation() {
        return Ok(());
    }
    audit.set_config(d.get_document("filter").ok().cloned(), d.get_bool("auditAuthorizationSuccess").ok(), generation)
}

/// The record of a command that changed the catalog, users or the set's configuration,
/// once it succeeded.
pub fn command_done(shared: &crate::state::Shared, conn: &mut crate::conn::ConnState, db: &str, name: &str, cmd: &Document) {
    let events = audit_log::command_events(db, name, cmd);
    if events.is_empty() {
        return;
    }
    let actor = conn.actor();
    for (atype, param) in events {
        shared.audit_event(atype, &actor, Param::Doc(param), 0);
    }
}
