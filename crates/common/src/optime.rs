//! MongoDB's OpTime: a position in the oplog, ordered by term and then timestamp.

use bson::{Document, Timestamp};

/// A point in the oplog: timestamp and term. Optimes compare by term first, as mongod's
/// do: an entry of a later term is newer whatever its timestamp (a new primary's clock may
/// be behind the old one's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTime {
    /// `secs << 32 | inc`, the entry's record id.
    pub ts: u64,
    pub term: i64,
}

impl PartialOrd for OpTime {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OpTime {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.term, self.ts).cmp(&(other.term, other.ts))
    }
}

impl OpTime {
    /// mongod's null optime, `{ts: Timestamp(0, 0), t: -1}`: the `prevOpTime` of a
    /// retryable write's first oplog entry.
    pub const NULL: OpTime = OpTime { ts: 0, term: -1 };

    pub fn timestamp(&self) -> Timestamp {
        ts_of(self.ts)
    }

    /// `{ts: Timestamp, t: term}`, as replSetGetStatus and hello show optimes.
    pub fn to_doc(&self) -> Document {
        bson::doc! {"ts": self.timestamp(), "t": self.term}
    }
}

impl OpTime {
    /// Parse `{ts: Timestamp, t: <number>}`.
    pub fn from_doc(d: &Document) -> Option<OpTime> {
        let ts = d.get_timestamp("ts").ok()?;
        let term = match d.get("t")? {
            bson::Bson::Int64(t) => *t,
            bson::Bson::Int32(t) => i64::from(*t),
            bson::Bson::Double(t) => *t as i64,
            _ => return None,
        };
        Some(OpTime { ts: ts_value(ts), term })
    }

    /// `from_doc` without decoding the document.
    pub fn from_raw(d: &bson::RawDocument) -> Option<OpTime> {
        let ts = d.get_timestamp("ts").ok()?;
        let term = match d.get("t").ok()?? {
            bson::RawBsonRef::Int64(t) => t,
            bson::RawBsonRef::Int32(t) => i64::from(t),
            bson::RawBsonRef::Double(t) => t as i64,
            _ => return None,
        };
        Some(OpTime { ts: ts_value(ts), term })
    }

    /// Seconds of the timestamp (a wall-clock approximation of when the entry was written).
    pub fn secs(&self) -> u32 {
        (self.ts >> 32) as u32
    }
}

/// A Timestamp as `secs << 32 | inc`, the form oplog record ids use.
pub fn ts_value(t: Timestamp) -> u64 {
    (u64::from(t.time) << 32) | u64::from(t.increment)
}

pub fn ts_of(ts: u64) -> Timestamp {
    Timestamp { time: (ts >> 32) as u32, increment: ts as u32 }
}

/// How far ahead of a process's wall clock a cluster time a client or peer gossips may be
/// (mongod's `maxAcceptableLogicalClockDriftSecs` default, one year).
pub const CLUSTER_TIME_DRIFT_SECS_MAX: u64 = 365 * 24 * 60 * 60;

/// A gossiped `$clusterTime`'s time, refused (ClusterTimeFailsRateLimiter, as mongod) if
/// it is more than `CLUSTER_TIME_DRIFT_SECS_MAX` ahead of this process's wall clock: a
/// process's clock follows the times it is told, and one pushed years ahead would stamp
/// every later write there. `None` when the command carries none.
pub fn gossiped_cluster_time(cmd: &Document) -> crate::Result<Option<Timestamp>> {
    let Ok(t) = cmd.get_document("$clusterTime").and_then(|c| c.get_timestamp("clusterTime")) else { return Ok(None) };
    within_drift(t).map(Some)
}

/// `t`, unless it is more than `CLUSTER_TIME_DRIFT_SECS_MAX` ahead of this process's wall
/// clock (ClusterTimeFailsRateLimiter): a time this process's clock is to follow.
pub fn within_drift(t: Timestamp) -> crate::Result<Timestamp> {
    let wall_secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if u64::from(t.time) > wall_secs + CLUSTER_TIME_DRIFT_SECS_MAX {
        return Err(crate::Error::new(
            crate::Code::ClusterTimeFailsRateLimiter,
            format!("New cluster time, {}, is too far from this node's wall clock time, {wall_secs}.", t.time),
        ));
    }
    Ok(t)
}

/// A `$clusterTime` field's value for `t`, with the zero signature (shoal runs without keys,
/// as mongod without auth accepts and sends it).
pub fn cluster_time_doc(t: Timestamp) -> Document {
    let signature = bson::doc! {"hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0i64};
    bson::doc! {"clusterTime": t, "signature": signature}
}
