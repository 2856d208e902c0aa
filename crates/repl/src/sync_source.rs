//! Choosing where a secondary fetches the oplog from (mongod's TopologyCoordinator::
//! chooseNewSyncSource, simplified to its documented rules).
//!
//! Chaining off: the primary. Chaining on: a member that is up, primary or secondary, not
//! hidden, not delayed, not this member and not fetching from it, strictly ahead of us (the
//! primary may be level), and within maxSyncSourceLagSecs of the primary; voters take only
//! voters; among those, the lowest ping, except that the primary wins when its ping is within
//! changeSyncSourceThresholdMillis of the lowest (mongod 5.0 on: same data center).
//!
//! A member whose oplog no longer holds our newest entry is denied for a while (mongod's
//! denylist). Where only the primary may serve us and there is none to fetch from, we chain
//! from a secondary that qualifies instead, as chaining "on" does:
//! - the primary is denied: it can begin its oplog after our newest entry without any oplog
//!   being capped, since a member that joined by initial sync begins its oplog where its copy
//!   began, and may then be elected. mongod leaves such a member RECOVERING until an operator
//!   resyncs it.
//! - no primary is up: the entries the electable members lack may be on unelectable ones
//!   only (a primary's unsynced entries lost in a crash), and voters refuse a candidate
//!   behind them. mongod, which fetches from no one then, elects no one for good.
//!
//! "Strictly ahead" is what keeps the sync graph acyclic: along a cycle every member would
//! have to be ahead of the next. Level secondaries were once accepted here, and an idle
//! 7-member set formed the cycle 2←7←4←5←2 that no write could ever leave.

use crate::config::{Chaining, ReplSetConfig};
use crate::topology::MemberState;
use common::optime::OpTime;

/// mongod's maxSyncSourceLagSecs default.
pub const MAX_SYNC_SOURCE_LAG_SECS: u32 = 30;
/// mongod's changeSyncSourceThresholdMillis default: switch to a source at least this much
/// closer than the current one.
pub const CHANGE_SYNC_SOURCE_THRESHOLD_MS: u64 = 5;

/// Why a source's oplog, asked for our newest entry onward, did not start with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Its oldest entry is newer than our newest (capped, or its own initial sync began
    /// later): it cannot tell whether we diverged, and another source may still hold our
    /// entry. mongod denylists it for a while.
    TooStale,
    /// Its newest entry is older than ours: it is behind us, not divergent (a replSetSyncFrom
    /// target, a choice made on stale heartbeat news). Rolling back to it would undo entries
    /// a majority may hold, so we choose again.
    Behind,
    /// Its newest entry is of a term before ours: it may itself be on a branch that a later
    /// primary has left, whose entries it will roll back. Only a source with entries of our
    /// term or later (the current primary's branch, or one it copied) may make us roll back,
    /// as in Raft only the leader of the current term truncates a follower's log. Rolling
    /// back to such a source undid entries a majority held on the newer primary's branch (the
    /// simulation found it, seed 1011280). We choose again.
    OlderTerm,
    /// Our newest entries are not in its oplog: a former primary's writes that no majority
    /// took. We roll them back to the newest entry both oplogs share.
    Diverged,
}

/// Classify a mismatch from the source's oldest and newest entries (None: an empty oplog),
/// given our newest entry and our term.
pub fn classify_mismatch(our_last: OpTime, our_term: i64, source_oldest: Option<OpTime>, source_newest: Option<OpTime>) -> Mismatch {
    if source_oldest.is_some_and(|o| o.ts > our_last.ts) {
        Mismatch::TooStale
    } else if source_newest.is_none_or(|n| n < our_last) {
        Mismatch::Behind
    } else if source_newest.is_some_and(|n| n.term < our_term) {
        Mismatch::OlderTerm
    } else {
        Mismatch::Diverged
    }
}

/// What a member knows of another from heartbeats.
#[derive(Clone, Debug, Default)]
pub struct PeerView {
    pub up: bool,
    pub state: Option<MemberState>,
    pub applied: OpTime,
    /// Round-trip time of the latest heartbeat.
    pub ping_us: Option<u64>,
    /// The member index it fetches from, if any.
    pub sync_source: Option<usize>,
    /// Denied as a source for a while: its oplog began after our newest entry.
    pub denied: bool,
}

