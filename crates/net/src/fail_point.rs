//! mongod's named fail points, for tests (`configureFailPoint`, only with
//! `enableTestCommands`): each is off, always on, on for the next n times it is reached
//! (`{times: n}`), on after the next n (`{skip: n}`), or on with a probability
//! (`{activationProbability: p}`), and carries the `data` it was configured with. A point
//! counts the times it fired (`timesEntered`), which `configureFailPoint` answers as
//! `count` and `waitForFailPoint` waits for.
//!
//! `failCommand` is the one the drivers' test suites use: it fails, blocks or drops the
//! connection of the commands it names, for the clients it names (`fail_command`). Both
//! roles evaluate it when a command is about to run, after it is found and authorized.

use bson::{Bson, Document};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest `blockTimeMS` of failCommand: a test's block, not a hang.
pub const BLOCK_TIME_MS_MAX: i64 = 600_000;

#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    Off,
    AlwaysOn,
    /// Fires the next n times, then turns off.
    Times(i64),
    /// Passes the next n times, then fires always.
    Skip(i64),
    Probability(f64),
}

impl Mode {
    /// `mode` of configureFailPoint: "off", "alwaysOn", {times: n}, {skip: n} or
    /// {activationProbability: p}.
    pub fn parse(v: Option<&Bson>) -> Result<Mode> {
        let count = |d: &Document, k: &str| match d.get(k).and_then(common::value::as_i64) {
            Some(n) if n >= 0 => Ok(n),
            _ => Err(Error::bad_value(format!("'{k}' option to 'mode' must be a non-negative integer"))),
        };
        match v {
            Some(Bson::String(m)) if m == "off" => Ok(Mode::Off),
            Some(Bson::String(m)) if m == "alwaysOn" => Ok(Mode::AlwaysOn),
            Some(Bson::String(m)) => Err(Error::bad_value(format!("unknown mode: {m}"))),
            Some(Bson::Document(d)) if d.contains_key("times") => Ok(match count(d, "times")? {
                0 => Mode::Off,
                n => Mode::Times(n),
            }),
            Some(Bson::Document(d)) if d.contains_key("skip") => Ok(Mode::Skip(count(d, "skip")?)),
            Some(Bson::Document(d)) if d.contains_key("activationProbability") => match d.get("activationProbability") {
                Some(Bson::Double(p)) if (0.0..=1.0).contains(p) => Ok(Mode::Probability(*p)),
                _ => Err(Error::bad_value("activationProbability must be a number from 0 to 1")),
            },
            Some(Bson::Document(_)) => Err(Error::bad_value("'mode' must be one of 'off', 'alwaysOn', 'times', 'skip' and 'activationProbability'")),
            None => Err(Error::new(Code::InvalidOptions, "'mode' is required to configure a fail point")),
            Some(_) => Err(Error::type_mismatch("'mode' must be a string or an object")),
        }
    }
}

struct State {
    mode: Mode,
    data: Arc<Document>,
}

/// One named fail point.
pub struct FailPoint {
    pub name: &'static str,
    /// Not off: the cheap test every evaluation starts with.
    active: AtomicBool,
    times_entered: AtomicU64,
    state: Mutex<Option<State>>,
}

impl FailPoint {
    pub const fn new(name: &'static str) -> FailPoint {
        FailPoint { name, active: AtomicBool::new(false), times_entered: AtomicU64::new(0), state: Mutex::new(None) }
    }

    /// Set mode and data; answers how many times it fired before.
    pub fn configure(&self, mode: Mode, data: Document) -> u64 {
        let mut state = self.state.lock();
        self.active.store(mode != Mode::Off, Ordering::Release);
        *state = Some(State { mode, data: Arc::new(data) });
        self.times_entered.load(Ordering::Acquire)
    }

