//! The replica-set configuration document (what replSetInitiate takes and replSetGetConfig
//! returns), parsed and validated with mongod's rules and messages.

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

/// mongod's limits: at most 50 members, of which at most 7 vote.
pub const MEMBERS_MAX: usize = 50;
pub const VOTERS_MAX: usize = 7;
/// mongod's range for a member's priority.
const PRIORITY_MAX: f64 = 1000.0;

#[derive(Clone, Debug, PartialEq)]
pub struct MemberConfig {
    pub id: i32,
    /// "host:port", as given.
    pub host: String,
    pub priority: f64,
    pub votes: i32,
    pub arbiter_only: bool,
    pub hidden: bool,
    pub secondary_delay_secs: i64,
    pub build_indexes: bool,
    pub tags: Document,
}

impl MemberConfig {
    pub fn is_voter(&self) -> bool {
        self.votes > 0
    }

    /// May become primary.
    pub fn is_electable(&self) -> bool {
        !self.arbiter_only && self.priority > 0.0
    }

    pub fn to_doc(&self) -> Document {
        doc! {
            "_id": self.id, "host": self.host.clone(), "arbiterOnly": self.arbiter_only,
            "buildIndexes": self.build_indexes, "hidden": self.hidden, "priority": self.priority,
            "tags": self.tags.clone(), "secondaryDelaySecs": self.secondary_delay_secs, "votes": self.votes,
        }
    }
}

/// `settings.chainingAllowed`: mongod's boolean, plus shoal's `"auto"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chaining {
    /// Every secondary fetches from the primary.
    Off,
    /// Secondaries may fetch from the nearest member ahead of them (mongod's rule).
    On,
    /// Voters fetch from the primary, so a majority acknowledgement takes one hop; members
    /// without a vote chain from secondaries, which takes their load off the primary.
    Auto,
}

impl Chaining {
    fn parse(v: &Bson, field: &str) -> Result<Chaining> {
        match v {
            Bson::String(s) if s == "auto" => Ok(Chaining::Auto),
            Bson::String(s) => Err(Error::bad_value(format!("{field} must be true, false or \"auto\", not \"{s}\""))),
            other => Ok(if boolean(other, field)? { Chaining::On } else { Chaining::Off }),
        }
    }

