//! The error labels mongod adds to a reply, which drivers act on: `RetryableWriteError` on a
//! retryable write that failed (or whose write concern failed) with an error that says the
//! server's role changed or the network failed, so the driver sends it again;
//! `ResumableChangeStreamError` on a change stream's aggregate or getMore that failed so,
//! so the driver resumes the stream.

use bson::{Bson, Document};

/// The codes of mongod's RetriableError category the retryable writes specification lists.
pub const RETRYABLE_CODES: [i32; 12] = [11600, 11602, 10107, 13435, 13436, 189, 91, 7, 6, 89, 9001, 262];

/// Codes after which a transaction may be run again from its start (mongod's
/// `isTransientTransactionError`, beside NoSuchTransaction and the retryable codes):
/// WriteConflict, LockTimeout, PreparedTransactionInProgress, the snapshot errors and the
/// routing ones.
pub const TRANSIENT_TRANSACTION_CODES: [i32; 9] = [112, 24, 267, 239, 246, 13388, 249, 63, 150];

const NO_SUCH_TRANSACTION: i32 = 251;

/// Codes after which a change stream resumes (mongod's `isResumableChangeStreamError`):
/// the retryable ones, the routing ones (StaleConfig, StaleShardVersion, StaleEpoch),
/// RetryChangeStream and FailedToSatisfyReadPreference.
pub const RESUMABLE_CHANGE_STREAM_CODES: [i32; 5] = [13388, 63, 150, 234, 133];

/// ChangeStreamFatalError: the stream cannot go on (mongod labels it
/// `NonResumableChangeStreamError`).
const CHANGE_STREAM_FATAL_ERROR: i32 = 280;

/// What a command is, for its error labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Other,
    /// A write command with a `txnNumber` outside a transaction.
    RetryableWrite,
    /// A statement of a transaction (`autocommit: false`); `ends`: commitTransaction or
    /// abortTransaction.
    Transaction {
        ends: bool,
    },
    /// A change stream's aggregate (`$changeStream` first) or getMore.
    ChangeStream,
}

/// What the command `name` with `body` is, for its labels.
pub fn kind(name: &str, body: &Document) -> Kind {
    let ends = matches!(name, "commitTransaction" | "abortTransaction");
    if body.contains_key("autocommit") || ends {
        return Kind::Transaction { ends };
    }
    match name {
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" if body.contains_key("txnNumber") => Kind::RetryableWrite,
        "aggregate" if opens_change_stream(body) => Kind::ChangeStream,
        _ => Kind::Other,
    }
}

/// Whether an aggregate's pipeline starts with `$changeStream`.
pub fn opens_change_stream(body: &Document) -> bool {
    let first = body.get_array("pipeline").ok().and_then(|p| p.first()).and_then(Bson::as_document);
    first.is_some_and(|s| s.contains_key("$changeStream"))
}

fn code_of(d: &Document) -> Option<i32> {
    match d.get("code") {
        Some(Bson::Int32(c)) => Some(*c),
        Some(Bson::Int64(c)) => i32::try_from(*c).ok(),
        _ => None,
    }
}

