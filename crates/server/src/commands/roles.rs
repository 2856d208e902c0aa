//! Role management: createRole, updateRole, dropRole, dropAllRolesFromDatabase,
//! grantRolesToRole, revokeRolesFromRole, grantPrivilegesToRole, revokePrivilegesFromRole
//! and rolesInfo. User-defined roles live in admin.system.roles as mongod keeps them: `_id`
//! "db.role", role, db, privileges, roles. Like users, they are data: written on the
//! primary, replicated, and every change bumps the authorization generation, so that each
//! connection resolves its user's roles again before its next command (`auth::grants_of`).

use super::users::{all_users, change_held_roles, finish, insert_new, modify_stored, parse_roles, roles_bson, NAME_BYTES_MAX};
use super::Ctx;
use crate::auth::{self, roles, roles::Privilege, ROLES_COLLECTION, USERS_COLLECTION, USERS_DB};
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

/// The role a command names (its first field), on the command's database.
fn role_name(ctx: &Ctx) -> Result<String> {
    let role = match ctx.cmd.get(ctx.name) {
        Some(Bson::String(s)) => s.clone(),
        Some(v) => {
            return Err(Error::type_mismatch(format!("BSON field '{}' is the wrong type '{}', expected type 'string'", ctx.name, common::value::type_name(v))))
        }
        None => return Err(Error::bad_value(format!("{} needs a role name", ctx.name))),
    };
    if role.is_empty() {
        return Err(Error::bad_value("Role name must be non-empty"));
    }
    if role.len() > NAME_BYTES_MAX || role.contains('\0') {
        return Err(Error::bad_value(format!("a role name must be at most {NAME_BYTES_MAX} bytes, without NUL characters")));
    }
    Ok(role)
}

/// The role a command changes: not a built-in one.
fn modifiable_role(ctx: &Ctx) -> Result<String> {
    let role = role_name(ctx)?;
    if roles::exists(&role, ctx.db) {
        return Err(Error::bad_value(format!("{role}@{} is a built-in role and cannot be modified", ctx.db)));
    }
    Ok(role)
}

fn roles_collection(ctx: &Ctx) -> Result<storage::Collection> {
    ctx.store().collection_or_create(USERS_DB, ROLES_COLLECTION)
}

fn role_id(role: &str, db: &str) -> Bson {
    Bson::String(format!("{db}.{role}"))
}

/// `privileges` of a role command, each checked for a role on the command's database.
fn parse_privileges(ctx: &Ctx, required: bool) -> Result<Option<Vec<Privilege>>> {
    let Some(list) = ctx.array_arg("privileges")? else {
        if required {
            return Err(Error::location(40414, format!("BSON field '{}.privileges' is missing but a required field", ctx.name)));
        }
        return Ok(None);
    };
    if list.len() > roles::PRIVILEGES_MAX {
        return Err(Error::bad_value(format!("a role holds at most {} privileges", roles::PRIVILEGES_MAX)));
    }
    list.iter().map(|p| Privilege::parse(p, ctx.db)).collect::<Result<Vec<_>>>().map(Some)
}

fn privileges_bson(privileges: &[Privilege]) -> Vec<Bson> {
    privileges.iter().map(|p| Bson::Document(p.to_document())).collect()
}

/// Add `new` to `privileges`: actions on a pattern already held join its privilege.
fn add_privileges(privileges: &mut Vec<Privilege>, new: Vec<Privilege>) {
    for p in new {
        match privileges.iter_mut().find(|q| q.resource == p.resource) {
            Some(q) => {
                for a in p.actions {
                    if !q.actions.contains(&a) {
                        q.actions.push(a);
                    }
                }
            }
            None => privileges.push(p),
        }
    }
}

/// Whether `target` is `from` or a role `from` inherits, through stored roles.
fn inherits(ctx: &Ctx, from: &(String, String), target: &(String, String)) -> Result<bool> {
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut queue = vec![from.clone()];
    while let Some(r) = queue.pop() {
        if &r == target {
            return Ok(true);
        }
        if seen.contains(&r) {
            continue;
        }
        seen.push(r.clone());
        if let Some(d) = auth::find_role(ctx.shared, &r.1, &r.0)? {
            queue.extend(auth::roles_of(&d));
        }
    }
    Ok(false)
}

/// Granting `granted` to `role`@ctx.db must not make a role inherit itself.
fn check_no_cycle(ctx: &Ctx, role: &str, granted: &[(String, String)]) -> Result<()> {
    let me = (role.to_string(), ctx.db.to_string());
    for g in granted {
        if inherits(ctx, g, &me)? {
            return Err(Error::new(
                Code::InvalidRoleModification,
                format!("Granting {}@{} to {role}@{} would introduce a cycle in the role graph", g.0, g.1, ctx.db),
            ));
        }
    }
    Ok(())
}

