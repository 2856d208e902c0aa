//! Replication progress: which optime a write concern needs, and the commit point (the
//! newest entry that a majority of the set has made durable).

use crate::config::ReplSetConfig;
use bson::Bson;
use common::optime::OpTime;

/// What a write waits for, parsed from writeConcern.w.
#[derive(Clone, Debug, PartialEq)]
pub enum WMode {
    /// This many data-bearing members (w:1 is the primary alone).
    Nodes(usize),
    /// The majority of voting data-bearing members (writeMajorityCount).
    Majority,
    /// A getLastErrorModes entry: for each tag, this many distinct tag values.
    Tag(String),
}

impl WMode {
    /// None for w that cannot be a mode (the write-concern parser has refused those).
    pub fn from_w(w: Option<&Bson>) -> Option<WMode> {
        match w {
            None => Some(WMode::Majority),
            Some(Bson::String(s)) if s == "majority" => Some(WMode::Majority),
            Some(Bson::String(s)) => Some(WMode::Tag(s.clone())),
            Some(Bson::Int32(n)) => usize::try_from(*n).ok().map(WMode::Nodes),
            Some(Bson::Int64(n)) => usize::try_from(*n).ok().map(WMode::Nodes),
            Some(Bson::Double(d)) if *d >= 0.0 => Some(WMode::Nodes(*d as usize)),
            _ => None,
        }
    }

    /// Whether waiting is needed at all in a set: w:0 and w:1 are the primary's own.
    pub fn needs_others(&self) -> bool {
        !matches!(self, WMode::Nodes(0 | 1))
    }
}

/// The `n`-th newest of `optimes` (1-based), if there are that many.
pub fn nth_newest(mut optimes: Vec<OpTime>, n: usize) -> Option<OpTime> {
    if n == 0 || optimes.len() < n {
        return None;
    }
    optimes.sort_unstable_by(|a, b| b.cmp(a));
    Some(optimes[n - 1])
}

/// The newest optime that writeMajorityCount voting, data-bearing members have reached
/// (by `optime_of(member index)`). Arbiters hold no data and never count.
pub fn majority_optime(config: &ReplSetConfig, optime_of: impl Fn(usize) -> OpTime) -> Option<OpTime> {
    let optimes: Vec<OpTime> = config.members.iter().enumerate().filter(|(_, m)| m.is_voter() && !m.arbiter_only).map(|(i, _)| optime_of(i)).collect();
    nth_newest(optimes, config.write_majority_count())
}

/// The commit point after new progress: a majority's durable optime, but (the Raft rule)
/// only once an entry of the current term is there; before that it stays where it was.
pub fn advance_commit_point(config: &ReplSetConfig, current: OpTime, term: i64, durable_of: impl Fn(usize) -> OpTime) -> OpTime {
    match majority_optime(config, durable_of) {
        Some(m) if m.term == term && m > current => m,
        _ => current,
    }
}

/// The commit point a member that is not primary takes from one another member reported
/// (mongod's TopologyCoordinator::advanceLastCommittedOpTimeAndWallTime): never backwards,
/// never past `last` (our newest entry: a majority read must not wait for entries we lack),
/// and not at all from a point of another term than `last`'s unless it came from our sync
/// source (`from_sync_source`). Our newest entries may be on a branch no majority took: a
/// former primary's, not yet rolled back. A later term's commit point, capped at `last`,
/// would then call them committed, and a majority read would return writes about to be
/// undone. The sync source's oplog holds ours (the fetcher checked), so its point is on our
/// branch; of one term, every entry comes from that term's one primary, so it is too.
pub fn learn_commit_point(current: OpTime, offered: OpTime, last: OpTime, from_sync_source: bool) -> OpTime {
    if offered.term != last.term && !from_sync_source {
        return current;
    }
    current.max(offered.min(last))
}

