//! Direct BSON encoding into a caller's (pre-sized) buffer, byte-identical to the bson
//! crate's. The insert path encodes every record and one `{"0": v0, "1": v1, ..}` value
//! document per index entry; building a `Document` for each of those (a hash map with
//! per-instance random state, plus string keys) or growing a buffer from empty costs more
//! than the encoding itself.

use bson::spec::BinarySubtype;
use bson::{Bson, Document};

/// Encode `d`; `capacity_bytes` sizes the buffer (e.g. the previous record's size). Errors
/// on a field name containing NUL, which BSON cannot represent.
pub fn encode_document(d: &Document, capacity_bytes: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(capacity_bytes.max(5));
    append_document(d, &mut out)?;
    Ok(out)
}

/// Append the BSON document `{"0": values[0], "1": values[1], ..}` to `out`.
pub fn append_values_doc<'a>(values: impl IntoIterator<Item = &'a Bson>, out: &mut Vec<u8>) -> Result<(), String> {
    let start = begin(out);
    for (i, v) in values.into_iter().enumerate() {
        out.push(v.element_type() as u8);
        append_index_name(i, out);
        out.push(0);
        append_value(v, out)?;
    }
    end(out, start);
    Ok(())
}

pub(crate) fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

/// Terminate the document begun at `start` and write its length.
pub(crate) fn end(out: &mut Vec<u8>, start: usize) {
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

fn append_document(d: &Document, out: &mut Vec<u8>) -> Result<(), String> {
    let start = begin(out);
    for (k, v) in d {
        if k.as_bytes().contains(&0) {
            return Err(format!("field name contains a NUL byte: {k:?}"));
        }
        out.push(v.element_type() as u8);
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        append_value(v, out)?;
    }
    end(out, start);
    Ok(())
}

fn append_index_name(mut i: usize, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (i % 10) as u8;
        n += 1;
        i /= 10;
        if i == 0 {
            break;
        }
    }
    out.extend(digits[..n].iter().rev());
}

pub(crate) fn append_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&((s.len() + 1) as i32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// Append the value bytes of `v` (the element without its type byte and name).
pub fn append_value(v: &Bson, out: &mut Vec<u8>) -> Result<(), String> {
    match v {
        Bson::Document(d) => append_document(d, out)?,
        Bson::Array(a) => {
            let start = begin(out);
            for (i, e) in a.iter().enumerate() {
                out.push(e.element_type() as u8);
                append_index_name(i, out);
                out.push(0);
                append_value(e, out)?;
            }
            end(out, start);
        }
        Bson::JavaScriptCodeWithScope(c) => {
            let start = out.len();
            out.extend_from_slice(&[0; 4]);
            append_string(&c.code, out);
            append_document(&c.scope, out)?;
            let len = (out.len() - start) as i32;
            out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        }
        Bson::Binary(b) => {
            // The deprecated subtype 2 repeats the length inside the payload.
            let old = b.subtype == BinarySubtype::BinaryOld;
            let len = b.bytes.len() + if old { 4 } else { 0 };
            out.extend_from_slice(&(len as i32).to_le_bytes());
            out.push(u8::from(b.subtype));
            if old {
                out.extend_from_slice(&(b.bytes.len() as i32).to_le_bytes());
            }
            out.extend_from_slice(&b.bytes);
        }
        Bson::Double(d) => out.extend_from_slice(&d.to_le_bytes()),
        Bson::String(s) | Bson::JavaScriptCode(s) | Bson::Symbol(s) => append_string(s, out),
        Bson::ObjectId(o) => out.extend_from_slice(&o.bytes()),
        Bson::Boolean(b) => out.push(*b as u8),
        Bson::DateTime(d) => out.extend_from_slice(&d.timestamp_millis().to_le_bytes()),
        Bson::Int32(i) => out.extend_from_slice(&i.to_le_bytes()),
        Bson::Int64(i) => out.extend_from_slice(&i.to_le_bytes()),
        Bson::Timestamp(t) => {
            out.extend_from_slice(&t.increment.to_le_bytes());
            out.extend_from_slice(&t.time.to_le_bytes());
        }
        Bson::Decimal128(d) => out.extend_from_slice(&d.bytes()),
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => {}
        Bson::RegularExpression(_) | Bson::DbPointer(_) => {
            // Rare (and DBPointer's fields are private): let the bson crate encode them.
            let mut d = Document::new();
            d.insert("", v.clone());
            let bytes = d.to_vec().map_err(|e| e.to_string())?;
            // Layout: i32 length, type byte, "" and its NUL, value, document NUL.
            if let Some(value) = bytes.get(6..bytes.len().saturating_sub(1)) {
                out.extend_from_slice(value);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    #[test]
    fn matches_the_bson_crate() {
        let values = vec![
            Bson::Double(1.5),
            Bson::String("a\0b".into()),
            bson!({"x": [1, {"y": null}]}),
            bson!([]),
            Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] }),
            Bson::Undefined,
            Bson::ObjectId(bson::oid::ObjectId::from_bytes([7; 12])),
            Bson::Boolean(true),
            Bson::DateTime(bson::DateTime::from_millis(-5)),
            Bson::Null,
            Bson::RegularExpression(bson::Regex { pattern: "^a".to_string().try_into().unwrap(), options: "i".to_string().try_into().unwrap() }),
            Bson::JavaScriptCode("f()".into()),
            Bson::Symbol("s".into()),
            Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope { code: "c".into(), scope: doc! {"a": 1} }),
            Bson::Int32(-3),
            Bson::Timestamp(bson::Timestamp { time: 9, increment: 4 }),
            Bson::Int64(1 << 40),
            Bson::Decimal128(bson::Decimal128::from_bytes([3; 16])),
            Bson::MinKey,
            Bson::MaxKey,
        ];
        let mut expected = Document::new();
        for (i, v) in values.iter().enumerate() {
            expected.insert(i.to_string(), v.clone());
        }
        let mut out = vec![9, 9];
        append_values_doc(&values, &mut out).unwrap();
        assert_eq!(&out[..2], &[9, 9]);
        assert_eq!(out[2..].to_vec(), expected.to_vec().unwrap());
        let mut empty = Vec::new();
        append_values_doc(&[], &mut empty).unwrap();
        assert_eq!(empty, Document::new().to_vec().unwrap());
        // Whole documents, nested, with every type, and any starting capacity.
        let nested = doc! {"_id": 1, "all": expected.clone(), "arr": [expected.clone(), [1, [2]], {}], "old": Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::BinaryOld, bytes: vec![5; 3] })};
        for cap in [0, 7, 10_000] {
            assert_eq!(encode_document(&nested, cap).unwrap(), nested.to_vec().unwrap());
        }
        assert_eq!(encode_document(&doc! {}, 0).unwrap(), doc! {}.to_vec().unwrap());
        assert!(encode_document(&doc! {"a\0b": 1}, 0).is_err());
        assert!(doc! {"a\0b": 1}.to_vec().is_err());
    }
}
