//! Authentication and user management: saslStart, saslContinue, logout, createUser,
//! updateUser, dropUser, dropAllUsersFromDatabase, usersInfo, grantRolesToUser,
//! revokeRolesFromUser. Users are documents in admin.system.users (`crate::auth`).

use super::Ctx;
use crate::auth::{self, USERS_COLLECTION, USERS_DB};
use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use common::{Code, Error, Result};
use net::scram;

/// A user name or password longer than this is refused (mongod has no smaller limit than
/// the document's; this keeps SCRAM's work bounded).
pub(super) const NAME_BYTES_MAX: usize = 1024;

use access::sasl::auth_failed;

pub fn sasl_start(ctx: &mut Ctx) -> Result<Document> {
    let (db, cmd) = (ctx.db.to_string(), ctx.cmd.clone());
    start_conversation(ctx, &db, &cmd)
}

/// saslStart on `db`; also what hello's speculativeAuthenticate runs.
pub fn start_conversation(ctx: &mut Ctx, db: &str, cmd: &Document) -> Result<Document> {
    let start = access::sasl::parse_start(&mut ctx.conn.auth, db, cmd)?;
    let credentials = auth::credentials_of(ctx.shared, db, &start.user, start.mechanism)?;
    access::sasl::begin(&mut ctx.conn.auth, db, start, credentials)
}

pub fn sasl_continue(ctx: &mut Ctx) -> Result<Document> {
    match access::sasl::step(&mut ctx.conn.auth, ctx.cmd)? {
        access::sasl::Step::Continue(reply) => Ok(reply),
        access::sasl::Step::Done(reply, login) => {
            auth::log_in(ctx.shared, ctx.conn, &login.user, &login.db)?;
            tracing::info!(conn = ctx.conn.id, "authenticated as {}@{}", login.user, login.db);
            let param = doc! {"user": &login.user, "db": &login.db, "mechanism": login.mechanism};
            ctx.shared.audit_event("authenticate", &ctx.conn.actor(), crate::audit::Param::Doc(param), 0);
            Ok(reply)
        }
        access::sasl::Step::Failed(login) => {
            let param = doc! {"user": &login.user, "db": &login.db, "mechanism": login.mechanism};
            ctx.shared.audit_event("authenticate", &ctx.conn.actor(), crate::audit::Param::Doc(param), Code::AuthenticationFailed.0);
            Err(auth_failed())
        }
    }
}

const X509: &str = "MONGODB-X509";

pub fn authenticate(ctx: &mut Ctx) -> Result<Document> {
    let (db, cmd) = (ctx.db.to_string(), ctx.cmd.clone());
    authenticate_x509(ctx, &db, &cmd)
}

/// MONGODB-X509: the user is the subject of the client's verified certificate, defined on
/// $external. Also what hello's speculativeAuthenticate runs.
fn authenticate_x509(ctx: &mut Ctx, db: &str, cmd: &Document) -> Result<Document> {
    let mechanism = cmd.get_str("mechanism").map_err(|_| Error::bad_value("authenticate needs a mechanism string"))?;
    if mechanism != X509 {
        return Err(Error::new(Code::MechanismUnavailable, format!("Unsupported mechanism '{mechanism}' on authentication database '{db}'")));
    }
    let fail = |why: &str| {
        tracing::info!(conn = ctx.conn.id, "X.509 authentication failed: {why}");
        auth_failed()
    };
    if db != auth::EXTERNAL_DB {
        return Err(fail("X.509 users are defined on $external"));
    }
    let Some(subject) = ctx.conn.auth.peer_subject.clone() else {
        return Err(fail("no verified client certificate on this connection"));
    };
    if cmd.get_str("user").is_ok_and(|u| u != subject) {
        return Err(fail("the user named is not the certificate's subject"));
    }
    if auth::find_user(ctx.shared, db, &subject)?.is_none() {
        return Err(fail(&format!("no user {subject} on $external")));
    }
    auth::log_in(ctx.shared, ctx.conn, &subject, db)?;
    tracing::info!(conn = ctx.conn.id, "authenticated as {subject}@$external by X.509");
    ctx.shared.audit_event("authenticate", &ctx.conn.actor(), crate::audit::Param::Doc(doc! {"user": &subject, "db": db, "mechanism": X509}), 0);
    Ok(doc! {"dbname": db, "user": subject})
}

