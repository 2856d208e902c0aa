//! `cargo fuzz run decode`: arbitrary bytes must never panic `wire::decode`, and whatever it
//! accepts must re-encode to a frame that decodes and re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::Message;

const MAX: usize = common::limits::MESSAGE_SIZE_MAX_BYTES;

fn encode(decoded: &wire::Decoded) -> Vec<u8> {
    let h = decoded.header;
    match &decoded.message {
        Message::Msg(m) => wire::encode_msg(h.request_id, h.response_to, m, decoded.compressor),
        Message::Reply(r) => wire::encode_reply(h.request_id, h.response_to, r, decoded.compressor),
        Message::Query(q) => wire::encode_query(h.request_id, q),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = wire::decode(data, MAX) else {
        return;
    };
    // Compare bytes, not values: a decoded NaN is never equal to itself.
    let first = encode(&decoded);
    let again = wire::decode(&first, MAX).expect("own encoding must decode");
    assert_eq!(encode(&again), first);
});
