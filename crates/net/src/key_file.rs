//! The keyFile: the shared secret members and routers of one deployment authenticate to
//! each other with, as the internal user (SCRAM over the key, as mongod does).

use crate::scram;
use common::{Code, Error, Result};

/// The user members authenticate to each other as, with the keyFile's key.
pub const INTERNAL_USER: &str = "__system";
pub const INTERNAL_USER_DB: &str = "local";
/// mongod's bounds on a keyFile's key, in characters.
const KEY_CHARS_MIN: usize = 6;
const KEY_CHARS_MAX: usize = 1024;

/// The keyFile's key, and the credentials of the internal user derived from it (with this
/// process's own salts, as mongod does).
pub struct InternalKey {
    key: String,
    credentials: Vec<(scram::Mechanism, scram::Credentials)>,
}

/// Set once at startup (`--keyFile`): the key this process's member connections
/// authenticate with and its clients' internal logins are checked against.
static INTERNAL_KEY: std::sync::OnceLock<InternalKey> = std::sync::OnceLock::new();

pub fn internal_key() -> Option<&'static InternalKey> {
    INTERNAL_KEY.get()
}

/// Read and check a keyFile as mongod does: readable only by its owner, base64 characters
/// (whitespace ignored), 6 to 1024 of them. Sets the process's internal key.
pub fn load_key_file(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |m: String| Error::new(Code::BadValue, m);
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("Error reading file {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!("permissions on {} are too open", path.display())));
    }
    let text = std::fs::read(path).map_err(|e| bad(format!("Error reading file {}: {e}", path.display())))?;
    let mut key = String::new();
    for &b in &text {
        match b {
            b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' => {}
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=' => key.push(b as char),
            other => return Err(bad(format!("invalid char in key file {}: {}", path.display(), other as char))),
        }
    }
    if !(KEY_CHARS_MIN..=KEY_CHARS_MAX).contains(&key.len()) {
        return Err(bad(format!("security key in {} has length {}, must be between {KEY_CHARS_MIN} and {KEY_CHARS_MAX} chars", path.display(), key.len())));
    }
    let credentials = scram::Mechanism::ALL.into_iter().map(|m| Ok((m, scram::Credentials::new(m, INTERNAL_USER, &key)?))).collect::<Result<_>>()?;
    INTERNAL_KEY.set(InternalKey { key, credentials }).map_err(|_| Error::internal("the keyFile was loaded twice"))
}

impl InternalKey {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The internal user's credentials for `m`, derived from the key.
    pub fn credentials(&self, m: scram::Mechanism) -> Option<scram::Credentials> {
        self.credentials.iter().find(|(x, _)| *x == m).map(|(_, c)| c.clone())
    }
}