    pub fn times_entered(&self) -> u64 {
        self.times_entered.load(Ordering::Acquire)
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Whether it fires here: when it is on, `applies` holds for its data (only then does
    /// a `times` or `skip` count go down), and its mode says so. Returns the data.
    pub fn fires(&self, applies: impl FnOnce(&Document) -> bool) -> Option<Arc<Document>> {
        if !self.is_active() {
            return None;
        }
        let mut guard = self.state.lock();
        let state = guard.as_mut()?;
        if state.mode == Mode::Off || !applies(&state.data) {
            return None;
        }
        let fire = match &mut state.mode {
            Mode::Off => false,
            Mode::AlwaysOn => true,
            Mode::Times(n) => {
                *n -= 1;
                if *n <= 0 {
                    state.mode = Mode::Off;
                    self.active.store(false, Ordering::Release);
                }
                true
            }
            Mode::Skip(n) if *n > 0 => {
                *n -= 1;
                false
            }
            Mode::Skip(_) => true,
            Mode::Probability(p) => rand::random::<f64>() < *p,
        };
        if !fire {
            return None;
        }
        self.times_entered.fetch_add(1, Ordering::AcqRel);
        Some(state.data.clone())
    }
}

/// `failCommand`: see `fail_command`.
pub static FAIL_COMMAND: FailPoint = FailPoint::new("failCommand");
/// `maxTimeAlwaysTimeOut`: every command that has maxTimeMS fails with MaxTimeMSExpired.
pub static MAX_TIME_ALWAYS_TIME_OUT: FailPoint = FailPoint::new("maxTimeAlwaysTimeOut");
/// `failGetMoreAfterCursorCheckout`: a getMore fails after it found its cursor (`errorCode`,
/// InternalError without one); the cursor stays.
pub static FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT: FailPoint = FailPoint::new("failGetMoreAfterCursorCheckout");

/// The fail points both roles have (`by_name`); a role adds its own.
const SHARED: [&FailPoint; 3] = [&FAIL_COMMAND, &MAX_TIME_ALWAYS_TIME_OUT, &FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT];

pub fn by_name(name: &str) -> Option<&'static FailPoint> {
    SHARED.into_iter().find(|f| f.name == name)
}

/// `configureFailPoint` for a point both roles have: `None` when `name` is not one of them.
pub fn configure_command(name: &str, cmd: &Document) -> Option<Result<Document>> {
    let point = by_name(name)?;
    let run = || {
        let mode = Mode::parse(cmd.get("mode"))?;
        let data = match cmd.get("data") {
            None => Document::new(),
            Some(Bson::Document(d)) => d.clone(),
            Some(_) => return Err(Error::type_mismatch("'data' must be an object")),
        };
        if point.name == "failCommand"
            && mode != Mode::Off
            && !matches!(data.get("failCommands"), Some(Bson::Array(_)))
            && !data.contains_key("failAllCommands")
        {
            return Err(Error::bad_value("failCommand needs 'failCommands', an array of command names"));
        }
        Ok(bson::doc! {"count": point.configure(mode, data) as i64})
    };
    Some(run())
}

/// `waitForFailPoint: name, timesEntered: n, maxTimeMS: ms`, on either role. `other`: the
/// role's own points, by name, with their counts.
pub async fn wait_command(cmd: &Document, other: impl Fn(&str) -> Option<u64>) -> Result<Document> {
    let name = cmd.get_str("waitForFailPoint").map_err(|_| Error::type_mismatch("'waitForFailPoint' must name a fail point"))?;
    let times = match cmd.get("timesEntered").and_then(common::value::as_i64) {
        Some(n) if n >= 0 => n as u64,
        _ => return Err(Error::new(Code::InvalidOptions, "'timesEntered' must be a non-negative integer")),
    };
    let max_time_ms = match cmd.get("maxTimeMS").and_then(common::value::as_i64) {
        Some(ms) if ms > 0 => ms as u64,
        _ => return Err(Error::new(Code::InvalidOptions, "waitForFailPoint needs a positive 'maxTimeMS'")),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_millis(max_time_ms);
    let entered = |name: &str| by_name(name).map(|p| p.times_entered()).or_else(|| other(name));
    if entered(name).is_none() {
        return Err(Error::bad_value(format!("Cannot find failpoint: {name}")));
    }
    while entered(name).unwrap_or(0) < times {
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::new(Code::MaxTimeMSExpired, format!("operation exceeded time limit waiting for fail point {name}")));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Document::new())
}

/// `failGetMoreAfterCursorCheckout`: the error a getMore on `ns` fails with after finding
/// its cursor, if the point fires (its data filtered as failCommand's, for getMore).
pub fn get_more_fails(ns: &str, app_name: Option<&str>, internal: bool) -> Option<Error> {
    let point = &FAIL_GET_MORE_AFTER_CURSOR_CHECKOUT;
    if !point.is_active() {
        return None;
    }
    let data = point.fires(|d| {
        d.get_str("appName").map_or(true, |a| app_name == Some(a))
            && d.get_str("namespace").map_or(true, |n| n == ns)
            && (!internal || d.get_bool("failInternalCommands").unwrap_or(false))
    })?;
    let code = data.get("errorCode").and_then(common::value::as_i64).unwrap_or(Code::InternalError.0 as i64);
    Some(Error::from_number(code as i32, "Hit the 'failGetMoreAfterCursorCheckout' failpoint"))
}

/// `maxTimeAlwaysTimeOut`: the error a command with maxTimeMS fails with, if the point fires.
pub fn max_time_expires() -> Option<Error> {
    if !MAX_TIME_ALWAYS_TIME_OUT.is_active() {
        return None;
    }
    MAX_TIME_ALWAYS_TIME_OUT.fires(|_| true)?;
    Some(Error::new(Code::MaxTimeMSExpired, "operation exceeded time limit"))
}

/// A connection's application name: the one its handshake named, or, for the handshake
/// itself, the one it names (mongod reads a hello's metadata before its fail points).
pub fn app_name<'a>(known: Option<&'a str>, name: &str, body: &'a Document) -> Option<&'a str> {
    if known.is_some() || !wire::is_hello(name) {
        return known;
    }
    body.get_document("client").ok()?.get_document("application").ok()?.get_str("name").ok()
}

/// Who sends a command, as failCommand tells clients apart.
pub struct Client<'a> {
    pub app_name: Option<&'a str>,
    /// Another member or a router (a hello with `internalClient`, or the internal user).
    pub internal: bool,
}

