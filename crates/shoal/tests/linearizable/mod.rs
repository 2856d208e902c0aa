//! A linearizability checker for histories of registers (read, write, compare-and-set),
//! after Wing and Gong's search with Lowe's memoization, as Knossos and Porcupine do it.
//!
//! A history is the operations of one register, each with when it was invoked, when its
//! reply came (or never, for an operation whose outcome is unknown: a timeout or a lost
//! connection), and what it returned. It is linearizable if each operation can be given a
//! point between its invocation and its reply at which it takes effect, such that the
//! register, starting absent, explains every reply. An operation with an unknown outcome
//! may take effect at any point after its invocation, or not at all.
//!
//! The search tries operations in invocation order and backtracks; a cache of (operations
//! linearized so far, register value) seen before cuts repeated work. `STEPS_MAX` bounds it:
//! a history it cannot decide within that is reported as such, never as linearizable.
#![allow(dead_code)]

use std::collections::HashSet;

/// What the register holds: absent, or a value.
pub type Value = Option<i64>;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A read that returned this.
    Read(Value),
    /// A write (an upsert) of this value.
    Write(i64),
    /// Compare-and-set from `from` to `to`; `swapped` is what it replied, None if unknown.
    Cas { from: i64, to: i64, swapped: Option<bool> },
}

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub op: Op,
    /// When the operation was invoked and when its reply came, in any one clock; None for
    /// an operation whose outcome is unknown.
    pub invoked: u64,
    pub returned: Option<u64>,
}

#[derive(Debug, PartialEq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the replies; the longest prefix of operations that could be
    /// linearized, as indexes into the history, shows where it breaks.
    NotLinearizable {
        linearized_max: Vec<usize>,
    },
    /// The search gave up after `STEPS_MAX` steps.
    Undecided,
}

pub const STEPS_MAX: u64 = 50_000_000;

/// The register's possible values after `op` takes effect in `value`, or none if `op`'s
/// reply cannot be explained there. An operation with an unknown outcome may also have no
/// effect.
fn step(op: &Op, value: Value, unknown: bool, out: &mut Vec<Value>) {
    out.clear();
    match *op {
        Op::Read(seen) => {
            if seen == value {
                out.push(value);
            }
        }
        Op::Write(v) => {
            out.push(Some(v));
            if unknown {
                out.push(value);
            }
        }
        Op::Cas { from, to, swapped } => match (swapped, value == Some(from)) {
            (Some(true), true) => out.push(Some(to)),
            (Some(false), false) => out.push(value),
            (Some(_), _) => {}
            (None, true) => {
                out.push(Some(to));
                out.push(value);
            }
            (None, false) => out.push(value),
        },
    }
}

