//! Any bytes as the body of an OP_MSG, the way every command reaches the server: the wire
//! crate's BSON checks never panic, accept nothing the bson crate refuses, and a document
//! they accept encodes to bytes that decode and encode again to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

const MESSAGE_BYTES_MAX: usize = 48_000_000;

fn frame(body: &[u8]) -> Vec<u8> {
    let len = (shoal_wire::HEADER_SIZE_BYTES + 5 + body.len()) as i32;
    let mut f = Vec::with_capacity(len as usize);
    for v in [len, 1, 0, shoal_wire::OP_MSG] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.extend_from_slice(&0u32.to_le_bytes());
    f.push(0);
    f.extend_from_slice(body);
    f
}

fn body(frame: &[u8]) -> Option<bson::Document> {
    match shoal_wire::decode(frame, MESSAGE_BYTES_MAX).ok()?.message {
        shoal_wire::Message::Msg(m) => Some(m.body),
        _ => None,
    }
}

fuzz_target!(|bytes: &[u8]| {
    let Some(doc) = body(&frame(bytes)) else { return };
    assert!(bson::Document::from_reader(bytes).is_ok(), "accepted a body the bson crate refuses");
    let encoded = doc.to_vec().expect("a decoded document encodes");
    let again = body(&frame(&encoded)).expect("an encoded document decodes");
    assert!(again.to_vec().expect("encodes") == encoded, "decode and encode are not stable");
});