/// What failCommand does to a command it fires for.
#[derive(Debug, Default)]
pub struct Injected {
    /// Drop the connection without a reply.
    pub close: bool,
    /// Wait this long first.
    pub block: Option<Duration>,
    /// Then fail with this error.
    pub error: Option<Error>,
    /// Or run, and answer this beside the result instead of waiting for the write concern.
    pub write_concern_error: Option<Document>,
    /// The reply's errorLabels instead of those the server would add.
    pub labels: Option<Vec<Bson>>,
}

/// Commands that take a write concern: failCommand's `writeConcernError` applies to them.
fn takes_write_concern(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "findandmodify"
            | "create"
            | "createIndexes"
            | "drop"
            | "dropDatabase"
            | "dropIndexes"
            | "collMod"
            | "renameCollection"
            | "commitTransaction"
            | "abortTransaction"
            | "createUser"
            | "updateUser"
            | "dropUser"
            | "dropAllUsersFromDatabase"
            | "createRole"
            | "updateRole"
            | "dropRole"
            | "grantRolesToUser"
            | "revokeRolesFromUser"
            | "applyOps"
            | "clientBulkWrite"
            | "bulkWrite"
            | "aggregate"
    )
}

/// mongod's aliases of one command, which failCommands names by any of them.
fn same_command(listed: &str, name: &str) -> bool {
    fn canon(n: &str) -> &str {
        match n {
            "isMaster" | "ismaster" => "hello",
            "findandmodify" => "findAndModify",
            other => other,
        }
    }
    listed == name || canon(listed) == canon(name)
}

