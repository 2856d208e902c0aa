//! Elections under protocol version 1: whether this member grants a candidate its vote
//! (mongod's TopologyCoordinator::processReplSetRequestVotes), and how long a member waits
//! without a primary before standing.

use crate::config::ReplSetConfig;
use common::optime::OpTime;

/// A replSetRequestVotes request.
#[derive(Clone, Debug)]
pub struct VoteRequest {
    pub set_name: String,
    pub dry_run: bool,
    pub term: i64,
    pub candidate_index: usize,
    pub config_version: i32,
    pub config_term: i64,
    pub last_applied: OpTime,
}

/// This member's side of a vote.
pub struct Voter<'a> {
    pub config: &'a ReplSetConfig,
    pub self_index: usize,
    pub term: i64,
    /// The term of this member's last vote (durable), if any.
    pub last_vote_term: Option<i64>,
    pub last_applied: OpTime,
}

/// Grant the vote, or say why not (mongod's reasons, for replSetRequestVotes' `reason`).
pub fn decide(v: &Voter, req: &VoteRequest) -> Result<(), String> {
    let config_term = v.config.term.unwrap_or(0);
    if req.set_name != v.config.set_name {
        return Err(format!("candidate's set name ({}) differs from mine ({})", req.set_name, v.config.set_name));
    }
    if !v.config.members[v.self_index].is_voter() {
        return Err("this member has no vote".to_string());
    }
    if req.candidate_index >= v.config.members.len() || !v.config.members[req.candidate_index].is_electable() {
        return Err(format!("candidate index {} is not an electable member of my config", req.candidate_index));
    }
    if req.term < v.term {
        return Err(format!("candidate's term ({}) is lower than mine ({})", req.term, v.term));
    }
    if (req.config_term, req.config_version) < (config_term, v.config.version) {
        return Err(format!(
            "candidate's config with {{version: {}, term: {}}} is older than mine with {{version: {}, term: {}}}",
            req.config_version, req.config_term, v.config.version, config_term
        ));
    }
    if req.last_applied < v.last_applied {
        return Err(format!(
            "candidate's data is staler than mine. candidate's last applied OpTime: {:?}, my last applied OpTime: {:?}",
            req.last_applied, v.last_applied
        ));
    }
    if !req.dry_run && v.last_vote_term.is_some_and(|t| t >= req.term) {
        return Err(format!("already voted for another candidate ({}) this term ({})", req.candidate_index, req.term));
    }
    Ok(())
}

/// The election timeout with mongod's random offset: the configured timeout plus up to 15%
/// of it (`rand` in [0, 1)), so members rarely stand at the same moment.
pub fn randomized_timeout_ms(election_timeout_ms: i64, rand: f64) -> u64 {
    let base = election_timeout_ms.max(1) as f64;
    (base + base * 0.15 * rand.clamp(0.0, 1.0)) as u64
}

/// Whether a primary must step down because it has lost touch with a majority of the
/// voters (mongod's "can no longer see a majority of the set"): `responsive(i)` says member
/// `i` answered a heartbeat within the election timeout. A primary of less than one election
/// timeout has not heard from everyone yet, and a set with one voter cannot lose the others.
pub fn lost_majority(config: &ReplSetConfig, self_index: usize, responsive: impl Fn(usize) -> bool, primary_for_ms: u64, election_timeout_ms: u64) -> bool {
    let in_touch = config.members.iter().enumerate().filter(|(i, m)| m.is_voter() && (*i == self_index || responsive(*i))).count();
    config.voters() > 1 && in_touch < config.majority_vote_count() && primary_for_ms > election_timeout_ms
}

/// Whether a secondary stands for election for want of a primary: it can be elected and vote,
/// it is not frozen or already standing, no responsive member is primary, and it has heard
/// from no primary (nor granted a vote) for its randomized election timeout.
pub fn stands_for_want_of_primary(
    config: &ReplSetConfig,
    self_index: usize,
    may_stand: bool,
    sees_primary: bool,
    since_primary_seen_ms: u64,
    election_timeout_ms: u64,
) -> bool {
    let me = &config.members[self_index];
    me.is_electable() && me.is_voter() && may_stand && !sees_primary && since_primary_seen_ms >= election_timeout_ms
}

/// mongod's priorityTakeoverFreshnessWindowSeconds: how far behind the primary a member may
/// be and still take over for its higher priority.
pub const PRIORITY_TAKEOVER_FRESHNESS_SECS: u32 = 2;