fn primary_applied(peers: &[PeerView]) -> Option<OpTime> {
    peers.iter().filter(|p| p.up && p.state == Some(MemberState::Primary)).map(|p| p.applied).max()
}

/// More than maxSyncSourceLagSecs behind the primary.
fn lags(primary_applied: Option<OpTime>, p: &PeerView) -> bool {
    primary_applied.is_some_and(|pa| pa.secs().saturating_sub(p.applied.secs()) > MAX_SYNC_SOURCE_LAG_SECS)
}

fn candidates<'a>(config: &'a ReplSetConfig, self_index: usize, peers: &'a [PeerView], my_last: OpTime) -> impl Iterator<Item = usize> + 'a {
    let me = &config.members[self_index];
    let primary_applied = primary_applied(peers);
    (0..config.members.len()).filter(move |&i| {
        let (m, p) = (&config.members[i], &peers[i]);
        let lagging = lags(primary_applied, p);
        i != self_index
            && p.up
            && !p.denied
            && matches!(p.state, Some(MemberState::Primary | MemberState::Secondary))
            && !m.arbiter_only
            && !m.hidden
            && m.secondary_delay_secs == 0
            && (m.build_indexes || !me.build_indexes)
            && (m.is_voter() || !me.is_voter())
            && p.sync_source != Some(self_index)
            && (p.applied > my_last || (p.state == Some(MemberState::Primary) && p.applied >= my_last))
            && !lagging
    })
}

/// The member to fetch from, or None when no member qualifies.
pub fn choose(config: &ReplSetConfig, self_index: usize, peers: &[PeerView], my_last: OpTime) -> Option<usize> {
    let primary = (0..peers.len()).find(|&i| i != self_index && peers[i].up && peers[i].state == Some(MemberState::Primary));
    let ping = |i: usize| peers[i].ping_us.unwrap_or(u64::MAX);
    // Only the primary, unless there is none to fetch from: then the nearest secondary
    // that qualifies.
    let from_primary = || match primary {
        Some(p) if !peers[p].denied => Some(p).filter(|&p| peers[p].applied >= my_last),
        _ => candidates(config, self_index, peers, my_last).min_by_key(|&i| (ping(i), i)),
    };
    match config.settings.chaining_allowed {
        Chaining::Off => from_primary(),
        Chaining::Auto if config.members[self_index].is_voter() => from_primary(),
        Chaining::Auto => {
            // A member without a vote takes a secondary: among those within the threshold
            // of the nearest, the one feeding the fewest members, so the read-only members
            // spread over the secondaries instead of all landing on the nearest. The
            // primary only when no secondary qualifies.
            let secondaries = || candidates(config, self_index, peers, my_last).filter(|&i| Some(i) != primary);
            let Some(nearest) = secondaries().min_by_key(|&i| (ping(i), i)) else {
                return candidates(config, self_index, peers, my_last).find(|&i| Some(i) == primary);
            };
            let near = ping(nearest).saturating_add(CHANGE_SYNC_SOURCE_THRESHOLD_MS * 1000);
            let fed = |i: usize| peers.iter().enumerate().filter(|&(j, p)| j != self_index && p.sync_source == Some(i)).count();
            secondaries().filter(|&i| ping(i) <= near).min_by_key(|&i| (fed(i), ping(i), i))
        }
        Chaining::On => {
            let nearest = candidates(config, self_index, peers, my_last).min_by_key(|&i| (ping(i), Some(i) != primary, i))?;
            // mongod (5.0 on) takes the primary over a nearer secondary whose ping is within
            // changeSyncSourceThresholdMillis of it: the two are taken to share a data
            // center, and fetching from the primary saves a hop. Chains form across data
            // centers only.
            match primary {
                Some(p)
                    if candidates(config, self_index, peers, my_last).any(|i| i == p)
                        && ping(p) <= ping(nearest).saturating_add(CHANGE_SYNC_SOURCE_THRESHOLD_MS * 1000) =>
                {
                    Some(p)
                }
                _ => Some(nearest),
            }
        }
    }
}

/// Whether the chain of sync sources starting at `from` leads back to `self_index`, by what
/// heartbeats last said. Bounded by the member count, so a cycle elsewhere cannot loop.
fn leads_back(peers: &[PeerView], self_index: usize, from: usize) -> bool {
    let mut at = from;
    for _ in 0..peers.len() {
        match peers[at].sync_source {
            Some(next) if next == self_index => return true,
            Some(next) if next < peers.len() => at = next,
            _ => return false,
        }
    }
    false
}