pub fn logout(ctx: &mut Ctx) -> Result<Document> {
    if ctx.conn.auth.user.as_ref().is_some_and(|u| u.db == ctx.db) {
        let before = ctx.conn.actor();
        ctx.conn.auth.user = None;
        let initial: Vec<Bson> = before.users.iter().map(|(u, d)| Bson::Document(doc! {"user": u, "db": d})).collect();
        ctx.shared.audit_event(
            "logout",
            &before,
            crate::audit::Param::Doc(doc! {"reason": format!("Explicit logout from db '{}'", ctx.db), "initialUsers": initial, "updatedUsers": []}),
            0,
        );
    }
    Ok(Document::new())
}

/// logRotate: the server logs to stderr (nothing to rotate); the audit file is rotated.
pub fn log_rotate(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "logRotate may only be run against the admin database."));
    }
    match ctx.cmd.get("logRotate") {
        Some(Bson::String(s)) if !matches!(s.as_str(), "server" | "audit") => return Err(Error::bad_value(format!("Unknown log type for rotate: {s}"))),
        _ => {}
    }
    if let Some(audit) = &ctx.shared.audit {
        audit.rotate()?;
    }
    Ok(Document::new())
}

pub fn get_audit_config(ctx: &mut Ctx) -> Result<Document> {
    let audit = ctx
        .shared
        .audit
        .as_ref()
        .ok_or_else(|| Error::new(Code::CommandNotSupported, "auditing is not enabled: start the server with auditLog.destination"))?;
    Ok(audit.config())
}

/// setAuditConfig: a new filter and/or auditAuthorizationSuccess. Stored in
/// config.settings, so that it reaches the other members through the oplog (they take it
/// when they apply it) and outlives a restart; then taken here.
pub fn set_audit_config(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("setAuditConfig", ctx.cmd, &["filter", "auditAuthorizationSuccess"])?;
    let audit = ctx
        .shared
        .audit
        .as_ref()
        .ok_or_else(|| Error::new(Code::CommandNotSupported, "auditing is not enabled: start the server with auditLog.destination"))?;
    let filter = ctx.doc_arg("filter")?.cloned();
    let success = ctx.bool_arg("auditAuthorizationSuccess")?;
    if filter.is_none() && success.is_none() {
        return Err(Error::bad_value("setAuditConfig needs filter or auditAuthorizationSuccess"));
    }
    if let Some(f) = &filter {
        crate::audit::compile(f)?;
    }
    let current = audit.config();
    let filter = filter.unwrap_or_else(|| current.get_document("filter").cloned().unwrap_or_default());
    let success = success.unwrap_or_else(|| current.get_bool("auditAuthorizationSuccess").unwrap_or(false));
    let generation = bson::oid::ObjectId::new();
    let stored = doc! {"_id": crate::audit::SETTINGS_ID, "filter": filter.clone(), "auditAuthorizationSuccess": success, "generation": generation};
    let coll = ctx.store().collection_or_create(crate::audit::SETTINGS_DB, crate::audit::SETTINGS_COLLECTION)?;
    replication::apply::upsert(&coll, &stored, false)?;
    ctx.commit_write()?;
    audit.set_config(Some(filter), Some(success), Some(generation))?;
    Ok(Document::new())
}

/// `roles` of a user-management command: names (on the command's database) or {role, db},
/// each a role that exists.
pub(super) fn parse_roles(ctx: &Ctx, field: &str) -> Result<Vec<(String, String)>> {
    let Some(list) = ctx.array_arg(field)? else {
        return Err(Error::location(40414, format!("BSON field '{}.{field}' is missing but a required field", ctx.name)));
    };
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for r in list {
        let (role, db) = match r {
            Bson::String(s) => (s.clone(), ctx.db.to_string()),
            Bson::Document(d) => match (d.get_str("role"), d.get_str("db")) {
                (Ok(role), Ok(db)) => (role.to_string(), db.to_string()),
                _ => return Err(Error::bad_value("a role must be a name or a {role: <name>, db: <database>} document")),
            },
            _ => return Err(Error::bad_value("a role must be a name or a {role: <name>, db: <database>} document")),
        };
        if !auth::role_exists(ctx.shared, &role, &db)? {
            missing.push(format!("{role}@{db}"));
        }
        if !out.contains(&(role.clone(), db.clone())) {
            out.push((role, db));
        }
    }
    match missing.len() {
        0 => Ok(out),
        1 => Err(Error::new(Code::RoleNotFound, format!("Could not find role: {}", missing[0]))),
        _ => Err(Error::new(Code::RoleNotFound, format!("Could not find roles: {}", missing.join(", ")))),
    }
}