/// Evaluate failCommand for the command `name` on namespace `ns` from `client`: `None`
/// when it does not fire (the common case costs one atomic load).
pub fn fail_command(name: &str, ns: &str, client: &Client) -> Option<Result<Injected>> {
    if !FAIL_COMMAND.is_active() || name == "configureFailPoint" {
        return None;
    }
    let data = FAIL_COMMAND.fires(|d| {
        let listed = d.get_array("failCommands").map(|a| a.iter().any(|c| c.as_str().is_some_and(|c| same_command(c, name)))).unwrap_or(false);
        let app_ok = match d.get_str("appName") {
            Ok(want) => client.app_name == Some(want),
            Err(_) => true,
        };
        let ns_ok = d.get_str("namespace").map_or(true, |want| want == ns);
        let internal_ok = !client.internal || d.get_bool("failInternalCommands").unwrap_or(false);
        let acts = d.get_bool("closeConnection").unwrap_or(false)
            || d.get_bool("blockConnection").unwrap_or(false)
            || d.contains_key("errorCode")
            || (d.contains_key("writeConcernError") && takes_write_concern(name));
        (listed || d.contains_key("failAllCommands")) && app_ok && ns_ok && internal_ok && acts
    })?;
    Some(injected(name, &data))
}

fn injected(name: &str, d: &Document) -> Result<Injected> {
    let mut out = Injected { labels: d.get_array("errorLabels").ok().cloned(), ..Default::default() };
    tracing::info!("failing command {name} via 'failCommand' failpoint: {d}");
    if d.get_bool("blockConnection").unwrap_or(false) {
        let ms = match d.get("blockTimeMS").and_then(common::value::as_i64) {
            Some(ms) if (0..=BLOCK_TIME_MS_MAX).contains(&ms) => ms,
            Some(_) => return Err(Error::new(Code::InvalidOptions, format!("'blockTimeMS' must be 0 to {BLOCK_TIME_MS_MAX}"))),
            None => return Err(Error::new(Code::InvalidOptions, "must specify 'blockTimeMS' when 'blockConnection' is true")),
        };
        out.block = Some(Duration::from_millis(ms as u64));
    }
    if d.get_bool("closeConnection").unwrap_or(false) {
        out.close = true;
        return Ok(out);
    }
    const MESSAGE: &str = "Failing command via 'failCommand' failpoint";
    if let Some(code) = d.get("errorCode").and_then(common::value::as_i64) {
        let mut e = Error::from_number(code as i32, MESSAGE);
        if let Ok(extra) = d.get_document("errorExtraInfo") {
            e = e.with_extra(extra.clone());
        }
        out.error = Some(e);
    } else if let Ok(wce) = d.get_document("writeConcernError") {
        if takes_write_concern(name) {
            out.write_concern_error = Some(wce.clone());
        }
    }
    Ok(out)
}

/// A command's run under failCommand, the same for both roles: `fired` is `fail_command`'s
/// verdict on it. An error the fail point names is answered instead of running the command
/// (`error_reply` shapes it); `blockConnection` waits first; `closeConnection` drops the
/// connection unanswered; `run` gets the fail point's write concern error, answered in place
/// of the write concern; and the reply's error labels are mongod's for `kind` or the fail
/// point's `errorLabels`.
pub async fn around_command<B, F, Fut>(
    fired: Option<Result<Injected>>,
    kind: common::labels::Kind,
    error_reply: impl FnOnce(Error) -> Document,
    run: F,
) -> crate::service::Reply<B>
where
    B: AsRef<[u8]>,
    F: FnOnce(Option<Document>) -> Fut,
    Fut: std::future::Future<Output = crate::service::Reply<B>>,
{
    let mut injected = Injected::default();
    if let Some(fired) = fired {
        injected = match fired {
            Ok(i) => i,
            Err(e) => return crate::service::Reply::new(e.to_reply()),
        };
        if let Some(block) = injected.block {
            tokio::time::sleep(block).await;
        }
        if injected.close {
            return crate::service::Reply::close();
        }
    }
    let mut kind = kind;
    let mut reply = match injected.error.take() {
        Some(e) => {
            // mongod labels a change stream's error resumable only once the command has
            // opened or checked out its cursor, never failCommand's error before that.
            if kind == common::labels::Kind::ChangeStream {
                kind = common::labels::Kind::Other;
            }
            crate::service::Reply::new(error_reply(e))
        }
        None => run(injected.write_concern_error.take()).await,
    };
    if injected.labels.is_some() || !reply_ok(&reply.body) || reply.body.contains_key("writeConcernError") {
        common::labels::apply(kind, &mut reply.body, injected.labels);
    }
    reply
}