pub fn create_role(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("createRole", ctx.cmd, &["privileges", "roles", "authenticationRestrictions"])?;
    let role = role_name(ctx)?;
    if ctx.db == "local" {
        return Err(Error::bad_value("Cannot create roles in the local database"));
    }
    if ctx.db == auth::EXTERNAL_DB {
        return Err(Error::bad_value("Cannot create roles in the $external database"));
    }
    if roles::exists(&role, ctx.db) {
        return Err(Error::bad_value("Cannot create roles with the same name as a built-in role"));
    }
    if ctx.cmd.contains_key("authenticationRestrictions") {
        return Err(Error::new(Code::CommandNotSupported, "authenticationRestrictions are not supported by shoal yet"));
    }
    let privileges = parse_privileges(ctx, true)?.unwrap_or_default();
    let granted = parse_roles(ctx, "roles")?;
    check_no_cycle(ctx, &role, &granted)?;
    let d = doc! {"_id": role_id(&role, ctx.db), "role": &role, "db": ctx.db, "privileges": privileges_bson(&privileges), "roles": roles_bson(&granted)};
    insert_new(ctx, &roles_collection(ctx)?, &d, || Error::location(51002, format!("Role \"{role}@{}\" already exists", ctx.db)))?;
    Ok(Document::new())
}

/// Change the stored role `role`@ctx.db with `change`; RoleNotFound if there is none.
fn modify_role(ctx: &Ctx, role: &str, change: impl FnOnce(&mut Document) -> Result<()>) -> Result<()> {
    modify_stored(ctx, &roles_collection(ctx)?, &role_id(role, ctx.db), || Error::new(Code::RoleNotFound, format!("Role {role}@{} not found", ctx.db)), change)
}

pub fn update_role(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("updateRole", ctx.cmd, &["privileges", "roles", "authenticationRestrictions"])?;
    let role = modifiable_role(ctx)?;
    if ctx.cmd.contains_key("authenticationRestrictions") {
        return Err(Error::new(Code::CommandNotSupported, "authenticationRestrictions are not supported by shoal yet"));
    }
    let privileges = parse_privileges(ctx, false)?;
    let granted = if ctx.cmd.contains_key("roles") { Some(parse_roles(ctx, "roles")?) } else { None };
    if privileges.is_none() && granted.is_none() {
        return Err(Error::bad_value("Must specify at least one field to update in updateRole"));
    }
    if let Some(g) = &granted {
        check_no_cycle(ctx, &role, g)?;
    }
    modify_role(ctx, &role, |d| {
        if let Some(p) = &privileges {
            d.insert("privileges", privileges_bson(p));
        }
        if let Some(g) = &granted {
            d.insert("roles", roles_bson(g));
        }
        Ok(())
    })?;
    Ok(Document::new())
}

fn change_privileges(ctx: &mut Ctx, grant: bool) -> Result<Document> {
    common::value::check_fields(ctx.name, ctx.cmd, &["privileges"])?;
    let role = modifiable_role(ctx)?;
    let change = parse_privileges(ctx, true)?.unwrap_or_default();
    if change.is_empty() {
        return Err(Error::bad_value(format!("{} command requires a non-empty \"privileges\" array", ctx.name)));
    }
    let db = ctx.db.to_string();
    modify_role(ctx, &role, |d| {
        let mut held = auth::privileges_of(d, &db);
        if grant {
            add_privileges(&mut held, change);
        } else {
            for p in &change {
                if let Some(q) = held.iter_mut().find(|q| q.resource == p.resource) {
                    q.actions.retain(|a| !p.actions.contains(a));
                }
            }
            held.retain(|q| !q.actions.is_empty());
        }
        if held.len() > roles::PRIVILEGES_MAX {
            return Err(Error::bad_value(format!("a role holds at most {} privileges", roles::PRIVILEGES_MAX)));
        }
        d.insert("privileges", privileges_bson(&held));
        Ok(())
    })?;
    Ok(Document::new())
}

pub fn grant_privileges_to_role(ctx: &mut Ctx) -> Result<Document> {
    change_privileges(ctx, true)
}

pub fn revoke_privileges_from_role(ctx: &mut Ctx) -> Result<Document> {
    change_privileges(ctx, false)
}