pub(super) fn roles_bson(roles: &[(String, String)]) -> Vec<Bson> {
    roles.iter().map(|(r, d)| Bson::Document(doc! {"role": r, "db": d})).collect()
}

/// The mechanisms a createUser or updateUser asks for (default: both).
fn parse_mechanisms(ctx: &Ctx) -> Result<Vec<scram::Mechanism>> {
    let Some(list) = ctx.array_arg("mechanisms")? else { return Ok(scram::Mechanism::ALL.to_vec()) };
    if list.is_empty() {
        return Err(Error::bad_value("mechanisms field must not be empty"));
    }
    let mut out = Vec::new();
    for m in list {
        let name = m.as_str().ok_or_else(|| Error::bad_value("mechanisms must be strings"))?;
        let m = scram::Mechanism::parse(name).ok_or_else(|| Error::bad_value(format!("Unknown auth mechanism '{name}'")))?;
        if !out.contains(&m) {
            out.push(m);
        }
    }
    Ok(out)
}

fn credentials(user: &str, pwd: &str, mechanisms: &[scram::Mechanism]) -> Result<Document> {
    let mut creds = Document::new();
    for m in mechanisms {
        creds.insert(m.name(), scram::Credentials::new(*m, user, pwd)?.to_document());
    }
    Ok(creds)
}

fn check_name(ctx: &Ctx) -> Result<String> {
    let user = match ctx.cmd.get(ctx.name) {
        Some(Bson::String(s)) => s.clone(),
        Some(v) => {
            return Err(Error::type_mismatch(format!("BSON field '{}' is the wrong type '{}', expected type 'string'", ctx.name, common::value::type_name(v))))
        }
        None => return Err(Error::bad_value(format!("{} needs a user name", ctx.name))),
    };
    if user.is_empty() || user.len() > NAME_BYTES_MAX {
        return Err(Error::bad_value(format!("a user name must be 1 to {NAME_BYTES_MAX} bytes")));
    }
    if user.contains('\0') {
        return Err(Error::bad_value("Username cannot contain NULL characters"));
    }
    if ctx.db == "local" {
        return Err(Error::bad_value("Cannot create users in the local database"));
    }
    Ok(user)
}

fn check_pwd(ctx: &Ctx) -> Result<Option<String>> {
    let Some(pwd) = ctx.str_arg("pwd")? else { return Ok(None) };
    if pwd.is_empty() || pwd.len() > NAME_BYTES_MAX {
        return Err(Error::bad_value(format!("a password must be 1 to {NAME_BYTES_MAX} bytes")));
    }
    if ctx.bool_arg("digestPassword")? == Some(false) {
        return Err(Error::bad_value("Use of SCRAM-SHA-256 requires undigested passwords; shoal digests every password itself"));
    }
    Ok(Some(pwd.to_string()))
}

fn users_collection(ctx: &Ctx) -> Result<storage::Collection> {
    ctx.store().collection_or_create(USERS_DB, USERS_COLLECTION)
}

pub(super) fn finish(ctx: &Ctx) -> Result<()> {
    ctx.shared.auth.users_changed();
    ctx.commit_write()
}