/// Check one register's history.
pub fn check(history: &[Entry]) -> Verdict {
    // Reads with an unknown outcome tell nothing: left out.
    let ops: Vec<(usize, Entry)> = history.iter().copied().enumerate().filter(|(_, e)| !(e.returned.is_none() && matches!(e.op, Op::Read(_)))).collect();
    let n = ops.len();
    if n == 0 {
        return Verdict::Linearizable;
    }
    // Events in time order: (time, is_return, op). At equal times, invocations come first,
    // so that operations that touch are concurrent (the lenient reading of a tie).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, (_, e)) in ops.iter().enumerate() {
        events.push((e.invoked, false, i));
        events.push((e.returned.unwrap_or(u64::MAX), true, i));
    }
    events.sort_by_key(|&(t, is_return, i)| (t, is_return, i));
    // A doubly linked list over the events, with a head sentinel at index 0.
    let len = events.len() + 1;
    let mut next: Vec<usize> = (1..=len).collect();
    let mut prev: Vec<usize> = (0..len).map(|i| i.wrapping_sub(1)).collect();
    next[len - 1] = usize::MAX;
    let mut call_at = vec![0usize; n];
    let mut return_at = vec![0usize; n];
    for (k, &(_, is_return, i)) in events.iter().enumerate() {
        if is_return {
            return_at[i] = k + 1;
        } else {
            call_at[i] = k + 1;
        }
    }
    let node_op = |node: usize| events[node - 1].2;
    let node_is_return = |node: usize| events[node - 1].1;
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, nx) = (prev[node], next[node]);
        next[p] = nx;
        if nx != usize::MAX {
            prev[nx] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize| {
        let (p, nx) = (prev[node], next[node]);
        next[p] = node;
        if nx != usize::MAX {
            prev[nx] = node;
        }
    };

    // The set of operations linearized so far, as a Zobrist hash: a random 128-bit key per
    // operation, XORed in and out, so a cache entry costs 32 bytes and a step O(1) however
    // long the history (a bitset per entry made a 10-minute run's check need gigabytes). Two
    // sets sharing a hash is a 2^-128 chance; it could only prune a path, so at worst
    // report a linearizable history as not, never the reverse.
    let mut zobrist_state = 0x2545_F491_4F6C_DD1Du64 ^ n as u64;
    let mut split_mix = || {
        zobrist_state = zobrist_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = zobrist_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let keys: Vec<u128> = (0..n).map(|_| (u128::from(split_mix()) << 64) | u128::from(split_mix())).collect();
    let mut linearized: u128 = 0;
    let mut cache: HashSet<(u128, Value)> = HashSet::new();
    // (op, value before it, the other outcomes still to try).
    let mut stack: Vec<(usize, Value, Vec<Value>)> = Vec::new();
    let mut value: Value = None;
    let mut best: Vec<usize> = Vec::new();
    let (mut best_len, mut best_stale) = (0usize, false);
    let mut outcomes = Vec::new();
    let mut node = next[0];
    let mut steps = 0u64;
    // Try `op`'s outcomes from `candidates`: take the first not seen before.
    let mut pending: Option<(usize, Vec<Value>)> = None;
    loop {
        steps += 1;
        if steps > STEPS_MAX {
            return Verdict::Undecided;
        }
        if next[0] == usize::MAX {
            return Verdict::Linearizable;
        }
        let (op, mut candidates) = match pending.take() {
            Some(p) => p,
            None => {
                if node == usize::MAX {
                    // Past the end: only pending calls were left and none could go; back up.
                    (usize::MAX, Vec::new())
                } else if !node_is_return(node) {
                    let op = node_op(node);
                    let (_, e) = ops[op];
                    step(&e.op, value, e.returned.is_none(), &mut outcomes);
                    (op, outcomes.clone())
                } else {
                    (usize::MAX, Vec::new())
                }
            }
        };
        if op != usize::MAX {
            let mut taken = false;
            while let Some(after) = candidates.pop() {
                linearized ^= keys[op];
                if cache.insert((linearized, after)) {
                    stack.push((op, value, candidates));
                    value = after;
                    unlink(&mut next, &mut prev, call_at[op]);
                    unlink(&mut next, &mut prev, return_at[op]);
                    if stack.len() > best_len {
                        // Copied at the next backtrack, if that starts from here: copying
                        // at every new maximum would cost O(n²) on a history with none.
                        best_len = stack.len();
                        best_stale = true;
                    }
                    node = next[0];
                    taken = true;
                    break;
                }
                linearized ^= keys[op];
            }
            if !taken {
                node = next[node];
            }
            continue;
        }
        // A return reached before its operation was linearized (or the end): back up.
        if best_stale && stack.len() == best_len {
            best = stack.iter().map(|s| ops[s.0].0).collect();
            best_stale = false;
        }
        let Some((op, before, rest)) = stack.pop() else {
            best.sort_unstable();
            return Verdict::NotLinearizable { linearized_max: best };
        };
        linearized ^= keys[op];
        value = before;
        relink(&mut next, &mut prev, return_at[op]);
        relink(&mut next, &mut prev, call_at[op]);
        node = call_at[op];
        if rest.is_empty() {
            node = next[node];
        } else {
            pending = Some((op, rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(op: Op, invoked: u64, returned: Option<u64>) -> Entry {
        Entry { op, invoked, returned }
    }

    #[test]
    fn sequential_histories_are_linearizable_when_each_read_sees_the_last_write() {
        let h = [
            e(Op::Read(None), 0, Some(1)),
            e(Op::Write(1), 2, Some(3)),
            e(Op::Read(Some(1)), 4, Some(5)),
            e(Op::Cas { from: 1, to: 2, swapped: Some(true) }, 6, Some(7)),
            e(Op::Read(Some(2)), 8, Some(9)),
            e(Op::Cas { from: 1, to: 3, swapped: Some(false) }, 10, Some(11)),
        ];
        assert_eq!(check(&h), Verdict::Linearizable);
    }

    #[test]
    fn a_stale_read_after_a_completed_write_is_not_linearizable() {
        let h = [e(Op::Write(1), 0, Some(1)), e(Op::Write(2), 2, Some(3)), e(Op::Read(Some(1)), 4, Some(5))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }), "{:?}", check(&h));
        // A lost acknowledged write: read absent after the write returned.
        let h = [e(Op::Write(1), 0, Some(1)), e(Op::Read(None), 2, Some(3))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
        // A failed compare-and-set that should have swapped.
        let h = [e(Op::Write(1), 0, Some(1)), e(Op::Cas { from: 1, to: 2, swapped: Some(false) }, 2, Some(3))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // The read overlaps the write: it may see the old or the new value.
        for seen in [None, Some(1)] {
            let h = [e(Op::Write(1), 0, Some(10)), e(Op::Read(seen), 5, Some(6))];
            assert_eq!(check(&h), Verdict::Linearizable, "{seen:?}");
        }
        // But two reads by one client cannot go back: new, then old, while the write was
        // still in flight, is not linearizable.
        let h = [e(Op::Write(1), 0, Some(10)), e(Op::Read(Some(1)), 2, Some(3)), e(Op::Read(None), 4, Some(5))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
        // Two overlapping writes, then reads that agree on the last one.
        let h = [e(Op::Write(1), 0, Some(10)), e(Op::Write(2), 1, Some(9)), e(Op::Read(Some(1)), 11, Some(12)), e(Op::Read(Some(1)), 13, Some(14))];
        assert_eq!(check(&h), Verdict::Linearizable);
        let h = [e(Op::Write(1), 0, Some(10)), e(Op::Write(2), 1, Some(9)), e(Op::Read(Some(1)), 11, Some(12)), e(Op::Read(Some(2)), 13, Some(14))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
    }

    #[test]
    fn an_operation_with_an_unknown_outcome_may_or_may_not_have_taken_effect() {
        // Seen later: it took effect.
        let h = [e(Op::Write(1), 0, None), e(Op::Read(Some(1)), 5, Some(6))];
        assert_eq!(check(&h), Verdict::Linearizable);
        // Never seen: it did not.
        let h = [e(Op::Write(1), 0, None), e(Op::Read(None), 5, Some(6))];
        assert_eq!(check(&h), Verdict::Linearizable);
        // Seen, then not seen, with no other write: impossible.
        let h = [e(Op::Write(1), 0, None), e(Op::Read(Some(1)), 5, Some(6)), e(Op::Read(None), 7, Some(8))];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
        // It cannot take effect before it was invoked.
        let h = [e(Op::Read(Some(1)), 0, Some(1)), e(Op::Write(1), 2, None)];
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
        // An unknown compare-and-set, either way.
        let cas = Op::Cas { from: 1, to: 2, swapped: None };
        for seen in [Some(1), Some(2)] {
            let h = [e(Op::Write(1), 0, Some(1)), e(cas, 2, None), e(Op::Read(seen), 5, Some(6))];
            assert_eq!(check(&h), Verdict::Linearizable, "{seen:?}");
        }
        // A read with an unknown outcome says nothing.
        let h = [e(Op::Write(1), 0, Some(1)), e(Op::Read(None), 2, None)];
        assert_eq!(check(&h), Verdict::Linearizable);
    }

    #[test]
    fn the_breaking_prefix_is_reported() {
        let h = [e(Op::Write(1), 0, Some(1)), e(Op::Write(2), 2, Some(3)), e(Op::Read(Some(1)), 4, Some(5))];
        match check(&h) {
            Verdict::NotLinearizable { linearized_max } => assert_eq!(linearized_max, vec![0, 1]),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_history_of_a_million_operations_is_checked_in_little_memory() {
        // What a long soak gives one register: the cache holds 32 bytes per state.
        let mut h = Vec::with_capacity(1_000_000);
        for i in 0..500_000u64 {
            h.push(e(Op::Write(i as i64), 4 * i, Some(4 * i + 2)));
            h.push(e(Op::Read(Some(i as i64)), 4 * i + 1, Some(4 * i + 3)));
        }
        assert_eq!(check(&h), Verdict::Linearizable);
    }

    #[test]
    fn long_concurrent_histories_are_decided_quickly() {
        // 1,520 operations by four clients, overlapping in pairs, each read seeing the last
        // write, with an unknown write every 25 rounds (a timeout): linearizable; then one
        // read changed to a value never written: not.
        let mut h = Vec::new();
        let mut last = None;
        for i in 0..500u64 {
            let t = i * 10;
            h.push(e(Op::Write(i as i64), t, Some(t + 6)));
            h.push(e(Op::Read(last), t + 1, Some(t + 3)));
            h.push(e(Op::Read(Some(i as i64)), t + 7, Some(t + 9)));
            if i % 25 == 0 {
                h.push(e(Op::Write(1_000_000 + i as i64), t + 2, None));
            }
            last = Some(i as i64);
        }
        assert_eq!(check(&h), Verdict::Linearizable);
        let at = h.iter().position(|x| x.invoked == 2501).unwrap();
        h[at] = e(Op::Read(Some(-5)), 2501, Some(2503));
        assert!(matches!(check(&h), Verdict::NotLinearizable { .. }));
    }
}