/// Whether members at `optime_of(i)` satisfy `mode` for an entry at `at`. `Err` names a
/// mode that the configuration does not define.
pub fn write_concern_met(config: &ReplSetConfig, mode: &WMode, at: OpTime, optime_of: impl Fn(usize) -> OpTime) -> Result<bool, String> {
    let reached = |i: usize| !config.members[i].arbiter_only && optime_of(i) >= at;
    Ok(match mode {
        WMode::Nodes(n) => (0..config.members.len()).filter(|&i| reached(i)).count() >= *n,
        WMode::Majority => {
            let voters = config.members.iter().enumerate().filter(|(i, m)| m.is_voter() && reached(*i)).count();
            voters >= config.write_majority_count()
        }
        WMode::Tag(name) => {
            let spec = config.settings.get_last_error_modes.get_document(name).map_err(|_| name.clone())?;
            spec.iter().all(|(tag, count)| {
                let want = match count {
                    Bson::Int32(n) => i64::from(*n),
                    Bson::Int64(n) => *n,
                    Bson::Double(d) => *d as i64,
                    _ => i64::MAX,
                };
                let mut values: Vec<&str> =
                    (0..config.members.len()).filter(|&i| reached(i)).filter_map(|i| config.members[i].tags.get_str(tag).ok()).collect();
                values.sort_unstable();
                values.dedup();
                values.len() as i64 >= want
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn config(members: Vec<bson::Document>) -> ReplSetConfig {
        ReplSetConfig::parse(&doc! {"_id": "rs", "version": 1, "members": members, "settings": {"getLastErrorModes": {"twoDCs": {"dc": 2}}}}).unwrap()
    }

    fn at(ts: u64, term: i64) -> OpTime {
        OpTime { ts, term }
    }

    #[test]
    fn majority_counts_voting_data_bearing_members() {
        let c = config(vec![
            doc! {"_id": 0, "host": "a:1"},
            doc! {"_id": 1, "host": "b:1"},
            doc! {"_id": 2, "host": "c:1"},
            doc! {"_id": 3, "host": "d:1", "votes": 0, "priority": 0},
        ]);
        let optimes = [at(10, 1), at(5, 1), at(3, 1), at(10, 1)];
        // The non-voter at 10 does not help: the second-newest voter is at 5.
        assert_eq!(majority_optime(&c, |i| optimes[i]), Some(at(5, 1)));
        assert!(write_concern_met(&c, &WMode::Majority, at(5, 1), |i| optimes[i]).unwrap());
        assert!(!write_concern_met(&c, &WMode::Majority, at(6, 1), |i| optimes[i]).unwrap());
        // w:2 counts any data-bearing member, voter or not.
        assert!(write_concern_met(&c, &WMode::Nodes(2), at(10, 1), |i| optimes[i]).unwrap());
        assert!(!write_concern_met(&c, &WMode::Nodes(3), at(10, 1), |i| optimes[i]).unwrap());
    }

    #[test]
    fn the_commit_point_needs_an_entry_of_the_current_term() {
        let c = config(vec![doc! {"_id": 0, "host": "a:1"}, doc! {"_id": 1, "host": "b:1"}, doc! {"_id": 2, "host": "c:1"}]);
        let old = [at(9, 1), at(9, 1), at(2, 1)];
        assert_eq!(advance_commit_point(&c, at(1, 1), 2, |i| old[i]), at(1, 1));
        let new = [at(3, 2), at(3, 2), at(2, 1)];
        assert_eq!(advance_commit_point(&c, at(1, 1), 2, |i| new[i]), at(3, 2));
        // Never backwards.
        assert_eq!(advance_commit_point(&c, at(4, 2), 2, |i| new[i]), at(4, 2));
        // A later term orders after any timestamp of an earlier one.
        assert!(at(1, 3) > at(1000, 2));
    }

    #[test]
    fn a_commit_point_of_another_term_is_taken_only_from_the_sync_source() {
        // A former primary stepped down with entries of term 1 that no majority took; a
        // heartbeat brings the new primary's commit point of term 2.
        let divergent_last = at(100, 1);
        assert_eq!(learn_commit_point(at(50, 1), at(150, 2), divergent_last, false), at(50, 1));
        // Its sync source's oplog holds our newest entry: its commit point is on our branch.
        assert_eq!(learn_commit_point(at(50, 1), at(150, 2), divergent_last, true), at(100, 1));
        // The same term: capped at our newest entry, never backwards.
        assert_eq!(learn_commit_point(at(50, 2), at(150, 2), at(120, 2), false), at(120, 2));
        assert_eq!(learn_commit_point(at(130, 2), at(110, 2), at(140, 2), false), at(130, 2));
    }

    #[test]
    fn tag_modes_need_distinct_values() {
        let c = config(vec![
            doc! {"_id": 0, "host": "a:1", "tags": {"dc": "east"}},
            doc! {"_id": 1, "host": "b:1", "tags": {"dc": "east"}},
            doc! {"_id": 2, "host": "c:1", "tags": {"dc": "west"}},
        ]);
        let mode = WMode::Tag("twoDCs".into());
        assert!(!write_concern_met(&c, &mode, at(5, 1), |i| [at(5, 1), at(5, 1), at(1, 1)][i]).unwrap());
        assert!(write_concern_met(&c, &mode, at(5, 1), |i| [at(5, 1), at(1, 1), at(5, 1)][i]).unwrap());
        assert!(write_concern_met(&c, &WMode::Tag("nope".into()), at(1, 1), |_| at(1, 1)).is_err());
        assert_eq!(WMode::from_w(None), Some(WMode::Majority));
        assert!(!WMode::from_w(Some(&Bson::Int32(1))).unwrap().needs_others());
    }
}