/// A reply with `ok: 1` (a double, as both roles answer, or an integer).
pub fn reply_ok(reply: &Document) -> bool {
    match reply.get("ok") {
        Some(Bson::Double(v)) => *v == 1.0,
        Some(Bson::Int32(v)) => *v == 1,
        Some(Bson::Int64(v)) => *v == 1,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn times_fires_n_times_then_turns_off() {
        let p = FailPoint::new("t");
        assert_eq!(p.configure(Mode::Times(2), doc! {"x": 1}), 0);
        assert!(p.fires(|_| true).is_some());
        assert!(p.fires(|_| false).is_none(), "a point that does not apply does not count");
        assert!(p.fires(|_| true).is_some());
        assert!(p.fires(|_| true).is_none());
        assert!(!p.is_active());
        assert_eq!(p.times_entered(), 2);
    }

    #[test]
    fn skip_passes_first() {
        let p = FailPoint::new("s");
        p.configure(Mode::Skip(1), Document::new());
        assert!(p.fires(|_| true).is_none());
        assert!(p.fires(|_| true).is_some());
        assert!(p.fires(|_| true).is_some());
    }

    #[test]
    fn fail_command_matches_names_apps_and_internal_clients() {
        FAIL_COMMAND.configure(Mode::AlwaysOn, doc! {"failCommands": ["isMaster", "insert"], "errorCode": 91, "appName": "a"});
        let app = Client { app_name: Some("a"), internal: false };
        let other = Client { app_name: Some("b"), internal: false };
        let internal = Client { app_name: Some("a"), internal: true };
        let e = fail_command("hello", "admin.$cmd", &app).unwrap().unwrap().error.unwrap();
        assert_eq!((e.code, e.code_name), (91, "ShutdownInProgress"));
        assert!(fail_command("insert", "db.c", &other).is_none());
        assert!(fail_command("insert", "db.c", &internal).is_none());
        assert!(fail_command("find", "db.c", &app).is_none());
        assert!(fail_command("configureFailPoint", "admin.$cmd", &app).is_none());
        FAIL_COMMAND.configure(Mode::AlwaysOn, doc! {"failCommands": ["find"], "blockConnection": true});
        assert_eq!(fail_command("find", "db.c", &app).unwrap().unwrap_err().code, Code::InvalidOptions.0);
        FAIL_COMMAND.configure(Mode::Off, Document::new());
    }

    #[test]
    fn modes_parse_as_mongod_takes_them() {
        assert_eq!(Mode::parse(Some(&Bson::String("alwaysOn".into()))).unwrap(), Mode::AlwaysOn);
        assert_eq!(Mode::parse(Some(&Bson::Document(doc! {"times": 3}))).unwrap(), Mode::Times(3));
        assert_eq!(Mode::parse(Some(&Bson::Document(doc! {"times": 0}))).unwrap(), Mode::Off);
        assert_eq!(Mode::parse(Some(&Bson::Document(doc! {"skip": 2}))).unwrap(), Mode::Skip(2));
        assert!(Mode::parse(Some(&Bson::Document(doc! {"times": -1}))).is_err());
        assert!(Mode::parse(Some(&Bson::Document(doc! {"activationProbability": 2.0}))).is_err());
        assert!(Mode::parse(None).is_err());
    }
}