/// Priority takeover (mongod's): how long a secondary that may stand waits before it stands
/// against the live primary `primary`, or None when it does not qualify. It qualifies when
/// its priority is above the primary's and its newest entry is within the freshness window
/// of the primary's; it then waits (rank + 1) election timeouts, rank being how many members
/// outrank it, so the highest-priority one goes first.
pub fn priority_takeover_wait_ms(
    config: &ReplSetConfig,
    self_index: usize,
    primary: usize,
    my_last: OpTime,
    primary_applied: OpTime,
    election_timeout_ms: u64,
) -> Option<u64> {
    let mine = config.members[self_index].priority;
    let caught_up = my_last.secs() + PRIORITY_TAKEOVER_FRESHNESS_SECS >= primary_applied.secs();
    if mine <= config.members[primary].priority || !caught_up {
        return None;
    }
    let rank = config.members.iter().filter(|m| m.priority > mine).count() as u64;
    Some(election_timeout_ms * (rank + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn config() -> ReplSetConfig {
        let mut c = ReplSetConfig::parse(&doc! {"_id": "rs", "version": 2, "members": [
            {"_id": 0, "host": "a:1"}, {"_id": 1, "host": "b:1"}, {"_id": 2, "host": "c:1", "priority": 0},
            {"_id": 3, "host": "d:1", "votes": 0, "priority": 0},
        ]})
        .unwrap();
        c.term = Some(1);
        c
    }

    #[test]
    fn votes_go_only_to_up_to_date_candidates_once_per_term() {
        let c = config();
        let mine = OpTime { ts: 50, term: 3 };
        let voter = Voter { config: &c, self_index: 1, term: 3, last_vote_term: Some(3), last_applied: mine };
        let req = VoteRequest { set_name: "rs".into(), dry_run: false, term: 4, candidate_index: 0, config_version: 2, config_term: 1, last_applied: mine };
        assert!(decide(&voter, &req).is_ok());
        assert!(decide(&voter, &VoteRequest { term: 3, ..req.clone() }).unwrap_err().contains("already voted"));
        assert!(decide(&voter, &VoteRequest { term: 2, ..req.clone() }).unwrap_err().contains("lower"));
        assert!(decide(&voter, &VoteRequest { last_applied: OpTime { ts: 49, term: 3 }, ..req.clone() }).unwrap_err().contains("staler"));
        // A later term's entry is newer whatever its timestamp.
        assert!(decide(&voter, &VoteRequest { last_applied: OpTime { ts: 1, term: 4 }, ..req.clone() }).is_ok());
        assert!(decide(&voter, &VoteRequest { config_version: 1, ..req.clone() }).unwrap_err().contains("older"));
        // Priority 0 never becomes primary; a non-voter never votes.
        assert!(decide(&voter, &VoteRequest { candidate_index: 2, ..req.clone() }).is_err());
        let non_voter = Voter { self_index: 3, ..voter };
        assert!(decide(&non_voter, &req).unwrap_err().contains("no vote"));
        // A dry run does not count as a vote already cast.
        let voted = Voter { config: &c, self_index: 1, term: 4, last_vote_term: Some(4), last_applied: mine };
        assert!(decide(&voted, &VoteRequest { dry_run: true, ..req.clone() }).is_ok());
        assert!(decide(&voted, &req).is_err());
    }

    #[test]
    fn a_primary_steps_down_without_a_majority_and_a_secondary_stands_without_a_primary() {
        let c = config();
        // Voters 0, 1, 2: a primary at 0 that hears only from itself has lost the majority,
        // but not in its first election timeout.
        assert!(lost_majority(&c, 0, |_| false, 10_001, 10_000));
        assert!(!lost_majority(&c, 0, |_| false, 9_000, 10_000));
        assert!(!lost_majority(&c, 0, |i| i == 2, 10_001, 10_000));
        // The non-voter does not count.
        assert!(lost_majority(&c, 0, |i| i == 3, 10_001, 10_000));
        assert!(stands_for_want_of_primary(&c, 1, true, false, 10_000, 10_000));
        assert!(!stands_for_want_of_primary(&c, 1, true, false, 9_999, 10_000));
        assert!(!stands_for_want_of_primary(&c, 1, true, true, 20_000, 10_000));
        assert!(!stands_for_want_of_primary(&c, 1, false, false, 20_000, 10_000));
        // Priority 0 and non-voters never stand.
        assert!(!stands_for_want_of_primary(&c, 2, true, false, 20_000, 10_000));
        assert!(!stands_for_want_of_primary(&c, 3, true, false, 20_000, 10_000));
    }

    #[test]
    fn a_fresh_member_of_higher_priority_takes_over_after_its_rank() {
        let mut c = config();
        c.members[0].priority = 3.0;
        c.members[1].priority = 2.0;
        let at = |secs: u64| OpTime { ts: secs << 32, term: 1 };
        // Member 1 (priority 2) against primary 2 (priority 0 is never primary; say 1).
        c.members[2].priority = 1.0;
        assert_eq!(priority_takeover_wait_ms(&c, 1, 2, at(100), at(102), 1000), Some(2000), "one member outranks it");
        assert_eq!(priority_takeover_wait_ms(&c, 0, 2, at(100), at(100), 1000), Some(1000));
        assert_eq!(priority_takeover_wait_ms(&c, 1, 2, at(100), at(103), 1000), None, "not fresh");
        assert_eq!(priority_takeover_wait_ms(&c, 1, 0, at(100), at(100), 1000), None, "the primary outranks it");
    }

    #[test]
    fn timeouts_are_spread_over_fifteen_percent() {
        assert_eq!(randomized_timeout_ms(10_000, 0.0), 10_000);
        assert_eq!(randomized_timeout_ms(10_000, 0.999_999), 11_499);
    }
}
