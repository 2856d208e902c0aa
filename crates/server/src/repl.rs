//! The replication coordinator of a `--replSet` member: its configuration (stored in
//! `local.system.replset`), its state and term, and what hello, replSetGetStatus and the
//! write path ask of it. The protocol rules live in the `repl` crate; this module does the
//! I/O around them.
//!
//! What exists so far: one-member sets. replSetInitiate validates any configuration with
//! mongod's rules, but a set with other members needs heartbeats, elections and oplog
//! fetching, which are not built yet, so it is refused with CommandNotSupported.

use bson::{doc, Bson, DateTime, Document, Timestamp};
use common::{Code, Error, Result};
use parking_lot::Mutex;
use repl::{election_id, MemberState, ReplSetConfig};
use storage::{OpTime, Store};

const CONFIG_DB: &str = "local";
const CONFIG_COLLECTION: &str = "system.replset";

pub struct ReplCoord {
    pub set_name: String,
    /// "host:port" this member answers to when a config does not say otherwise.
    default_host: String,
    port: u16,
    oplog_size_bytes: u64,
    inner: Mutex<Inner>,
    /// `inner.state == Primary`, read by every command without taking the lock.
    primary: std::sync::atomic::AtomicBool,
    /// topologyVersion.counter: bumped on every change hello reports, waking awaitable hellos.
    topology: tokio::sync::watch::Sender<i64>,
}

struct Inner {
    config: Option<ReplSetConfig>,
    /// This member's index in `config.members`.
    self_index: usize,
    state: MemberState,
    term: i64,
    /// When this member became primary (its "new primary" entry).
    election: Option<OpTime>,
    election_date: DateTime,
}

impl ReplCoord {
    /// Load the stored configuration, if any, and take up the member's role.
    pub fn start(store: &Store, set_name: String, default_host: String, port: u16, oplog_size_bytes: u64) -> Result<ReplCoord> {
        let coord = ReplCoord {
            set_name,
            default_host,
            port,
            oplog_size_bytes,
            inner: Mutex::new(Inner { config: None, self_index: 0, state: MemberState::Startup, term: 0, election: None, election_date: DateTime::now() }),
            primary: std::sync::atomic::AtomicBool::new(false),
            topology: tokio::sync::watch::Sender::new(0),
        };
        let stored = match store.collection(CONFIG_DB, CONFIG_COLLECTION) {
            Some(c) => c.snapshot().scan(None, 1)?.into_iter().next().map(|(_, d)| d),
            None => None,
        };
        if let Some(d) = stored {
            let config = ReplSetConfig::parse(&d)?;
            store.enable_oplog(oplog_size_bytes)?;
            let self_index = coord.self_index(&config).ok_or_else(|| {
                Error::new(Code::NodeNotFound, format!("the stored replica set config has no member that is this node (port {})", coord.port))
            })?;
            let last_term = store.oplog_last().map_or(0, |t| t.term);
            coord.inner.lock().self_index = self_index;
            coord.become_primary_if_alone(store, config, last_term)?;
        }
        Ok(coord)
    }

    /// The member of `config` that is this node: its port is ours and its host names this
    /// machine (a loopback address, localhost, our host name, or an address we listen on).
    fn self_index(&self, config: &ReplSetConfig) -> Option<usize> {
        let ours = |host: &str| {
            let (name, port) = match host.rsplit_once(':') {
                Some((n, p)) => (n, p.parse::<u16>().ok()),
                None => (host, Some(27017)),
            };
            port == Some(self.port)
                && (name.eq_ignore_ascii_case("localhost")
                    || name.starts_with("127.")
                    || name == "::1"
                    || self.default_host.rsplit_once(':').is_some_and(|(h, _)| h.eq_ignore_ascii_case(name)))
        };
        config.members.iter().position(|m| ours(&m.host))
    }

    /// A set whose only voter is this member elects it at once: a new term, logged as
    /// mongod logs it ("new primary").
    fn become_primary_if_alone(&self, store: &Store, mut config: ReplSetConfig, last_term: i64) -> Result<()> {
        let mut inner = self.inner.lock();
        let me = &config.members[inner.self_index];
        let alone = config.members.len() == 1 && me.is_electable();
        if !alone {
            // Heartbeats and elections do not exist yet: such a config cannot have been
            // stored by this version (replSetInitiate refuses it).
            return Err(Error::new(Code::CommandNotSupported, "replica sets with more than one member are not supported yet"));
        }
        let term = last_term + 1;
        store.set_oplog_term(term);
        let at = store.append_oplog_noop(&doc! {"msg": "new primary"})?;
        config.term = Some(term);
        inner.config = Some(config);
        inner.term = term;
        inner.state = MemberState::Primary;
        inner.election = Some(at);
        inner.election_date = DateTime::now();
        self.primary.store(true, std::sync::atomic::Ordering::SeqCst);
        drop(inner);
        self.topology.send_modify(|c| *c += 1);
        tracing::info!(term, "this member is primary");
        Ok(())
    }