/// Whether `current` can serve us no longer, whatever the alternatives: it is down, fetches
/// (through others) from us while not ahead, or lags the primary by more than
/// maxSyncSourceLagSecs. What ends a replSetSyncFrom choice.
pub fn is_unusable(peers: &[PeerView], self_index: usize, my_last: OpTime, current: usize) -> bool {
    let source = &peers[current];
    !source.up
        || source.denied
        || lags(primary_applied(peers), source)
        || (source.state == Some(MemberState::Secondary) && source.applied <= my_last && leads_back(peers, self_index, current))
}

/// Whether a member fetching from `current` should choose again: the source is gone, no
/// longer a candidate (it stopped being primary with chaining off, fell behind the primary,
/// became hidden), is a secondary not ahead of us that fetches, through others, from us (a
/// cycle formed from stale heartbeats: nothing would ever arrive), another candidate is
/// closer by more than the threshold, or the primary is within the threshold of the nearest
/// (`choose` then takes it).
///
/// mongod also leaves a source that fetches from nobody, judged from the source's replies;
/// heartbeats here are up to an interval old, and a member that was primary a moment ago
/// still looks like it fetches from nobody, so that rule would undo replSetSyncFrom.
pub fn should_change(config: &ReplSetConfig, self_index: usize, peers: &[PeerView], my_last: OpTime, current: usize) -> bool {
    if is_unusable(peers, self_index, my_last, current) {
        return true;
    }
    match choose(config, self_index, peers, my_last) {
        None => !peers[current].up,
        Some(best) if best == current => false,
        Some(best) => {
            // Without a primary to fetch from every member chains (`choose`), and a chain is
            // left only for a clearly nearer source.
            let no_primary = !peers.iter().enumerate().any(|(i, p)| i != self_index && p.up && !p.denied && p.state == Some(MemberState::Primary));
            let chains = no_primary
                || match config.settings.chaining_allowed {
                    Chaining::Off => false,
                    Chaining::On => true,
                    Chaining::Auto => !config.members[self_index].is_voter(),
                };
            let still_candidate = chains && candidates(config, self_index, peers, OpTime::default()).any(|i| i == current);
            let ping = |i: usize| peers[i].ping_us.unwrap_or(u64::MAX);
            let is_primary = |i: usize| peers[i].state == Some(MemberState::Primary);
            // Under "auto" a member without a vote leaves the primary once a secondary
            // qualifies, and otherwise moves, as under "on", only for a clearly nearer
            // source: spreading by fan-out happens when it chooses, not by moving.
            let better = if config.settings.chaining_allowed == Chaining::Auto { is_primary(current) && !is_primary(best) } else { is_primary(best) };
            !still_candidate || better || ping(best).saturating_add(CHANGE_SYNC_SOURCE_THRESHOLD_MS * 1000) < ping(current)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson};

    fn set(chaining: bool) -> ReplSetConfig {
        set_with(Bson::Boolean(chaining))
    }

    fn set_with(chaining: Bson) -> ReplSetConfig {
        ReplSetConfig::parse(&doc! {"_id": "rs", "version": 1, "settings": {"chainingAllowed": chaining}, "members": [
            {"_id": 0, "host": "a:1"}, {"_id": 1, "host": "b:1"}, {"_id": 2, "host": "c:1"},
            {"_id": 3, "host": "d:1", "votes": 0, "priority": 0},
            {"_id": 4, "host": "e:1", "hidden": true, "priority": 0, "votes": 0},
        ]})
        .unwrap()
    }

    fn peer(state: MemberState, ts: u64, ping_us: u64) -> PeerView {
        PeerView { up: true, state: Some(state), applied: OpTime { ts: ts << 32, term: 1 }, ping_us: Some(ping_us), sync_source: None, denied: false }
    }

    #[test]
    fn a_mismatch_is_too_stale_behind_or_divergent() {
        let at = |ts: u64, term: i64| OpTime { ts, term };
        let ours = at(100, 2);
        assert_eq!(classify_mismatch(ours, 2, Some(at(101, 2)), Some(at(200, 2))), Mismatch::TooStale);
        assert_eq!(classify_mismatch(ours, 2, Some(at(1, 1)), Some(at(99, 2))), Mismatch::Behind);
        assert_eq!(classify_mismatch(ours, 2, None, None), Mismatch::Behind);
        // Its newest is of a later term: ahead, yet without our entry, so we diverged.
        assert_eq!(classify_mismatch(ours, 2, Some(at(1, 1)), Some(at(50, 3))), Mismatch::Diverged);
        assert_eq!(classify_mismatch(ours, 2, Some(at(1, 1)), Some(at(150, 2))), Mismatch::Diverged);
        // We know of term 4: a source whose newest entry is of term 3 may be on a branch
        // the term-4 primary left; it does not make us roll back.
        assert_eq!(classify_mismatch(ours, 4, Some(at(1, 1)), Some(at(50, 3))), Mismatch::OlderTerm);
        assert_eq!(classify_mismatch(ours, 3, Some(at(1, 1)), Some(at(50, 3))), Mismatch::Diverged);
    }

    #[test]
    fn chaining_picks_the_closest_qualified_member() {
        use MemberState::*;
        // The primary is in another data center (40 ms), the secondaries in ours.
        let peers = vec![peer(Primary, 100, 40_000), peer(Secondary, 100, 200), peer(Secondary, 100, 100), peer(Secondary, 100, 50), peer(Secondary, 100, 10)];
        let me = OpTime { ts: 90 << 32, term: 1 };
        // A voter takes voters only: not the non-voter at 50 µs nor the hidden one at 10 µs.
        assert_eq!(choose(&set(true), 1, &peers, me), Some(2));
        // A non-voter takes anyone visible, and the closest.
        assert_eq!(choose(&set(true), 4, &peers, me), Some(3));
        // Chaining off: the primary, whatever the pings.
        assert_eq!(choose(&set(false), 3, &peers, me), Some(0));
        // Behind us, or fetching from us: not a candidate.
        let mut p2 = peers.clone();
        p2[2].applied = OpTime { ts: 80 << 32, term: 1 };
        p2[3].sync_source = Some(4);
        assert_eq!(choose(&set(true), 1, &p2, me), Some(0));
        assert_eq!(choose(&set(true), 4, &p2, me), Some(1));
        // In the same data center as the nearest candidate (within 5 ms), the primary wins.
        let mut p3 = peers.clone();
        p3[0].ping_us = Some(4_000);
        assert_eq!(choose(&set(true), 1, &p3, me), Some(0));
        assert!(should_change(&set(true), 1, &p3, me, 2), "a secondary in the primary's data center leaves a chain for it");
        p3[0].ping_us = Some(6_000);
        assert_eq!(choose(&set(true), 1, &p3, me), Some(2));
    }

    #[test]
    fn lagging_sources_and_small_ping_gains_are_handled() {
        use MemberState::*;
        let me = OpTime { ts: 10 << 32, term: 1 };
        let mut peers =
            vec![peer(Primary, 100, 40_000), peer(Secondary, 100, 40_200), peer(Secondary, 100, 40_100), peer(Secondary, 100, 50), peer(Secondary, 100, 10)];
        // Fetching from member 2 while the primary is as near: move to the primary.
        assert!(should_change(&set(true), 1, &peers, me, 2));
        // From the primary, a secondary 2 µs closer is no reason to move; 5 ms closer is not
        // either (the primary within the threshold wins); 10 ms closer is.
        peers[2].ping_us = Some(39_998);
        assert!(!should_change(&set(true), 1, &peers, me, 0));
        peers[2].ping_us = Some(35_000);
        assert!(!should_change(&set(true), 1, &peers, me, 0));
        peers[2].ping_us = Some(30_000);
        assert!(should_change(&set(true), 1, &peers, me, 0));
        // A source 40 s behind the primary is dropped.
        peers[2].applied = OpTime { ts: 60 << 32, term: 1 };
        assert_eq!(choose(&set(true), 1, &peers, me), Some(0));
        assert!(should_change(&set(true), 1, &peers, me, 2));
    }

    #[test]
    fn sync_sources_never_form_a_cycle() {
        use MemberState::*;
        // All level and idle: only the primary qualifies, so every secondary takes it.
        let level = vec![peer(Primary, 100, 900), peer(Secondary, 100, 10), peer(Secondary, 100, 10), peer(Secondary, 100, 10), peer(Secondary, 100, 10)];
        let me = OpTime { ts: 100 << 32, term: 1 };
        for i in 1..4 {
            assert_eq!(choose(&set(true), i, &level, me), Some(0), "member {i}");
        }
        // A cycle left by stale heartbeats (1←2←3←1) is left at once.
        let mut cyc = level.clone();
        cyc[1].sync_source = Some(3);
        cyc[2].sync_source = Some(1);
        cyc[3].sync_source = Some(2);
        assert!(should_change(&set(true), 1, &cyc, me, 3));
        // A healthy chain 1←2←0, with the primary in another data center, is kept.
        let mut chain = level.clone();
        chain[0].ping_us = Some(40_000);
        chain[2].sync_source = Some(0);
        chain[2].applied = OpTime { ts: 101 << 32, term: 1 };
        assert!(!should_change(&set(true), 1, &chain, me, 2));
    }

    #[test]
    fn a_member_too_stale_for_the_primary_chains_from_a_secondary_that_holds_its_entry() {
        use MemberState::*;
        let me = OpTime { ts: 90 << 32, term: 1 };
        let mut peers = vec![peer(Primary, 100, 10), peer(Secondary, 100, 200), peer(Secondary, 100, 100), peer(Secondary, 100, 50), peer(Secondary, 100, 60)];
        for chaining in [Bson::Boolean(false), Bson::String("auto".into())] {
            let config = set_with(chaining);
            peers[0].denied = false;
            assert_eq!(choose(&config, 1, &peers, me), Some(0));
            // The primary's oplog began after our newest entry: the nearest voter instead.
            peers[0].denied = true;
            assert_eq!(choose(&config, 1, &peers, me), Some(2));
            assert!(should_change(&config, 1, &peers, me, 0), "a denied source is left");
            assert!(!should_change(&config, 1, &peers, me, 2), "the fallback is kept");
            peers[1].ping_us = Some(99);
            assert!(!should_change(&config, 1, &peers, me, 2), "and not left for a source 1 µs nearer");
            peers[1].ping_us = Some(200);
            // Denied no more: back to the primary.
            peers[0].denied = false;
            assert!(should_change(&config, 1, &peers, me, 2));
        }
        // No primary up: the nearest voter ahead of us too.
        peers[0].up = false;
        assert_eq!(choose(&set(false), 1, &peers, me), Some(2));
        assert!(!should_change(&set(false), 1, &peers, me, 2));
        // Denied, with no secondary ahead of us: no source.
        peers[0].up = true;
        peers[0].denied = true;
        for p in &mut peers[1..] {
            p.applied = me;
        }
        assert_eq!(choose(&set(false), 1, &peers, me), None);
    }

    #[test]
    fn auto_chaining_keeps_voters_on_the_primary_and_spreads_the_others_over_secondaries() {
        use MemberState::*;
        let auto = set_with(Bson::String("auto".into()));
        let me = OpTime { ts: 90 << 32, term: 1 };
        // One host: every ping within the threshold, the primary nearest of all.
        let mut peers = vec![peer(Primary, 100, 10), peer(Secondary, 100, 200), peer(Secondary, 100, 100), peer(Secondary, 100, 50), peer(Secondary, 100, 60)];
        // Voters fetch from the primary, even with a nearer secondary (chaining "on" would
        // take that one across data centers).
        peers[0].ping_us = Some(40_000);
        assert_eq!(choose(&auto, 1, &peers, me), Some(0));
        assert_eq!(choose(&set(true), 1, &peers, me), Some(2));
        assert!(should_change(&auto, 1, &peers, me, 2), "a voter leaves a secondary source for the primary");
        // A member without a vote takes a secondary, never the primary while one qualifies.
        peers[0].ping_us = Some(10);
        assert_eq!(choose(&set(true), 3, &peers, me), Some(0), "chaining on: the primary within the threshold wins");
        let chosen = choose(&auto, 3, &peers, me).unwrap();
        assert_ne!(chosen, 0);
        assert!(should_change(&auto, 3, &peers, me, 0), "it leaves the primary once a secondary qualifies");
        assert!(!should_change(&auto, 3, &peers, me, chosen), "and keeps its choice");
        // Among secondaries within the threshold, the one feeding the fewest members.
        peers[2].sync_source = Some(0);
        peers[4].sync_source = Some(2);
        assert_eq!(choose(&auto, 3, &peers, me), Some(1), "member 2 feeds member 4 already");
        // No secondary ahead of us: the primary.
        for p in &mut peers[1..] {
            p.applied = me;
        }
        assert_eq!(choose(&auto, 3, &peers, me), Some(0));
    }
}