/// Put the reply's `errorLabels`: `given` when a fail point names them, else what mongod
/// adds (`error_labels.cpp`): `TransientTransactionError` to a transaction's statement that
/// failed with a transient, retryable or NoSuchTransaction error (to a commit or abort only
/// for the transient ones, and NoSuchTransaction without a write concern error), and
/// `RetryableWriteError` to a retryable write, commit or abort whose error or write concern
/// error is retryable. A reply that succeeded without a write concern error is left as it is.
pub fn apply(kind: Kind, reply: &mut Document, given: Option<Vec<Bson>>) {
    if let Some(labels) = given {
        reply.remove("errorLabels");
        if !labels.is_empty() {
            reply.insert("errorLabels", labels);
        }
        return;
    }
    let ok = matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0) || matches!(reply.get("ok"), Some(Bson::Int32(1)));
    let wce = reply.get_document("writeConcernError").ok().and_then(code_of);
    if (ok && wce.is_none()) || kind == Kind::Other {
        return;
    }
    let code = if ok { None } else { code_of(reply) };
    let retryable = code.into_iter().chain(wce).any(|c| RETRYABLE_CODES.contains(&c));
    let label = match kind {
        Kind::Transaction { ends } => {
            let transient = code.is_some_and(|c| TRANSIENT_TRANSACTION_CODES.contains(&c))
                || match ends {
                    true => code == Some(NO_SUCH_TRANSACTION) && wce.is_none(),
                    false => code.is_some_and(|c| RETRYABLE_CODES.contains(&c) || c == NO_SUCH_TRANSACTION),
                };
            match (transient, ends && retryable) {
                (true, _) => Some("TransientTransactionError"),
                (false, true) => Some("RetryableWriteError"),
                (false, false) => None,
            }
        }
        Kind::RetryableWrite if retryable => Some("RetryableWriteError"),
        Kind::ChangeStream if wce.is_none() && code.is_some_and(|c| RETRYABLE_CODES.contains(&c) || RESUMABLE_CHANGE_STREAM_CODES.contains(&c)) => {
            Some("ResumableChangeStreamError")
        }
        Kind::ChangeStream if code == Some(CHANGE_STREAM_FATAL_ERROR) => Some("NonResumableChangeStreamError"),
        _ => None,
    };
    if let Some(label) = label {
        let mut labels = match reply.remove("errorLabels") {
            Some(Bson::Array(a)) => a,
            _ => Vec::new(),
        };
        if !labels.iter().any(|l| l.as_str() == Some(label)) {
            labels.push(Bson::String(label.into()));
        }
        reply.insert("errorLabels", labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn retryable_write_errors_get_the_label() {
        let insert = doc! {"insert": "c", "txnNumber": 1i64};
        let mut r = doc! {"ok": 0.0, "code": 91};
        apply(kind("insert", &insert), &mut r, None);
        assert_eq!(r.get_array("errorLabels").unwrap(), &vec![Bson::String("RetryableWriteError".into())]);
        let mut r = doc! {"ok": 1.0, "n": 1, "writeConcernError": {"code": 11602}};
        apply(kind("insert", &insert), &mut r, None);
        assert!(r.contains_key("errorLabels"));
        let mut r = doc! {"ok": 0.0, "code": 2};
        apply(kind("insert", &insert), &mut r, None);
        assert!(!r.contains_key("errorLabels"));
        let mut r = doc! {"ok": 0.0, "code": 91};
        apply(kind("insert", &doc! {"insert": "c"}), &mut r, None);
        assert!(!r.contains_key("errorLabels"), "not a retryable write without txnNumber");
        let mut r = doc! {"ok": 0.0, "code": 91};
        apply(Kind::Other, &mut r, Some(vec![Bson::String("X".into())]));
        assert_eq!(r.get_array("errorLabels").unwrap().len(), 1);
    }

    #[test]
    fn transaction_errors_get_mongods_labels() {
        let labels = |name: &str, body: Document, mut r: Document| {
            apply(kind(name, &body), &mut r, None);
            r.get_array("errorLabels").map(|a| a.iter().filter_map(|l| l.as_str().map(String::from)).collect::<Vec<_>>()).unwrap_or_default()
        };
        let stmt = doc! {"insert": "c", "txnNumber": 1i64, "autocommit": false};
        assert_eq!(labels("insert", stmt.clone(), doc! {"ok": 0.0, "code": 112}), ["TransientTransactionError"]);
        assert_eq!(labels("insert", stmt.clone(), doc! {"ok": 0.0, "code": 10107}), ["TransientTransactionError"]);
        assert!(labels("insert", stmt.clone(), doc! {"ok": 0.0, "code": 11000}).is_empty());
        let commit = doc! {"commitTransaction": 1, "txnNumber": 1i64, "autocommit": false};
        assert_eq!(labels("commitTransaction", commit.clone(), doc! {"ok": 0.0, "code": 251}), ["TransientTransactionError"]);
        assert_eq!(labels("commitTransaction", commit.clone(), doc! {"ok": 0.0, "code": 91}), ["RetryableWriteError"]);
        assert!(labels("commitTransaction", commit.clone(), doc! {"ok": 0.0, "code": 251, "writeConcernError": {"code": 64}}).is_empty());
        assert!(labels("insert", stmt, doc! {"ok": 1.0, "writeConcernError": {"code": 91}}).is_empty());
    }
}