    /// replSetInitiate: validate, store the config, start the oplog, and (alone) become
    /// primary.
    pub fn initiate(&self, store: &Store, arg: Option<&Document>) -> Result<Document> {
        if self.inner.lock().config.is_some() || store.collection(CONFIG_DB, CONFIG_COLLECTION).is_some_and(|c| c.stats().count > 0) {
            return Err(Error::new(Code::AlreadyInitialized, "already initialized"));
        }
        let mut config = match arg {
            Some(d) => ReplSetConfig::parse(d)?,
            None => ReplSetConfig::parse(&doc! {"_id": self.set_name.clone(), "version": 1, "members": [{"_id": 0, "host": self.default_host.clone()}]})?,
        };
        if config.set_name != self.set_name {
            return Err(Error::new(
                Code::InvalidReplicaSetConfig,
                format!(
                    "Attempting to initiate a replica set with name {}, but command line reports {}; rejecting",
                    config.set_name, self.set_name
                ),
            ));
        }
        config.validate()?;
        let Some(self_index) = self.self_index(&config) else {
            return Err(Error::new(
                Code::InvalidReplicaSetConfig,
                format!("No host described in new configuration with {{version: {}, term: 0}} for replica set {} maps to this node", config.version, self.set_name),
            ));
        };
        if config.members.len() > 1 {
            return Err(Error::new(Code::CommandNotSupported, "replica sets with more than one member are not supported yet"));
        }
        config.settings.replica_set_id.get_or_insert_with(bson::oid::ObjectId::new);
        config.term = Some(0);
        let coll = store.collection_or_create(CONFIG_DB, CONFIG_COLLECTION)?;
        // Stored as one document whose _id is the set name, as mongod stores it.
        let out = coll.insert_many(&[config.to_doc()], true);
        if let Some((_, e)) = out.errors.into_iter().next() {
            return Err(e);
        }
        store.enable_oplog(self.oplog_size_bytes)?;
        store.append_oplog_noop(&doc! {"msg": "initiating set"})?;
        self.inner.lock().self_index = self_index;
        self.become_primary_if_alone(store, config, 0)?;
        Ok(Document::new())
    }