pub fn create_user(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("createUser", ctx.cmd, &["pwd", "roles", "customData", "digestPassword", "mechanisms", "authenticationRestrictions"])?;
    let user = check_name(ctx)?;
    if ctx.cmd.contains_key("authenticationRestrictions") {
        return Err(Error::new(Code::CommandNotSupported, "authenticationRestrictions are not supported by shoal yet"));
    }
    let external = ctx.db == auth::EXTERNAL_DB;
    let pwd = check_pwd(ctx)?;
    let credentials = match (external, pwd) {
        (true, Some(_)) => return Err(Error::bad_value("Cannot set the password for users defined on the '$external' database")),
        (true, None) if ctx.cmd.contains_key("mechanisms") => {
            return Err(Error::bad_value("mechanisms field must not be given for users defined on the '$external' database"))
        }
        (true, None) => doc! {"external": true},
        (false, None) => {
            return Err(Error::bad_value("Must provide a 'pwd' field for all user documents, except those with '$external' as the user's source db"))
        }
        (false, Some(pwd)) => credentials(&user, &pwd, &parse_mechanisms(ctx)?)?,
    };
    let roles = parse_roles(ctx, "roles")?;
    let mut d = doc! {
        "_id": format!("{}.{user}", ctx.db),
        "userId": Bson::Binary(Binary { subtype: BinarySubtype::Uuid, bytes: bson::Uuid::new().bytes().to_vec() }),
        "user": &user,
        "db": ctx.db,
        "credentials": credentials,
    };
    if let Some(custom) = ctx.cmd.get("customData") {
        let Bson::Document(c) = custom else { return Err(Error::type_mismatch("customData must be an object")) };
        d.insert("customData", c.clone());
    }
    d.insert("roles", roles_bson(&roles));
    insert_new(ctx, &users_collection(ctx)?, &d, || Error::location(51003, format!("User \"{user}@{}\" already exists", ctx.db)))?;
    Ok(Document::new())
}

/// Insert the user or role document `d` into `coll` (admin.system.users or
/// admin.system.roles), unless one with its `_id` is there already (`exists`).
pub(super) fn insert_new(ctx: &Ctx, coll: &storage::Collection, d: &Document, exists: impl FnOnce() -> Error) -> Result<()> {
    let mut w = coll.writer();
    if w.snapshot().find_by_id(d.get("_id").unwrap_or(&Bson::Null))?.is_some() {
        return Err(exists());
    }
    w.insert(d)?;
    drop(w);
    finish(ctx)
}

/// Change the user or role document `id` of `coll` with `change`; `missing` if there is
/// none.
pub(super) fn modify_stored(
    ctx: &Ctx,
    coll: &storage::Collection,
    id: &Bson,
    missing: impl FnOnce() -> Error,
    change: impl FnOnce(&mut Document) -> Result<()>,
) -> Result<()> {
    let mut w = coll.writer();
    let Some((rid, old)) = w.snapshot().find_by_id(id)? else { return Err(missing()) };
    let mut new = old.clone();
    change(&mut new)?;
    w.update(rid, &old, &new, storage::UpdateForm::Replacement)?;
    drop(w);
    finish(ctx)
}

/// Change the stored user `user`@ctx.db with `change`; UserNotFound if there is none.
fn modify_user(ctx: &Ctx, user: &str, change: impl FnOnce(&mut Document) -> Result<()>) -> Result<()> {
    let id = Bson::String(format!("{}.{user}", ctx.db));
    modify_stored(ctx, &users_collection(ctx)?, &id, || Error::new(Code::UserNotFound, format!("Could not find user \"{user}\" for db \"{}\"", ctx.db)), change)
}

