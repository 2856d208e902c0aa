//! The error labels mongod adds to a reply, which drivers act on: `RetryableWriteError` on a
//! retryable write that failed (or whose write concern failed) with an error that says the
//! server's role changed or the network failed, so the driver sends it again.

use bson::{Bson, Document};

/// The codes of mongod's RetriableError category the retryable writes specification lists.
pub const RETRYABLE_CODES: [i32; 12] = [11600, 11602, 10107, 13435, 13436, 189, 91, 7, 6, 89, 9001, 262];

/// A retryable write: a write command with a `txnNumber` outside a transaction, or the end
/// of a transaction.
pub fn is_retryable_write(name: &str, body: &Document) -> bool {
    match name {
        "commitTransaction" | "abortTransaction" => true,
        "insert" | "update" | "delete" | "findAndModify" | "findandmodify" => body.contains_key("txnNumber") && !body.contains_key("autocommit"),
        _ => false,
    }
}

fn code_of(d: &Document) -> Option<i32> {
    match d.get("code") {
        Some(Bson::Int32(c)) => Some(*c),
        Some(Bson::Int64(c)) => i32::try_from(*c).ok(),
        _ => None,
    }
}

/// Put the reply's `errorLabels`: `given` when a fail point names them, else what mongod
/// adds to the reply of a command that is (`retryable_write`) or is not a retryable write.
/// A reply that succeeded without a write concern error is left as it is.
pub fn apply(retryable_write: bool, reply: &mut Document, given: Option<Vec<Bson>>) {
    if let Some(labels) = given {
        reply.remove("errorLabels");
        if !labels.is_empty() {
            reply.insert("errorLabels", labels);
        }
        return;
    }
    let ok = matches!(reply.get("ok"), Some(Bson::Double(v)) if *v == 1.0) || matches!(reply.get("ok"), Some(Bson::Int32(1)));
    let wce = reply.get_document("writeConcernError").ok().and_then(code_of);
    if (ok && wce.is_none()) || !retryable_write {
        return;
    }
    let code = if ok { None } else { code_of(reply) };
    let retryable = code.into_iter().chain(wce).any(|c| RETRYABLE_CODES.contains(&c));
    if retryable {
        let mut labels = match reply.remove("errorLabels") {
            Some(Bson::Array(a)) => a,
            _ => Vec::new(),
        };
        if !labels.iter().any(|l| l.as_str() == Some("RetryableWriteError")) {
            labels.push(Bson::String("RetryableWriteError".into()));
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
        apply(is_retryable_write("insert", &insert), &mut r, None);
        assert_eq!(r.get_array("errorLabels").unwrap(), &vec![Bson::String("RetryableWriteError".into())]);
        let mut r = doc! {"ok": 1.0, "n": 1, "writeConcernError": {"code": 11602}};
        apply(is_retryable_write("insert", &insert), &mut r, None);
        assert!(r.contains_key("errorLabels"));
        let mut r = doc! {"ok": 0.0, "code": 2};
        apply(is_retryable_write("insert", &insert), &mut r, None);
        assert!(!r.contains_key("errorLabels"));
        let mut r = doc! {"ok": 0.0, "code": 91};
        apply(is_retryable_write("insert", &doc! {"insert": "c"}), &mut r, None);
        assert!(!r.contains_key("errorLabels"), "not a retryable write without txnNumber");
        let mut r = doc! {"ok": 0.0, "code": 91};
        apply(false, &mut r, Some(vec![Bson::String("X".into())]));
        assert_eq!(r.get_array("errorLabels").unwrap().len(), 1);
    }
}