    /// Why write concern `w` cannot be satisfied by this set, if it cannot: more members than
    /// bear data, or a mode that is not in getLastErrorModes or that the members' tags cannot
    /// meet. (Every member of a one-member set has every write as soon as it is durable.)
    pub fn unsatisfiable(&self, w: &Bson) -> Option<Error> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref()?;
        let data_bearing: Vec<&repl::MemberConfig> = config.members.iter().filter(|m| !m.arbiter_only).collect();
        let not_enough = || Error::new(Code::UnsatisfiableWriteConcern, "Not enough data-bearing nodes");
        match w {
            Bson::String(s) if s == "majority" => None,
            Bson::String(mode) => {
                let Ok(spec) = config.settings.get_last_error_modes.get_document(mode) else {
                    return Some(Error::new(Code::UnknownReplWriteConcern, format!("No write concern mode named '{mode}' found in replica set configuration")));
                };
                for (tag, count) in spec {
                    let want = crate::commands::as_i64(count).unwrap_or(i64::MAX);
                    let mut values: Vec<&str> = data_bearing.iter().filter_map(|m| m.tags.get_str(tag).ok()).collect();
                    values.sort_unstable();
                    values.dedup();
                    if (values.len() as i64) < want {
                        return Some(Error::new(Code::UnsatisfiableWriteConcern, format!("Not enough nodes match write concern mode \"{mode}\"")));
                    }
                }
                None
            }
            other => match crate::commands::as_i64(other) {
                Some(n) if n > data_bearing.len() as i64 => Some(not_enough()),
                _ => None,
            },
        }
    }

    pub fn is_writable_primary(&self) -> bool {
        self.primary.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A linearizable read needs a primary that no other member can have replaced: here, a
    /// primary that is the set's only voter.
    pub fn serves_linearizable_reads(&self) -> bool {
        let inner = self.inner.lock();
        inner.state == MemberState::Primary && inner.config.as_ref().is_some_and(|c| c.voters() == 1)
    }

    pub fn topology_counter(&self) -> i64 {
        *self.topology.borrow()
    }

    pub fn topology_changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.topology.subscribe()
    }

    /// hello's replica-set fields (SDAM reads these to find the set and its primary).
    pub fn hello_fields(&self, store: &Store, legacy: bool, r: &mut Document) {
        let inner = self.inner.lock();
        let Some(config) = &inner.config else {
            r.insert(if legacy { "ismaster" } else { "isWritablePrimary" }, false);
            r.insert("secondary", false);
            r.insert("info", "Does not have a valid replica set config");
            r.insert("isreplicaset", true);
            return;
        };
        let me = &config.members[inner.self_index];
        let visible = |m: &&repl::MemberConfig| !m.hidden && !m.arbiter_only;
        let hosts: Vec<String> = config.members.iter().filter(|m| visible(m) && m.priority > 0.0).map(|m| m.host.clone()).collect();
        let passives: Vec<String> = config.members.iter().filter(|m| visible(m) && m.priority == 0.0).map(|m| m.host.clone()).collect();
        let arbiters: Vec<String> = config.members.iter().filter(|m| m.arbiter_only).map(|m| m.host.clone()).collect();
        let primary = inner.state == MemberState::Primary;
        r.insert(if legacy { "ismaster" } else { "isWritablePrimary" }, primary);
        r.insert("hosts", hosts);
        if !passives.is_empty() {
            r.insert("passives", passives);
        }
        if !arbiters.is_empty() {
            r.insert("arbiters", arbiters);
        }
        r.insert("setName", config.set_name.clone());
        r.insert("setVersion", config.version);
        r.insert("secondary", inner.state == MemberState::Secondary);
        if primary {
            r.insert("primary", me.host.clone());
            r.insert("electionId", election_id(inner.term));
        }
        if me.hidden {
            r.insert("hidden", true);
        }
        if !me.tags.is_empty() {
            r.insert("tags", me.tags.clone());
        }
        r.insert("me", me.host.clone());
        let last = store.oplog_last().unwrap_or_default();
        let last_date = wall_of(last);
        // One member: everything applied and durable is majority-committed.
        r.insert(
            "lastWrite",
            doc! {"opTime": last.to_doc(), "lastWriteDate": last_date, "majorityOpTime": last.to_doc(), "majorityWriteDate": last_date},
        );
    }

    pub fn get_config(&self) -> Result<Document> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref().ok_or_else(not_initialized)?;
        Ok(doc! {"config": config.to_doc()})
    }

    pub fn status(&self, store: &Store, uptime_secs: i64) -> Result<Document> {
        let inner = self.inner.lock();
        let config = inner.config.as_ref().ok_or_else(not_initialized)?;
        let last = store.oplog_last().unwrap_or_default();
        let wall = wall_of(last);
        let optime = last.to_doc();
        let mut members = Vec::new();
        for (i, m) in config.members.iter().enumerate() {
            let mut d = doc! {"_id": m.id, "name": m.host.clone(), "health": 1.0, "state": inner.state.code(), "stateStr": inner.state.name(),
                "uptime": uptime_secs, "optime": optime.clone(), "optimeDate": wall, "optimeDurable": optime.clone(), "optimeDurableDate": wall,
                "lastAppliedWallTime": wall, "lastDurableWallTime": wall, "syncSourceHost": "", "syncSourceId": -1, "infoMessage": "",
                "configVersion": config.version, "configTerm": config.term.unwrap_or(0)};
            if i == inner.self_index {
                if let (MemberState::Primary, Some(e)) = (inner.state, inner.election) {
                    d.insert("electionTime", e.timestamp());
                    d.insert("electionDate", inner.election_date);
                }
                d.insert("self", true);
                d.insert("lastHeartbeatMessage", "");
            }
            members.push(Bson::Document(d));
        }
        let voting = config.voters() as i32;
        let writable_voting = config.members.iter().filter(|m| m.is_voter() && !m.arbiter_only).count() as i32;
        Ok(doc! {
            "set": config.set_name.clone(),
            "date": DateTime::now(),
            "myState": inner.state.code(),
            "term": inner.term,
            "syncSourceHost": "",
            "syncSourceId": -1,
            "heartbeatIntervalMillis": config.settings.heartbeat_interval_ms,
            "majorityVoteCount": config.majority_vote_count() as i32,
            "writeMajorityCount": config.write_majority_count() as i32,
            "votingMembersCount": voting,
            "writableVotingMembersCount": writable_voting,
            "optimes": {
                "lastCommittedOpTime": optime.clone(), "lastCommittedWallTime": wall,
                "readConcernMajorityOpTime": optime.clone(), "readConcernMajorityWallTime": wall,
                "appliedOpTime": optime.clone(), "durableOpTime": optime, "lastAppliedWallTime": wall, "lastDurableWallTime": wall,
            },
            "members": members,
        })
    }
}

fn not_initialized() -> Error {
    Error::new(Code::NotYetInitialized, "no replset config has been received")
}

/// The wall-clock time of an optime (its timestamp's seconds; the entry's exact `wall` is in
/// the oplog).
fn wall_of(at: OpTime) -> DateTime {
    let Timestamp { time, .. } = at.timestamp();
    DateTime::from_millis(i64::from(time) * 1000)
}