fn change_roles(ctx: &mut Ctx, grant: bool) -> Result<Document> {
    common::value::check_fields(ctx.name, ctx.cmd, &["roles"])?;
    let role = modifiable_role(ctx)?;
    let change = parse_roles(ctx, "roles")?;
    if change.is_empty() {
        return Err(Error::bad_value(format!("{} command requires a non-empty \"roles\" array", ctx.name)));
    }
    if grant {
        check_no_cycle(ctx, &role, &change)?;
    }
    modify_role(ctx, &role, |d| {
        change_held_roles(d, &change, grant);
        Ok(())
    })?;
    Ok(Document::new())
}

pub fn grant_roles_to_role(ctx: &mut Ctx) -> Result<Document> {
    change_roles(ctx, true)
}

pub fn revoke_roles_from_role(ctx: &mut Ctx) -> Result<Document> {
    change_roles(ctx, false)
}

/// Delete the roles `gone` and take them out of every user and role that holds them (as
/// mongod does), in one write each; returns how many roles were deleted.
fn drop_roles(ctx: &Ctx, gone: impl Fn(&Document) -> bool) -> Result<i32> {
    let roles_coll = roles_collection(ctx)?;
    let mut w = roles_coll.writer();
    let mut dropped: Vec<(String, String)> = Vec::new();
    let stored = all_users(&w.snapshot())?;
    for (rid, d) in &stored {
        if gone(d) {
            w.delete(*rid, d)?;
            dropped.push((d.get_str("role").unwrap_or("").to_string(), d.get_str("db").unwrap_or("").to_string()));
        }
    }
    // The dropped roles leave what the remaining roles and the users hold.
    let holds_dropped = |d: &Document| auth::roles_of(d).iter().any(|r| dropped.contains(r));
    for (rid, d) in &stored {
        if !gone(d) && holds_dropped(d) {
            let mut new = d.clone();
            change_held_roles(&mut new, &dropped, false);
            w.update(*rid, d, &new, storage::UpdateForm::Replacement)?;
        }
    }
    drop(w);
    if let Some(users) = ctx.store().collection(USERS_DB, USERS_COLLECTION).filter(|_| !dropped.is_empty()) {
        let mut w = users.writer();
        for (rid, d) in all_users(&w.snapshot())? {
            if holds_dropped(&d) {
                let mut new = d.clone();
                change_held_roles(&mut new, &dropped, false);
                w.update(rid, &d, &new, storage::UpdateForm::Replacement)?;
            }
        }
    }
    finish(ctx)?;
    Ok(dropped.len() as i32)
}

pub fn drop_role(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("dropRole", ctx.cmd, &[])?;
    let role = role_name(ctx)?;
    if roles::exists(&role, ctx.db) {
        return Err(Error::new(Code::InvalidRoleModification, format!("Cannot delete built-in role: {role}@{}", ctx.db)));
    }
    if auth::find_role(ctx.shared, ctx.db, &role)?.is_none() {
        return Err(Error::new(Code::RoleNotFound, format!("Role {role}@{} not found", ctx.db)));
    }
    let db = ctx.db.to_string();
    drop_roles(ctx, |d| d.get_str("role").ok() == Some(role.as_str()) && d.get_str("db").ok() == Some(db.as_str()))?;
    Ok(Document::new())
}

pub fn drop_all_roles_from_database(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("dropAllRolesFromDatabase", ctx.cmd, &[])?;
    let db = ctx.db.to_string();
    let n = drop_roles(ctx, |d| d.get_str("db").ok() == Some(db.as_str()))?;
    Ok(doc! {"n": n})
}

/// A role a rolesInfo names: a name on the command's database, or {role, db}.
fn role_ref(db: &str, v: &Bson) -> Result<(String, String)> {
    match v {
        Bson::String(s) => Ok((s.clone(), db.to_string())),
        Bson::Document(d) => match (d.get_str("role"), d.get_str("db")) {
            (Ok(r), Ok(d)) => Ok((r.to_string(), d.to_string())),
            _ => Err(Error::bad_value("a role must be a name or a {role: <name>, db: <database>} document")),
        },
        _ => Err(Error::bad_value("a role must be a name or a {role: <name>, db: <database>} document")),
    }
}

