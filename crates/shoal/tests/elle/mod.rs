//! A checker of list-append histories for the anomalies snapshot isolation forbids, after
//! Elle (Kingsbury and Alvaro, "Elle: Inferring Isolation Anomalies from Experimental
//! Observations", VLDB 2020).
//!
//! Each transaction appends unique values to lists and reads whole lists. Since every value
//! is appended once, a read names exactly which appends it saw and in which order, so the
//! order of each key's versions is recovered from the longest read, and the dependencies
//! between transactions follow: write-write (one append right after another in a key's
//! order), write-read (a read whose last element another transaction appended) and
//! read-write (a read that misses the next append). The checker reports:
//! - aborted reads (G1a): a read sees a value of a transaction that aborted;
//! - intermediate reads (G1b): a read ends at a value its writer later followed with another
//!   append to the same key;
//! - incompatible orders: two reads of one key that are not prefixes of each other;
//! - garbage: a value no transaction appended, or a value twice in one list;
//! - internal inconsistency: a transaction that does not read its own appends;
//! - cycles: G0 (write-write only), G1c (write-write and write-read) and G-single (exactly
//!   one read-write edge, which includes lost updates). Cycles with two read-write edges or
//!   more (write skew, G2) are allowed under snapshot isolation.

use std::collections::{HashMap, HashSet};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    Append(i64, i64),
    /// A read of a key: its list (None: the read's outcome is unknown).
    Read(i64, Option<Vec<i64>>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Aborted,
    /// The commit's reply never came, or said nothing certain.
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Txn {
    pub ops: Vec<Mop>,
    pub outcome: Outcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Edge {
    Ww,
    Wr,
    Rw,
}

/// The anomalies found in `history`, each described (empty: none).
pub fn check(history: &[Txn]) -> Vec<String> {
    let mut anomalies = Vec::new();
    // Who appended each value, to which key, and whether it was that transaction's last
    // append to the key.
    let mut writer: HashMap<i64, (usize, i64, bool)> = HashMap::new();
    for (t, txn) in history.iter().enumerate() {
        let appends: Vec<(i64, i64)> = txn.ops.iter().filter_map(|m| if let Mop::Append(k, v) = m { Some((*k, *v)) } else { None }).collect();
        for (i, (k, v)) in appends.iter().enumerate() {
            let last = !appends[i + 1..].iter().any(|(k2, _)| k2 == k);
            if writer.insert(*v, (t, *k, last)).is_some() {
                anomalies.push(format!("value {v} appended twice (the workload's values are unique)"));
            }
        }
    }
    // Reads that count: those of committed transactions.
    let mut reads: Vec<(usize, i64, &Vec<i64>)> = Vec::new();
    for (t, txn) in history.iter().enumerate() {
        let mut own: HashMap<i64, Vec<i64>> = HashMap::new();
        for m in &txn.ops {
            match m {
                Mop::Append(k, v) => own.entry(*k).or_default().push(*v),
                Mop::Read(k, Some(list)) => {
                    // Read your own writes: the list ends with this transaction's appends.
                    if let Some(mine) = own.get(k) {
                        if !list.ends_with(mine) {
                            anomalies.push(format!("internal: transaction {t} read key {k} as {list:?} after appending {mine:?}"));
                        }
                    }
                    if txn.outcome == Outcome::Committed {
                        reads.push((t, *k, list));
                    }
                }
                Mop::Read(_, None) => {}
            }
        }
    }
    for (t, k, list) in &reads {
        let mut seen = HashSet::new();
        for v in list.iter() {
            if !seen.insert(*v) {
                anomalies.push(format!("duplicate: transaction {t} read {v} twice in key {k}: {list:?}"));
            }
            match writer.get(v) {
                None => anomalies.push(format!("garbage: transaction {t} read {v} in key {k}, which nobody appended")),
                Some((w, wk, _)) if *wk != *k => anomalies.push(format!("garbage: transaction {t} read {v} in key {k}, appended to key {wk} by {w}")),
                Some((w, _, _)) if history[*w].outcome == Outcome::Aborted => {
                    anomalies.push(format!("G1a aborted read: transaction {t} read {v} in key {k}, from transaction {w} that aborted"))
                }
                _ => {}
            }
        }
        if let Some(last) = list.last() {
            if let Some((w, _, false)) = writer.get(last) {
                if w != t {
                    anomalies.push(format!("G1b intermediate read: transaction {t} read key {k} ending at {last}, which {w} followed with another append"));
                }
            }
        }
    }
    // Each key's version order: its longest read; every read must be a prefix of it.
    let mut order: HashMap<i64, Vec<i64>> = HashMap::new();
    for (_, k, list) in &reads {
        let longest = order.entry(*k).or_default();
        if list.len() > longest.len() {
            *longest = (*list).clone();
        }
    }
    for (t, k, list) in &reads {
        if !order[k].starts_with(list) {
            anomalies.push(format!("incompatible order: transaction {t} read key {k} as {list:?}, not a prefix of {:?}", order[k]));
        }
    }
    // The dependency graph over committed transactions (and unknown ones whose appends were
    // seen, which therefore committed).
    let mut edges: HashSet<(usize, usize, Edge)> = HashSet::new();
    for list in order.values() {
        for pair in list.windows(2) {
            if let (Some((a, ..)), Some((b, ..))) = (writer.get(&pair[0]), writer.get(&pair[1])) {
                if a != b {
                    edges.insert((*a, *b, Edge::Ww));
                }
            }
        }
    }
    for (t, k, list) in &reads {
        if let Some((w, ..)) = list.last().and_then(|v| writer.get(v)) {
            if w != t {
                edges.insert((*w, *t, Edge::Wr));
            }
        }
        // The append that follows what this read saw, by someone else: it came after.
        if let Some((w, ..)) = order[k].get(list.len()).and_then(|v| writer.get(v)) {
            if w != t {
                edges.insert((*t, *w, Edge::Rw));
            }
        }
    }
    anomalies.extend(cycles(history.len(), &edges));
    anomalies
}

/// The forbidden cycles of the graph: G0, G1c, G-single (one example each, with a count).
fn cycles(n: usize, edges: &HashSet<(usize, usize, Edge)>) -> Vec<String> {
    let mut out = Vec::new();
    let adjacency = |kinds: &[Edge]| {
        let mut adj = vec![Vec::new(); n];
        for (a, b, e) in edges {
            if kinds.contains(e) {
                adj[*a].push(*b);
            }
        }
        adj
    };
    let ww = adjacency(&[Edge::Ww]);
    if let Some(c) = scc_members(&ww).into_iter().find(|c| c.len() > 1) {
        out.push(format!("G0 write cycle among transactions {:?}", &c[..c.len().min(10)]));
    }
    let wwr = adjacency(&[Edge::Ww, Edge::Wr]);
    let components = scc_members(&wwr);
    if let Some(c) = components.iter().find(|c| c.len() > 1) {
        out.push(format!("G1c circular information flow among transactions {:?}", &c[..c.len().min(10)]));
    }
    // G-single: a read-write edge a -> b whose b reaches a through write-write and
    // write-read edges alone.
    let mut found = 0usize;
    let mut example = None;
    for (a, b, e) in edges {
        if *e == Edge::Rw && reaches(&wwr, *b, *a) {
            found += 1;
            example.get_or_insert((*a, *b));
        }
    }
    if let Some((a, b)) = example {
        out.push(format!("G-single (a lost update or read skew): {found} read-write edges close a cycle, e.g. {a} -rw-> {b} and back"));
    }
    out
}

fn reaches(adj: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut seen = vec![false; adj.len()];
    let mut stack = vec![from];
    while let Some(x) = stack.pop() {
        if x == to {
            return true;
        }
        if std::mem::replace(&mut seen[x], true) {
            continue;
        }
        stack.extend(adj[x].iter().copied().filter(|y| !seen[*y]));
    }
    false
}

/// Strongly connected components (Tarjan's, iterative), each as its members.
fn scc_members(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adj.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut next, mut stack, mut out) = (0usize, Vec::new(), Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some((v, i)) = work.pop() {
            if i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = adj[v].get(i) {
                work.push((v, i + 1));
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            if low[v] == index[v] {
                let mut c = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    c.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(c);
            }
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Mop::*;

    fn committed(ops: Vec<Mop>) -> Txn {
        Txn { ops, outcome: Outcome::Committed }
    }

    #[test]
    fn a_serial_history_has_no_anomaly() {
        let h = vec![
            committed(vec![Append(1, 1), Read(1, Some(vec![1]))]),
            committed(vec![Read(1, Some(vec![1])), Append(1, 2)]),
            committed(vec![Read(1, Some(vec![1, 2])), Append(2, 3)]),
            Txn { ops: vec![Append(2, 4)], outcome: Outcome::Aborted },
            committed(vec![Read(2, Some(vec![3]))]),
        ];
        assert_eq!(check(&h), Vec::<String>::new());
    }

    #[test]
    fn each_anomaly_is_found() {
        let has = |h: &[Txn], what: &str| check(h).iter().any(|a| a.starts_with(what));
        // A lost update: both read [] and append; the order says 1 then 2.
        let lost = vec![
            committed(vec![Read(1, Some(vec![])), Append(1, 1)]),
            committed(vec![Read(1, Some(vec![])), Append(1, 2)]),
            committed(vec![Read(1, Some(vec![1, 2]))]),
        ];
        assert!(has(&lost, "G-single"), "{:?}", check(&lost));
        let aborted = vec![Txn { ops: vec![Append(1, 1)], outcome: Outcome::Aborted }, committed(vec![Read(1, Some(vec![1]))])];
        assert!(has(&aborted, "G1a"));
        let intermediate = vec![committed(vec![Append(1, 1), Append(1, 2)]), committed(vec![Read(1, Some(vec![1]))])];
        assert!(has(&intermediate, "G1b"));
        let incompatible = vec![
            committed(vec![Append(1, 1)]),
            committed(vec![Append(1, 2)]),
            committed(vec![Read(1, Some(vec![1, 2]))]),
            committed(vec![Read(1, Some(vec![2]))]),
        ];
        assert!(has(&incompatible, "incompatible order"));
        // T0 and T1 each append to keys 1 and 2 in opposite orders: a write cycle.
        let g0 = vec![
            committed(vec![Append(1, 1), Append(2, 4)]),
            committed(vec![Append(1, 2), Append(2, 3)]),
            committed(vec![Read(1, Some(vec![1, 2])), Read(2, Some(vec![3, 4]))]),
        ];
        assert!(has(&g0, "G0"));
        // Each reads the other's append: circular information flow.
        let g1c = vec![committed(vec![Append(1, 1), Read(2, Some(vec![2]))]), committed(vec![Append(2, 2), Read(1, Some(vec![1]))])];
        assert!(has(&g1c, "G1c"));
        let internal = vec![committed(vec![Append(1, 1), Read(1, Some(vec![]))])];
        assert!(has(&internal, "internal"));
        assert!(has(&[committed(vec![Read(1, Some(vec![9]))])], "garbage"));
        // Write skew (two read-write edges) is snapshot isolation's to allow.
        let skew = vec![
            committed(vec![Read(1, Some(vec![])), Read(2, Some(vec![])), Append(1, 1)]),
            committed(vec![Read(1, Some(vec![])), Read(2, Some(vec![])), Append(2, 2)]),
            committed(vec![Read(1, Some(vec![1])), Read(2, Some(vec![2]))]),
        ];
        assert_eq!(check(&skew), Vec::<String>::new());
    }
}
