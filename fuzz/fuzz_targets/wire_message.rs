//! Any bytes as one wire-protocol frame (OP_MSG, OP_QUERY, OP_REPLY, OP_COMPRESSED with
//! each compressor): decoding never panics, and a decoded OP_MSG encodes back to a frame
//! that decodes and encodes to the same bytes. The raw readers (`with_raw_msg`, `msg_command_into`)
//! never panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// MongoDB's maxMessageSizeBytes.
const MESSAGE_BYTES_MAX: usize = 48_000_000;

fuzz_target!(|frame: &[u8]| {
    if let Ok(decoded) = shoal_wire::decode(frame, MESSAGE_BYTES_MAX) {
        if let shoal_wire::Message::Msg(msg) = &decoded.message {
            // Encoded without a checksum: the flag is the sender's choice, not the message's.
            let mut plain = msg.clone();
            plain.flags &= !shoal_wire::flags::CHECKSUM_PRESENT;
            if let Ok(again) = shoal_wire::try_encode_msg(decoded.header.request_id, decoded.header.response_to, &plain, None) {
                let back = shoal_wire::decode(&again, MESSAGE_BYTES_MAX).expect("an encoded OP_MSG decodes");
                // Compared as bytes: a NaN is not equal to itself.
                let shoal_wire::Message::Msg(back) = back.message else { panic!("an OP_MSG decoded as another op") };
                let twice = shoal_wire::try_encode_msg(decoded.header.request_id, decoded.header.response_to, &back, None).expect("encodes again");
                assert!(twice == again, "an OP_MSG does not survive decode and encode");
            }
        }
    }
    let _ = shoal_wire::with_raw_msg(frame, MESSAGE_BYTES_MAX, |_, _, body| Ok(body.as_bytes().len()));
    let mut command = Vec::new();
    let _ = shoal_wire::msg_command_into(&mut command, frame);
});
