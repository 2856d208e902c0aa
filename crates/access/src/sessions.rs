//! The logical sessions this process has seen (the local part of mongod's and mongos's
//! logical session cache): each session a command named in its `lsid`, with who used it and when last, for
//! `$listLocalSessions`. endSessions forgets one; so does logicalSessionTimeoutMinutes
//! without use.

use bson::{doc, spec::BinarySubtype, Binary, Bson, DateTime, Document};
use common::server::LOGICAL_SESSION_TIMEOUT_MINUTES;
use common::{Code, Error, Result};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Sessions one member keeps at most (mongod's maxSessions default).
pub const SESSIONS_MAX: usize = 1_000_000;

struct Entry {
    last_use: DateTime,
    used: Instant,
    /// (user, db) of the authenticated user, none without one.
    user: Option<(String, String)>,
}

#[derive(Default)]
pub struct SessionCache {
    sessions: Mutex<HashMap<[u8; 16], Entry>>,
}

fn timeout() -> Duration {
    Duration::from_secs(LOGICAL_SESSION_TIMEOUT_MINUTES as u64 * 60)
}

impl SessionCache {
    /// A command (its `body`) run by a connection authenticated as `auth`: the session its
    /// `lsid` names, if any, was used (`touch`).
    pub fn touch_request(&self, body: &Document, auth: &crate::ConnAuth) -> Result<()> {
        let Some(Bson::Binary(id)) = body.get_document("lsid").ok().and_then(|l| l.get("id")) else { return Ok(()) };
        let user = auth.user.as_ref().map(|u| (u.user.as_str(), u.db.as_str()));
        self.touch(&id.bytes, user)
    }

    /// A command used session `id` (a UUID's 16 bytes; any other id is not a session the
    /// cache keeps). TooManyLogicalSessions when full of sessions still alive.
    pub fn touch(&self, id: &[u8], user: Option<(&str, &str)>) -> Result<()> {
        let Ok(key) = <[u8; 16]>::try_from(id) else { return Ok(()) };
        let mut sessions = self.sessions.lock();
        let now = Instant::now();
        if let Some(e) = sessions.get_mut(&key) {
            // The last use to the millisecond is all `lastUse` shows: refresh it at most so often.
            if now.duration_since(e.used) >= Duration::from_millis(1) {
                e.used = now;
                e.last_use = DateTime::now();
            }
            return Ok(());
        }
        if sessions.len() >= SESSIONS_MAX {
            sessions.retain(|_, e| now.duration_since(e.used) < timeout());
            if sessions.len() >= SESSIONS_MAX {
                return Err(Error::new(
                    Code(261, "TooManyLogicalSessions"),
                    format!("Unable to add session into the cache because the number of active sessions is too high: {SESSIONS_MAX}"),
                ));
            }
        }
        let user = user.map(|(u, d)| (u.to_string(), d.to_string()));
        sessions.insert(key, Entry { last_use: DateTime::now(), used: now, user });
        Ok(())
    }

    pub fn end(&self, id: &[u8]) {
        if let Ok(key) = <[u8; 16]>::try_from(id) {
            self.sessions.lock().remove(&key);
        }
    }

    /// `$listLocalSessions`' documents: the sessions of the users `users` names, or of every
    /// user with None, in mongod's shape `{_id: {id, uid}, lastUse, user: {name}}`.
    pub fn list(&self, users: Option<&[(String, Option<String>)]>) -> Vec<Document> {
        let now = Instant::now();
        let sessions = self.sessions.lock();
        let mut out = Vec::new();
        for (id, e) in sessions.iter() {
            if now.duration_since(e.used) >= timeout() {
                continue;
            }
            if let Some(users) = users {
                let wanted = users.iter().any(|(u, d)| match (&e.user, d) {
                    (Some((eu, ed)), Some(d)) => eu == u && ed == d,
                    (None, None) => u.is_empty(),
                    _ => false,
                });
                if !wanted {
                    continue;
                }
            }
            let name = e.user.as_ref().map(|(u, d)| format!("{u}@{d}"));
            let uid = Sha256::digest(name.as_deref().unwrap_or("").as_bytes()).to_vec();
            let mut d = doc! {
                "_id": {"id": Binary { subtype: BinarySubtype::Uuid, bytes: id.to_vec() }, "uid": Binary { subtype: BinarySubtype::Generic, bytes: uid }},
                "lastUse": e.last_use,
            };
            if let Some(name) = name {
                d.insert("user", doc! {"name": name});
            }
            out.push(d);
        }
        out
    }
}

/// `$listLocalSessions: {}` (the current user's), `{allUsers: true}` or `{users: [{user, db}]}`:
/// whose sessions to list (None: everyone's). `current`: the connection's user.
pub fn list_spec(spec: &Bson, current: Option<(&str, &str)>) -> Result<Option<Vec<(String, Option<String>)>>> {
    let Bson::Document(spec) = spec else {
        return Err(Error::type_mismatch("$listLocalSessions must take an object"));
    };
    let mut all = false;
    let mut users = None;
    for (k, v) in spec {
        match (k.as_str(), v) {
            ("allUsers", Bson::Boolean(b)) => all = *b,
            ("users", Bson::Array(list)) => {
                let mut named = Vec::with_capacity(list.len());
                for u in list {
                    let u = u.as_document().ok_or_else(|| Error::type_mismatch("$listLocalSessions.users must be an array of objects"))?;
                    let (Ok(user), Ok(db)) = (u.get_str("user"), u.get_str("db")) else {
                        return Err(Error::location(40414, "$listLocalSessions.users elements need 'user' and 'db'"));
                    };
                    named.push((user.to_string(), Some(db.to_string())));
                }
                users = Some(named);
            }
            _ => return Err(Error::location(40415, format!("BSON field '$listLocalSessions.{k}' is an unknown field."))),
        }
    }
    if all && users.is_some() {
        return Err(Error::bad_value("$listLocalSessions takes either allUsers or users, not both"));
    }
    if all {
        return Ok(None);
    }
    Ok(Some(users.unwrap_or_else(|| vec![current.map_or((String::new(), None), |(u, d)| (u.to_string(), Some(d.to_string())))])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_listed_by_user_and_forgotten_when_ended() {
        let c = SessionCache::default();
        c.touch(&[1; 16], None).unwrap();
        c.touch(&[2; 16], Some(("ann", "admin"))).unwrap();
        c.touch(&[3; 5], None).unwrap(); // not a UUID: not kept
        assert_eq!(c.list(None).len(), 2);
        let anonymous = list_spec(&Bson::Document(doc! {}), None).unwrap();
        assert_eq!(c.list(anonymous.as_deref()).len(), 1);
        let ann = list_spec(&Bson::Document(doc! {"users": [{"user": "ann", "db": "admin"}]}), None).unwrap();
        let listed = c.list(ann.as_deref());
        assert_eq!(listed[0].get_document("user").unwrap().get_str("name").unwrap(), "ann@admin");
        c.end(&[2; 16]);
        assert_eq!(c.list(None).len(), 1);
        assert!(list_spec(&Bson::Document(doc! {"allUsers": true, "users": []}), None).is_err());
    }
}