/// rolesInfo's description of one role: its own roles and privileges, and what it inherits.
fn describe(ctx: &Ctx, role: &(String, String), stored: Option<&Document>, show_privileges: bool) -> Result<Document> {
    let builtin = roles::exists(&role.0, &role.1);
    let own = stored.map(auth::roles_of).unwrap_or_default();
    let mut d = doc! {"_id": role_id(&role.0, &role.1), "role": &role.0, "db": &role.1, "isBuiltin": builtin, "roles": roles_bson(&own)};
    // Inherited: every role reachable from its own, and their privileges.
    let grants = auth::grants_of(ctx.shared, &own)?;
    let mut inherited: Vec<(String, String)> = Vec::new();
    let mut queue = own.clone();
    while let Some(r) = queue.pop() {
        if inherited.contains(&r) {
            continue;
        }
        if let Some(s) = auth::find_role(ctx.shared, &r.1, &r.0)? {
            queue.extend(auth::roles_of(&s));
        }
        inherited.push(r);
    }
    d.insert("inheritedRoles", roles_bson(&inherited));
    if show_privileges {
        // Built-in roles' privileges are rules here, not lists: they cannot be shown.
        if builtin || !grants.builtin.is_empty() {
            return Err(Error::new(
                Code::CommandNotSupported,
                "rolesInfo showPrivileges for built-in roles, or roles that inherit one, is not supported by shoal yet",
            ));
        }
        let own_privileges = stored.map(|s| auth::privileges_of(s, &role.1)).unwrap_or_default();
        let mut all = own_privileges.clone();
        add_privileges(&mut all, grants.privileges);
        d.insert("privileges", privileges_bson(&own_privileges));
        d.insert("inheritedPrivileges", privileges_bson(&all));
    }
    Ok(d)
}

pub fn roles_info(ctx: &mut Ctx) -> Result<Document> {
    common::value::check_fields("rolesInfo", ctx.cmd, &["showPrivileges", "showBuiltinRoles", "showAuthenticationRestrictions"])?;
    let show_privileges = match ctx.cmd.get("showPrivileges") {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::String(s)) if s == "asUserFragment" => {
            return Err(Error::new(Code::CommandNotSupported, "rolesInfo showPrivileges: \"asUserFragment\" is not supported by shoal yet"))
        }
        Some(_) => return Err(Error::bad_value("showPrivileges must be a boolean")),
    };
    if ctx.bool_arg("showAuthenticationRestrictions")? == Some(true) {
        return Err(Error::new(Code::CommandNotSupported, "rolesInfo showAuthenticationRestrictions is not supported by shoal yet"));
    }
    let show_builtin = ctx.bool_arg("showBuiltinRoles")?.unwrap_or(false);
    let stored: Vec<Document> = match ctx.store().collection(USERS_DB, ROLES_COLLECTION) {
        Some(c) => all_users(&c.snapshot())?.into_iter().map(|(_, d)| d).collect(),
        None => Vec::new(),
    };
    let find = |r: &(String, String)| stored.iter().find(|d| d.get_str("role").ok() == Some(r.0.as_str()) && d.get_str("db").ok() == Some(r.1.as_str()));
    let mut out = Vec::new();
    // rolesInfo: 1 (a double, from a shell): every role of this database, and the built-in
    // ones when asked.
    let every = match ctx.cmd.get("rolesInfo") {
        Some(Bson::Int32(n)) => *n == 1,
        Some(Bson::Int64(n)) => *n == 1,
        Some(Bson::Double(v)) => *v == 1.0,
        _ => false,
    };
    match ctx.cmd.get("rolesInfo") {
        _ if every => {
            let mut names: Vec<(String, String)> = stored
                .iter()
                .filter(|d| d.get_str("db").ok() == Some(ctx.db))
                .map(|d| (d.get_str("role").unwrap_or("").to_string(), ctx.db.to_string()))
                .collect();
            if show_builtin {
                names.extend(roles::builtin_on(ctx.db).into_iter().map(|r| (r.to_string(), ctx.db.to_string())));
            }
            names.sort();
            for r in &names {
                out.push(Bson::Document(describe(ctx, r, find(r), show_privileges)?));
            }
        }
        Some(v @ (Bson::String(_) | Bson::Document(_) | Bson::Array(_))) => {
            let asked = match v {
                Bson::Array(a) => a.iter().map(|x| role_ref(ctx.db, x)).collect::<Result<Vec<_>>>()?,
                other => vec![role_ref(ctx.db, other)?],
            };
            // Roles that do not exist are left out of the answer, as mongod does.
            for r in &asked {
                if roles::exists(&r.0, &r.1) || find(r).is_some() {
                    out.push(Bson::Document(describe(ctx, r, find(r), show_privileges)?));
                }
            }
        }
        _ => return Err(Error::bad_value("rolesInfo takes 1, a role name, {role, db}, or an array of them")),
    }
    Ok(doc! {"roles": out})
}