pub fn update_user(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("updateUser", ctx.cmd, &["pwd", "roles", "customData", "digestPassword", "mechanisms", "authenticationRestrictions"])?;
    let user = check_name(ctx)?;
    if ctx.cmd.contains_key("authenticationRestrictions") {
        return Err(Error::new(Code::CommandNotSupported, "authenticationRestrictions are not supported by shoal yet"));
    }
    let pwd = check_pwd(ctx)?;
    if ctx.db == auth::EXTERNAL_DB && (pwd.is_some() || ctx.cmd.contains_key("mechanisms")) {
        return Err(Error::bad_value("Cannot set the password for users defined on the '$external' database"));
    }
    let roles = if ctx.cmd.contains_key("roles") { Some(parse_roles(ctx, "roles")?) } else { None };
    let custom = match ctx.cmd.get("customData") {
        None => None,
        Some(Bson::Document(c)) => Some(c.clone()),
        Some(_) => return Err(Error::type_mismatch("customData must be an object")),
    };
    let mechanisms = if ctx.cmd.contains_key("mechanisms") { Some(parse_mechanisms(ctx)?) } else { None };
    if pwd.is_none() && roles.is_none() && custom.is_none() && mechanisms.is_none() {
        return Err(Error::bad_value("Must specify at least one field to update in updateUser"));
    }
    modify_user(ctx, &user, |d| {
        let held: Vec<scram::Mechanism> =
            d.get_document("credentials").map(|c| c.keys().filter_map(|k| scram::Mechanism::parse(k)).collect()).unwrap_or_default();
        match (&pwd, &mechanisms) {
            (Some(pwd), m) => {
                d.insert("credentials", credentials(&user, pwd, m.as_deref().unwrap_or(&scram::Mechanism::ALL))?);
            }
            (None, Some(m)) => {
                // Without a new password, mechanisms can only be dropped.
                if m.iter().any(|x| !held.contains(x)) {
                    return Err(Error::bad_value("mechanisms field must be a subset of previously set mechanisms"));
                }
                let creds: Document = d
                    .get_document("credentials")
                    .map(|c| c.iter().filter(|(k, _)| m.iter().any(|x| x.name() == k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default();
                d.insert("credentials", creds);
            }
            (None, None) => {}
        }
        if let Some(c) = custom {
            d.insert("customData", c);
        }
        if let Some(r) = &roles {
            d.insert("roles", roles_bson(r));
        }
        Ok(())
    })?;
    Ok(Document::new())
}

pub fn drop_user(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("dropUser", ctx.cmd, &[])?;
    let user = check_name(ctx)?;
    let coll = users_collection(ctx)?;
    let mut w = coll.writer();
    let Some((rid, old)) = w.snapshot().find_by_id(&Bson::String(format!("{}.{user}", ctx.db)))? else {
        return Err(Error::new(Code::UserNotFound, format!("User '{user}@{}' not found", ctx.db)));
    };
    w.delete(rid, &old)?;
    drop(w);
    finish(ctx)?;
    Ok(Document::new())
}

pub fn drop_all_users_from_database(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("dropAllUsersFromDatabase", ctx.cmd, &[])?;
    let coll = users_collection(ctx)?;
    let mut w = coll.writer();
    let mut n = 0i32;
    for (rid, d) in all_users(&w.snapshot())? {
        if d.get_str("db").is_ok_and(|db| db == ctx.db) {
            w.delete(rid, &d)?;
            n += 1;
        }
    }
    drop(w);
    finish(ctx)?;
    Ok(doc! {"n": n})
}

/// Every document of a small collection (admin.system.users, admin.system.roles).
pub(super) fn all_users(snap: &storage::Snapshot) -> Result<Vec<(storage::RecordId, Document)>> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let chunk = snap.scan(after, 1024)?;
        let done = chunk.len() < 1024;
        after = chunk.last().map(|(rid, _)| *rid);
        out.extend(chunk);
        if done {
            return Ok(out);
        }
    }
}

fn change_roles(ctx: &mut Ctx, grant: bool) -> Result<Document> {
    common::value::check_fields(ctx.name, ctx.cmd, &["roles"])?;
    let user = check_name(ctx)?;
    let roles = parse_roles(ctx, "roles")?;
    if roles.is_empty() {
        return Err(Error::bad_value(format!("{} command requires a non-empty \"roles\" array", ctx.name)));
    }
    modify_user(ctx, &user, |d| {
        change_held_roles(d, &roles, grant);
        Ok(())
    })?;
    Ok(Document::new())
}

/// Grant `change` to what the user or role document `d` holds (each role once), or revoke
/// it.
pub(super) fn change_held_roles(d: &mut Document, change: &[(String, String)], grant: bool) {
    let mut held = auth::roles_of(d);
    if grant {
        for r in change {
            if !held.contains(r) {
                held.push(r.clone());
            }
        }
    } else {
        held.retain(|r| !change.contains(r));
    }
    d.insert("roles", roles_bson(&held));
}

pub fn grant_roles_to_user(ctx: &mut Ctx) -> Result<Document> {
    change_roles(ctx, true)
}

pub fn revoke_roles_from_user(ctx: &mut Ctx) -> Result<Document> {
    change_roles(ctx, false)
}

pub fn users_info(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("usersInfo", ctx.cmd, &["showCredentials", "showCustomData", "showPrivileges", "showAuthenticationRestrictions", "filter"])?;
    if ctx.bool_arg("showPrivileges")? == Some(true) || ctx.bool_arg("showAuthenticationRestrictions")? == Some(true) {
        return Err(Error::new(Code::CommandNotSupported, "usersInfo showPrivileges and showAuthenticationRestrictions are not supported by shoal yet"));
    }
    if ctx.cmd.contains_key("filter") {
        return Err(Error::new(Code::CommandNotSupported, "usersInfo filter is not supported by shoal yet"));
    }
    let show_credentials = ctx.bool_arg("showCredentials")?.unwrap_or(false);
    let show_custom = ctx.bool_arg("showCustomData")?.unwrap_or(true);
    // Which users: all of this database, all, or the ones named.
    let wanted: Option<Vec<(String, String)>> = match ctx.cmd.get("usersInfo") {
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) => None,
        Some(Bson::Double(v)) if *v == 1.0 => None,
        Some(Bson::Document(d)) if d.get_bool("forAllDBs").unwrap_or(false) => Some(Vec::new()),
        Some(v @ (Bson::String(_) | Bson::Document(_))) => Some(vec![user_name(ctx.db, v)?]),
        Some(Bson::Array(a)) => Some(a.iter().map(|v| user_name(ctx.db, v)).collect::<Result<_>>()?),
        _ => return Err(Error::bad_value("usersInfo takes 1, a user name, {user, db}, an array of them or {forAllDBs: true}")),
    };
    let all_dbs = matches!(&wanted, Some(w) if w.is_empty());
    let mut users = Vec::new();
    if let Some(coll) = ctx.store().collection(USERS_DB, USERS_COLLECTION) {
        for (_, mut d) in all_users(&coll.snapshot())? {
            let (user, db) = (d.get_str("user").unwrap_or("").to_string(), d.get_str("db").unwrap_or("").to_string());
            let keep = match &wanted {
                None => db == ctx.db,
                Some(_) if all_dbs => true,
                Some(w) => w.contains(&(user.clone(), db.clone())),
            };
            if !keep {
                continue;
            }
            let mechanisms: Vec<Bson> = d.get_document("credentials").map(|c| c.keys().map(|k| Bson::String(k.clone())).collect()).unwrap_or_default();
            if !show_credentials {
                d.remove("credentials");
            }
            if !show_custom {
                d.remove("customData");
            }
            d.insert("mechanisms", mechanisms);
            users.push((user, db, d));
        }
    }
    users.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Ok(doc! {"users": users.into_iter().map(|(_, _, d)| Bson::Document(d)).collect::<Vec<_>>()})
}