    fn to_bson(self) -> Bson {
        match self {
            Chaining::Off => Bson::Boolean(false),
            Chaining::On => Bson::Boolean(true),
            Chaining::Auto => Bson::String("auto".into()),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub chaining_allowed: Chaining,
    pub heartbeat_interval_ms: i64,
    pub heartbeat_timeout_secs: i64,
    pub election_timeout_ms: i64,
    /// -1: wait for catch-up indefinitely.
    pub catch_up_timeout_ms: i64,
    pub catch_up_takeover_delay_ms: i64,
    pub get_last_error_modes: Document,
    pub get_last_error_defaults: Document,
    pub replica_set_id: Option<ObjectId>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            chaining_allowed: Chaining::On,
            heartbeat_interval_ms: 2000,
            heartbeat_timeout_secs: 10,
            election_timeout_ms: 10_000,
            catch_up_timeout_ms: -1,
            catch_up_takeover_delay_ms: 30_000,
            get_last_error_modes: Document::new(),
            get_last_error_defaults: doc! {"w": 1, "wtimeout": 0},
            replica_set_id: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReplSetConfig {
    pub set_name: String,
    pub version: i32,
    /// The term in which this config was installed (absent in what clients send).
    pub term: Option<i64>,
    pub members: Vec<MemberConfig>,
    pub write_concern_majority_journal_default: bool,
    pub settings: Settings,
}

fn type_error(field: &str, want: &str) -> Error {
    Error::type_mismatch(format!("BSON field '{field}' is the wrong type, expected type '{want}'"))
}

fn number(v: &Bson) -> Option<f64> {
    match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

fn int(v: &Bson, field: &str) -> Result<i64> {
    match number(v) {
        Some(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => Ok(n as i64),
        Some(_) => Err(Error::bad_value(format!("{field} must be a whole number"))),
        None => Err(type_error(field, "int")),
    }
}

fn boolean(v: &Bson, field: &str) -> Result<bool> {
    match v {
        Bson::Boolean(b) => Ok(*b),
        other => number(other).map(|n| n != 0.0).ok_or_else(|| type_error(field, "bool")),
    }
}

fn unknown_field(within: &str, name: &str) -> Error {
    Error::new(Code::IDLUnknownField, format!("BSON field '{within}.{name}' is an unknown field."))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Code::InvalidReplicaSetConfig, msg)
}

impl ReplSetConfig {
    /// Parse a configuration document (field types and ranges); `validate` checks the rules
    /// that span members.
    pub fn parse(d: &Document) -> Result<ReplSetConfig> {
        let mut set_name = None;
        let mut version = None;
        let mut term = None;
        let mut members = None;
        let mut wc_journal = true;
        let mut settings = Settings::default();
        for (k, v) in d {
            match k.as_str() {
                "_id" => set_name = Some(v.as_str().ok_or_else(|| type_error("_id", "string"))?.to_string()),
                "version" => {
                    let n = int(v, "version")?;
                    if !(1..=i64::from(i32::MAX)).contains(&n) {
                        return Err(Error::bad_value(format!("version field value of {n} is out of range")));
                    }
                    version = Some(n as i32);
                }
                "term" => term = Some(int(v, "term")?),
                "protocolVersion" => {
                    if int(v, "protocolVersion")? != 1 {
                        return Err(invalid("Only protocolVersion 1 is supported"));
                    }
                }
                "writeConcernMajorityJournalDefault" => wc_journal = boolean(v, k)?,
                "configsvr" => {
                    if boolean(v, k)? {
                        return Err(Error::new(Code::CommandNotSupported, "config server replica sets are not supported yet"));
                    }
                }
                "members" => {
                    let Bson::Array(a) = v else { return Err(type_error("members", "array")) };
                    let mut out = Vec::with_capacity(a.len());
                    for (i, m) in a.iter().enumerate() {
                        let Bson::Document(m) = m else { return Err(type_error(&format!("members.{i}"), "object")) };
                        out.push(MemberConfig::parse(m)?);
                    }
                    members = Some(out);
                }
                "settings" => {
                    let Bson::Document(s) = v else { return Err(type_error("settings", "object")) };
                    settings = Settings::parse(s)?;
                }
                other => return Err(unknown_field("ReplSetConfig", other)),
            }
        }
        let set_name = set_name.ok_or_else(|| Error::new(Code::NoSuchKey, "Missing expected field \"_id\""))?;
        let version = version.ok_or_else(|| Error::new(Code::NoSuchKey, "Missing expected field \"version\""))?;
        let members = members.ok_or_else(|| Error::new(Code::NoSuchKey, "Missing expected field \"members\""))?;
        Ok(ReplSetConfig { set_name, version, term, members, write_concern_majority_journal_default: wc_journal, settings })
    }

    /// mongod's ReplSetConfig::validate: the rules across members.
    pub fn validate(&self) -> Result<()> {
        if self.set_name.is_empty() {
            return Err(Error::bad_value("Replica set configuration must have non-empty _id field"));
        }
        if self.members.is_empty() {
            return Err(Error::bad_value("Replica set configuration must have at least one member"));
        }
        if self.members.len() > MEMBERS_MAX {
            return Err(invalid(format!("Replica set configuration contains {} members, but must have at most {MEMBERS_MAX}", self.members.len())));
        }
        for (i, a) in self.members.iter().enumerate() {
            a.validate()?;
            for (j, b) in self.members.iter().enumerate().skip(i + 1) {
                if a.id == b.id {
                    return Err(invalid(format!("Found two member configurations with same _id field, members.{i}._id == members.{j}._id == {}", a.id)));
                }
                if a.host.eq_ignore_ascii_case(&b.host) {
                    return Err(invalid(format!("Found two member configurations with same host field, members.{i}.host == members.{j}.host == {}", a.host)));
                }
            }
        }
        let voters = self.voters();
        if voters > VOTERS_MAX {
            return Err(invalid(format!("Replica set configuration contains {voters} voting members, but must be at most {VOTERS_MAX}")));
        }
        if voters == 0 {
            return Err(invalid("Replica set configuration must contain at least one voting member"));
        }
        if !self.members.iter().any(MemberConfig::is_electable) {
            return Err(invalid("Replica set configuration must contain at least one non-arbiter member with priority > 0"));
        }
        for (mode, _) in &self.settings.get_last_error_modes {
            if mode == "majority" {
                return Err(invalid("getLastErrorModes may not contain a mode named \"majority\""));
            }
        }
        Ok(())
    }

    pub fn voters(&self) -> usize {
        self.members.iter().filter(|m| m.is_voter()).count()
    }

    /// Votes needed to win an election: a strict majority of the voters.
    pub fn majority_vote_count(&self) -> usize {
        self.voters() / 2 + 1
    }

    /// Data-bearing voters that must have a write for w:"majority" (mongod's
    /// writeMajorityCount: a majority of the voters, at most the data-bearing voters).
    pub fn write_majority_count(&self) -> usize {
        let data_bearing_voters = self.members.iter().filter(|m| m.is_voter() && !m.arbiter_only).count();
        self.majority_vote_count().min(data_bearing_voters)
    }

    /// mongod's rules for replacing `self` by `new` with replSetReconfig (beyond `validate`):
    /// the same set and replicaSetId, a higher version (unless forced), each host keeping its
    /// member _id, and (unless forced) at most one voter added or removed, so that any
    /// majority of the old voters and any majority of the new ones overlap.
    pub fn check_reconfig(&self, new: &ReplSetConfig, force: bool) -> Result<()> {
        if new.set_name != self.set_name {
            return Err(Error::new(
                Code::NewReplicaSetConfigurationIncompatible,
                format!("New and old configurations differ in replica set name; old was {}, and new is {}", self.set_name, new.set_name),
            ));
        }
        if let (Some(a), Some(b)) = (self.settings.replica_set_id, new.settings.replica_set_id) {
            if a != b {
                return Err(Error::new(
                    Code::NewReplicaSetConfigurationIncompatible,
                    format!("New and old configurations differ in replica set ID; old was {a}, and new is {b}"),
                ));
            }
        }
        if !force && new.version <= self.version {
            return Err(Error::new(
                Code::NewReplicaSetConfigurationIncompatible,
                format!(
                    "New replica set configuration version must be greater than old, but {} is not greater than {} for replica set {}",
                    new.version, self.version, self.set_name
                ),
            ));
        }
        for m in &new.members {
            if let Some(old) = self.members.iter().find(|o| o.host.eq_ignore_ascii_case(&m.host)) {
                if old.id != m.id {
                    return Err(Error::new(
                        Code::NewReplicaSetConfigurationIncompatible,
                        format!(
                            "New and old configurations both have members with host of {} but in the new configuration the _id field is {} and in the old configuration it is {} for replica set {}",
                            m.host, m.id, old.id, self.set_name
                        ),
                    ));
                }
            }
        }
        if !force {
            let voters = |c: &ReplSetConfig| c.members.iter().filter(|m| m.is_voter()).map(|m| m.id).collect::<std::collections::BTreeSet<i32>>();
            let (old, now) = (voters(self), voters(new));
            if old.symmetric_difference(&now).count() > 1 {
                return Err(Error::new(
                    Code::NewReplicaSetConfigurationIncompatible,
                    "Non force replica set reconfig can only add or remove at most 1 voting member.",
                ));
            }
        }
        Ok(())
    }

    pub fn member(&self, id: i32) -> Option<&MemberConfig> {
        self.members.iter().find(|m| m.id == id)
    }

    pub fn to_doc(&self) -> Document {
        let mut d = doc! {"_id": self.set_name.clone(), "version": self.version};
        if let Some(t) = self.term {
            d.insert("term", t);
        }
        d.insert("members", self.members.iter().map(|m| Bson::Document(m.to_doc())).collect::<Vec<_>>());
        d.insert("protocolVersion", 1i64);
        d.insert("writeConcernMajorityJournalDefault", self.write_concern_majority_journal_default);
        d.insert("settings", self.settings.to_doc());
        d
    }
}

impl MemberConfig {
    fn parse(d: &Document) -> Result<MemberConfig> {
        let mut id = None;
        let mut host = None;
        let mut priority = None;
        let mut votes = 1i32;
        let mut arbiter_only = false;
        let mut hidden = false;
        let mut secondary_delay_secs = 0i64;
        let mut build_indexes = true;
        let mut tags = Document::new();
        for (k, v) in d {
            match k.as_str() {
                "_id" => {
                    let n = int(v, "_id")?;
                    if !(0..=i64::from(i32::MAX)).contains(&n) {
                        return Err(Error::bad_value(format!("_id field value of {n} is out of range")));
                    }
                    id = Some(n as i32);
                }
                "host" => host = Some(v.as_str().ok_or_else(|| type_error("host", "string"))?.to_string()),
                "priority" => {
                    let p = number(v).ok_or_else(|| type_error("priority", "double"))?;
                    if !(0.0..=PRIORITY_MAX).contains(&p) {
                        return Err(Error::bad_value(format!("priority field value of {p} is out of range")));
                    }
                    priority = Some(p);
                }
                "votes" => {
                    let n = int(v, "votes")?;
                    if !(0..=1).contains(&n) {
                        return Err(Error::bad_value(format!("votes field value is {n} but must be 0 or 1")));
                    }
                    votes = n as i32;
                }
                "arbiterOnly" => arbiter_only = boolean(v, k)?,
                "hidden" => hidden = boolean(v, k)?,
                "buildIndexes" => build_indexes = boolean(v, k)?,
                "secondaryDelaySecs" => {
                    secondary_delay_secs = int(v, "secondaryDelaySecs")?;
                    if secondary_delay_secs < 0 {
                        return Err(Error::bad_value(format!("secondaryDelaySecs field value of {secondary_delay_secs} is out of range")));
                    }
                }
                "tags" => {
                    let Bson::Document(t) = v else { return Err(type_error("tags", "object")) };
                    for (tk, tv) in t {
                        if !matches!(tv, Bson::String(_)) {
                            return Err(type_error(&format!("tags.{tk}"), "string"));
                        }
                    }
                    tags = t.clone();
                }
                other => return Err(unknown_field("MemberConfig", other)),
            }
        }
        let id = id.ok_or_else(|| Error::new(Code::NoSuchKey, "Missing expected field \"_id\" in replica set member configuration"))?;
        let host = host.ok_or_else(|| Error::new(Code::NoSuchKey, "Missing expected field \"host\" in replica set member configuration"))?;
        if host.is_empty() {
            return Err(Error::bad_value("host field of a replica set member must not be empty"));
        }
        let priority = priority.unwrap_or(if arbiter_only { 0.0 } else { 1.0 });
        Ok(MemberConfig { id, host, priority, votes, arbiter_only, hidden, secondary_delay_secs, build_indexes, tags })
    }

    fn validate(&self) -> Result<()> {
        if self.arbiter_only {
            if self.votes == 0 {
                return Err(invalid("Arbiter must vote (cannot have 0 votes)"));
            }
            if self.priority != 0.0 {
                return Err(invalid("Arbiters must have priority 0"));
            }
            if self.hidden || self.secondary_delay_secs > 0 || !self.build_indexes {
                return Err(invalid("Arbiters cannot be hidden, delayed or without indexes"));
            }
        }
        if self.priority > 0.0 {
            if self.hidden {
                return Err(invalid("priority must be 0 when hidden=true"));
            }
            if self.votes == 0 {
                return Err(invalid("priority must be 0 when non-voting (votes:0)"));
            }
            if !self.build_indexes {
                return Err(invalid("priority must be 0 when buildIndexes=false"));
            }
            if self.secondary_delay_secs > 0 {
                return Err(invalid("priority must be 0 when secondaryDelaySecs is greater than 0"));
            }
        }
        Ok(())
    }
}

impl Settings {
    fn parse(d: &Document) -> Result<Settings> {
        let mut s = Settings::default();
        for (k, v) in d {
            match k.as_str() {
                "chainingAllowed" => s.chaining_allowed = Chaining::parse(v, k)?,
                "heartbeatIntervalMillis" => s.heartbeat_interval_ms = positive(v, k)?,
                "heartbeatTimeoutSecs" => s.heartbeat_timeout_secs = positive(v, k)?,
                "electionTimeoutMillis" => s.election_timeout_ms = positive(v, k)?,
                "catchUpTimeoutMillis" => {
                    let n = int(v, k)?;
                    if n < -1 {
                        return Err(Error::bad_value("catchUpTimeoutMillis must be -1 or at least 0"));
                    }
                    s.catch_up_timeout_ms = n;
                }
                "catchUpTakeoverDelayMillis" => {
                    let n = int(v, k)?;
                    if n < -1 {
                        return Err(Error::bad_value("catchUpTakeoverDelayMillis must be -1 or at least 0"));
                    }
                    s.catch_up_takeover_delay_ms = n;
                }
                "getLastErrorModes" => {
                    let Bson::Document(m) = v else { return Err(type_error(k, "object")) };
                    s.get_last_error_modes = m.clone();
                }
                "getLastErrorDefaults" => {
                    let Bson::Document(m) = v else { return Err(type_error(k, "object")) };
                    s.get_last_error_defaults = m.clone();
                }
                "replicaSetId" => match v {
                    Bson::ObjectId(o) => s.replica_set_id = Some(*o),
                    _ => return Err(type_error(k, "objectId")),
                },
                other => return Err(unknown_field("ReplSetConfigSettings", other)),
            }
        }
        Ok(s)
    }

    fn to_doc(&self) -> Document {
        let mut d = doc! {
            "chainingAllowed": self.chaining_allowed.to_bson(),
            "heartbeatIntervalMillis": self.heartbeat_interval_ms,
            "heartbeatTimeoutSecs": self.heartbeat_timeout_secs,
            "electionTimeoutMillis": self.election_timeout_ms,
            "catchUpTimeoutMillis": self.catch_up_timeout_ms,
            "catchUpTakeoverDelayMillis": self.catch_up_takeover_delay_ms,
            "getLastErrorModes": self.get_last_error_modes.clone(),
            "getLastErrorDefaults": self.get_last_error_defaults.clone(),
        };
        if let Some(id) = self.replica_set_id {
            d.insert("replicaSetId", id);
        }
        d
    }
}

fn positive(v: &Bson, field: &str) -> Result<i64> {
    let n = int(v, field)?;
    if n <= 0 {
        return Err(Error::bad_value(format!("{field} field value must be positive, not {n}")));
    }
    Ok(n)
}

#[cfg(test)]
mod reconfig_tests {
    use super::*;

    fn cfg(version: i32, members: &[(i32, &str, i32)]) -> ReplSetConfig {
        let ms: Vec<Bson> =
            members.iter().map(|(id, h, v)| Bson::Document(doc! {"_id": id, "host": *h, "votes": v, "priority": if *v == 0 { 0 } else { 1 }})).collect();
        ReplSetConfig::parse(&doc! {"_id": "rs", "version": version, "members": ms}).unwrap()
    }

    #[test]
    fn reconfig_changes_one_voter_at_a_time_with_a_higher_version() {
        let old = cfg(1, &[(0, "a:1", 1), (1, "b:1", 1), (2, "c:1", 1)]);
        assert!(old.check_reconfig(&cfg(2, &[(0, "a:1", 1), (1, "b:1", 1), (2, "c:1", 1), (3, "d:1", 1)]), false).is_ok());
        assert!(old.check_reconfig(&cfg(2, &[(0, "a:1", 1), (1, "b:1", 1), (2, "c:1", 1), (3, "d:1", 0), (4, "e:1", 0)]), false).is_ok());
        let two = cfg(2, &[(0, "a:1", 1), (1, "b:1", 1), (2, "c:1", 1), (3, "d:1", 1), (4, "e:1", 1)]);
        assert!(old.check_reconfig(&two, false).unwrap_err().message.contains("at most 1 voting member"));
        assert!(old.check_reconfig(&two, true).is_ok());
        assert!(old.check_reconfig(&cfg(1, &[(0, "a:1", 1), (1, "b:1", 1)]), false).unwrap_err().message.contains("must be greater"));
        assert!(old.check_reconfig(&cfg(2, &[(0, "a:1", 1), (5, "b:1", 1), (2, "c:1", 1)]), false).unwrap_err().message.contains("_id field is 5"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize, voters: usize) -> Vec<Bson> {
        (0..n)
            .map(|i| {
                let mut m = doc! {"_id": i as i32, "host": format!("127.0.0.{}:27017", i + 1)};
                if i >= voters {
                    m.insert("votes", 0);
                    m.insert("priority", 0);
                }
                Bson::Document(m)
            })
            .collect()
    }

    fn check(d: Document) -> Result<ReplSetConfig> {
        let c = ReplSetConfig::parse(&d)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn a_fifteen_member_set_with_seven_voters_is_valid() {
        let c = check(doc! {"_id": "rs0", "version": 1, "members": members(15, 7), "settings": {"chainingAllowed": false}}).unwrap();
        assert_eq!((c.voters(), c.majority_vote_count(), c.write_majority_count()), (7, 4, 4));
        assert_eq!(c.settings.chaining_allowed, Chaining::Off);
        let round = ReplSetConfig::parse(&c.to_doc()).unwrap();
        assert_eq!(round, c, "to_doc round-trips");
        let auto = check(doc! {"_id": "rs0", "version": 1, "members": members(15, 7), "settings": {"chainingAllowed": "auto"}}).unwrap();
        assert_eq!(auto.settings.chaining_allowed, Chaining::Auto);
        assert_eq!(ReplSetConfig::parse(&auto.to_doc()).unwrap(), auto, "\"auto\" round-trips");
        let e = check(doc! {"_id": "rs0", "version": 1, "members": members(3, 3), "settings": {"chainingAllowed": "sometimes"}}).unwrap_err();
        assert_eq!(e.code, Code::BadValue.0);
    }

    #[test]
    fn limits_and_member_rules_give_mongod_errors() {
        let code = |d: Document| check(d).unwrap_err().code;
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": members(51, 7)}), Code::InvalidReplicaSetConfig.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": members(8, 8)}), Code::InvalidReplicaSetConfig.0);
        let e = check(doc! {"_id": "rs0", "version": 1, "members": members(8, 8)}).unwrap_err();
        assert_eq!(e.message, "Replica set configuration contains 8 voting members, but must be at most 7");
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": []}), Code::BadValue.0);
        let dup_id = vec![Bson::Document(doc! {"_id": 0, "host": "a:1"}), Bson::Document(doc! {"_id": 0, "host": "b:1"})];
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": dup_id}), Code::InvalidReplicaSetConfig.0);
        let dup_host = vec![Bson::Document(doc! {"_id": 0, "host": "a:1"}), Bson::Document(doc! {"_id": 1, "host": "A:1"})];
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": dup_host}), Code::InvalidReplicaSetConfig.0);
        let hidden = vec![Bson::Document(doc! {"_id": 0, "host": "a:1", "hidden": true})];
        let e = check(doc! {"_id": "rs0", "version": 1, "members": hidden}).unwrap_err();
        assert_eq!(e.message, "priority must be 0 when hidden=true");
        let non_voting = vec![Bson::Document(doc! {"_id": 0, "host": "a:1", "votes": 0})];
        assert_eq!(check(doc! {"_id": "rs0", "version": 1, "members": non_voting}).unwrap_err().message, "priority must be 0 when non-voting (votes:0)");
        let none_electable = vec![Bson::Document(doc! {"_id": 0, "host": "a:1", "priority": 0})];
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": none_electable}), Code::InvalidReplicaSetConfig.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": "a:1", "votes": 2}]}), Code::BadValue.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": "a:1", "priority": 1001}]}), Code::BadValue.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": "a:1", "colour": "red"}]}), Code::IDLUnknownField.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "members": [{"_id": 0, "host": 5}]}), Code::TypeMismatch.0);
        assert_eq!(code(doc! {"_id": "rs0", "version": 1, "protocolVersion": 0, "members": members(1, 1)}), Code::InvalidReplicaSetConfig.0);
        assert_eq!(code(doc! {"_id": "rs0", "members": members(1, 1)}), Code::NoSuchKey.0);
        // A hidden, delayed, non-voting member is fine with priority 0.
        let ok = vec![
            Bson::Document(doc! {"_id": 0, "host": "a:1"}),
            Bson::Document(doc! {"_id": 1, "host": "b:1", "priority": 0, "hidden": true, "secondaryDelaySecs": 60, "votes": 0, "tags": {"dc": "east"}}),
            Bson::Document(doc! {"_id": 2, "host": "c:1", "arbiterOnly": true}),
        ];
        let c = check(doc! {"_id": "rs0", "version": 1, "members": ok}).unwrap();
        assert_eq!(c.members[2].priority, 0.0, "arbiters default to priority 0");
        assert_eq!((c.voters(), c.write_majority_count()), (2, 1));
    }
}