fn user_name(db: &str, v: &Bson) -> Result<(String, String)> {
    match v {
        Bson::String(s) => Ok((s.clone(), db.to_string())),
        Bson::Document(d) => match (d.get_str("user"), d.get_str("db")) {
            (Ok(u), Ok(d)) => Ok((u.to_string(), d.to_string())),
            _ => Err(Error::bad_value("a user must be a name or a {user: <name>, db: <database>} document")),
        },
        _ => Err(Error::bad_value("a user must be a name or a {user: <name>, db: <database>} document")),
    }
}

/// hello's authentication fields: `saslSupportedMechs` for "db.user", and the first step of
/// a speculative authentication, whose failure only leaves its reply out.
pub fn hello_auth_fields(ctx: &mut Ctx, reply: &mut Document) -> Result<()> {
    if let Some(v) = ctx.cmd.get("saslSupportedMechs") {
        let Bson::String(name) = v else { return Err(Error::type_mismatch("saslSupportedMechs must be a string \"<db>.<user>\"")) };
        if let Some((db, user)) = name.split_once('.') {
            if let Some(mechs) = auth::mechanisms_of(ctx.shared, db, user) {
                reply.insert("saslSupportedMechs", mechs);
            }
        }
    }
    if let Some(v) = ctx.cmd.get("speculativeAuthenticate") {
        let spec = match v {
            Bson::Document(d) if !d.is_empty() => d.clone(),
            _ => return Err(Error::bad_value(format!("{}.speculativeAuthenticate must be a non-empty Object", ctx.name))),
        };
        match spec.keys().next().map(String::as_str) {
            Some("saslStart") => {
                // Without a db it is ignored, as mongod does.
                if let Ok(db) = spec.get_str("db") {
                    if let Ok(r) = start_conversation(ctx, db, &spec) {
                        reply.insert("speculativeAuthenticate", r);
                    }
                }
            }
            Some("authenticate") => {
                let db = spec.get_str("db").unwrap_or(auth::EXTERNAL_DB).to_string();
                if let Ok(r) = authenticate_x509(ctx, &db, &spec) {
                    reply.insert("speculativeAuthenticate", r);
                }
            }
            Some(other) => return Err(Error::location(51769, format!("hello.speculativeAuthenticate unknown command: {other}"))),
            None => {}
        }
    }
    Ok(())
}
