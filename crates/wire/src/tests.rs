use super::*;
use bson::{doc, oid::ObjectId, spec::BinarySubtype, Binary, Bson, Decimal128, Regex, Timestamp};
use proptest::prelude::*;

const MAX: usize = limits::MESSAGE_SIZE_MAX_BYTES;

fn rich_document() -> Document {
    doc! {
        "double": 1.5,
        "string": "héllo",
        "doc": { "a": 1, "b": { "c": [1, 2, { "d": null }] } },
        "array": [1i64, "two", 3.0, [], {}],
        "binary": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] },
        "binary_old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![9, 8] },
        "uuid": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] },
        "undefined": Bson::Undefined,
        "oid": ObjectId::from_bytes([1; 12]),
        "bool": true,
        "date": bson::DateTime::from_millis(1_700_000_000_123),
        "null": Bson::Null,
        "regex": Bson::RegularExpression(Regex {
            pattern: "^a.*b$".to_string().try_into().unwrap(),
            options: "im".to_string().try_into().unwrap(),
        }),
        "code": Bson::JavaScriptCode("function() {}".into()),
        "symbol": Bson::Symbol("sym".into()),
        "code_w_scope": Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
            code: "x + 1".into(),
            scope: doc! { "x": 1 },
        }),
        "int32": 42,
        "ts": Timestamp { time: 7, increment: 9 },
        "int64": -5i64,
        "decimal": Decimal128::from_bytes([3; 16]),
        "min": Bson::MinKey,
        "max": Bson::MaxKey,
        "big_array": (0..123).map(Bson::Int32).collect::<Vec<_>>(),
    }
}

fn sample_msg(flags: u32) -> OpMsg {
    OpMsg {
        flags,
        body: doc! { "insert": "coll", "$db": "test", "ordered": true },
        sequences: vec![
            DocumentSequence { identifier: "documents".into(), documents: vec![rich_document(), doc! { "_id": 2 }] },
            DocumentSequence { identifier: "empty".into(), documents: vec![] },
        ],
    }
}

fn sample_query() -> OpQuery {
    OpQuery {
        flags: 4,
        full_collection_name: "admin.$cmd".into(),
        number_to_skip: 0,
        number_to_return: -1,
        query: doc! { "isMaster": 1, "client": { "driver": { "name": "x" } } },
        return_fields_selector: Some(doc! { "a": 1 }),
    }
}

fn sample_reply() -> OpReply {
    OpReply { response_flags: 8, cursor_id: 1234567890123, starting_from: 3, documents: vec![rich_document(), doc! {}] }
}

fn compressors() -> Vec<Option<Compressor>> {
    std::iter::once(None).chain(Compressor::ALL.into_iter().map(Some)).collect()
}

/// Every valid frame the tests use: all message types, all compressors, with and without CRC.
fn valid_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for c in compressors() {
        frames.push(encode_msg(1, 2, &sample_msg(0), c));
        frames.push(encode_msg(1, 2, &sample_msg(flags::CHECKSUM_PRESENT | flags::EXHAUST_ALLOWED), c));
        frames.push(encode_reply(3, 4, &sample_reply(), c));
    }
    frames.push(encode_query(5, &sample_query()));
    frames.push(encode_query(5, &OpQuery { return_fields_selector: None, ..sample_query() }));
    frames
}

fn code_of<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.expect_err("expected an error").code
}

#[test]
fn round_trip_every_message_type_with_every_compressor() {
    for c in compressors() {
        for msg_flags in [0, flags::CHECKSUM_PRESENT, flags::MORE_TO_COME | flags::EXHAUST_ALLOWED] {
            let msg = sample_msg(msg_flags);
            let frame = encode_msg(11, 22, &msg, c);
            let decoded = decode(&frame, MAX).unwrap();
            assert_eq!(decoded.message, Message::Msg(msg.clone()), "compressor {c:?}");
            assert_eq!(decoded.compressor, c);
            assert_eq!(decoded.header.request_id, 11);
            assert_eq!(decoded.header.response_to, 22);
            assert_eq!(decoded.header.op_code, OP_MSG);
            let wire_op = Header::parse(&frame).unwrap().op_code;
            assert_eq!(wire_op, if c.is_some() { OP_COMPRESSED } else { OP_MSG });
        }
        let reply = sample_reply();
        let decoded = decode(&encode_reply(5, 6, &reply, c), MAX).unwrap();
        assert_eq!(decoded.message, Message::Reply(reply));
        assert_eq!(decoded.compressor, c);
        assert_eq!(decoded.header.op_code, OP_REPLY);
    }
    for q in [sample_query(), OpQuery { return_fields_selector: None, ..sample_query() }] {
        let frame = encode_query(9, &q);
        let decoded = decode(&frame, MAX).unwrap();
        assert_eq!(decoded.message, Message::Query(q));
        assert_eq!(decoded.header, Header { message_length: frame.len() as i32, request_id: 9, response_to: 0, op_code: OP_QUERY });
    }
}

#[test]
fn compressed_query_round_trips() {
    // OP_QUERY wrapped in OP_COMPRESSED by hand (encode_query is never compressed).
    let plain = encode_query(9, &sample_query());
    let wrapped = maybe_compress(plain, Some(Compressor::Zlib));
    let decoded = decode(&wrapped, MAX).unwrap();
    assert_eq!(decoded.message, Message::Query(sample_query()));
    assert_eq!(decoded.compressor, Some(Compressor::Zlib));
}

#[test]
fn encoder_matches_bson_crate_bytes_and_size() {
    let d = rich_document();
    let mut mine = Vec::new();
    bson_codec::write_document(&mut mine, &d).unwrap();
    assert_eq!(mine, d.to_vec().unwrap());
    assert_eq!(document_size_bytes(&d), mine.len());
    let frame = encode_msg(1, 0, &sample_msg(flags::CHECKSUM_PRESENT), None);
    // Pre-sizing was exact: the frame never had to grow.
    let msg = sample_msg(flags::CHECKSUM_PRESENT);
    let expected = 16
        + 4
        + 1
        + document_size_bytes(&msg.body)
        + msg.sequences.iter().map(|s| 5 + s.identifier.len() + 1 + s.documents.iter().map(document_size_bytes).sum::<usize>()).sum::<usize>()
        + 4;
    assert_eq!(frame.len(), expected);
}

#[test]
fn op_msg_layout_is_exactly_the_spec() {
    let msg = OpMsg { flags: 0, body: doc! { "ping": 1 }, sequences: vec![] };
    let frame = encode_msg(7, 0, &msg, None);
    let body = doc! { "ping": 1 }.to_vec().unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&((16 + 4 + 1 + body.len()) as i32).to_le_bytes());
    expected.extend_from_slice(&7i32.to_le_bytes());
    expected.extend_from_slice(&0i32.to_le_bytes());
    expected.extend_from_slice(&OP_MSG.to_le_bytes());
    expected.extend_from_slice(&0u32.to_le_bytes());
    expected.push(0);
    expected.extend_from_slice(&body);
    assert_eq!(frame, expected);
}

#[test]
fn checksum_is_crc32c_over_everything_before_it() {
    let frame = encode_msg(1, 0, &sample_msg(flags::CHECKSUM_PRESENT), None);
    let n = frame.len();
    let stored = u32::from_le_bytes(frame[n - 4..].try_into().unwrap());
    assert_eq!(stored, crc32c::crc32c(&frame[..n - 4]));
}

#[test]
fn checksum_mismatch_is_rejected() {
    for c in compressors() {
        let frame = encode_msg(1, 0, &sample_msg(flags::CHECKSUM_PRESENT), c);
        if c.is_none() {
            // Flip a byte inside the body, then one inside the checksum itself.
            for at in [40, frame.len() - 1] {
                let mut bad = frame.clone();
                bad[at] ^= 0x01;
                assert_eq!(code_of(decode(&bad, MAX)), Code::ChecksumMismatch.0, "byte {at}");
            }
        }
    }
    // Compressed: corrupt the checksum inside the uncompressed payload, then recompress.
    let mut plain = encode_msg(1, 0, &sample_msg(flags::CHECKSUM_PRESENT), None);
    let last = plain.len() - 1;
    plain[last] ^= 0x80;
    let wrapped = maybe_compress(plain, Some(Compressor::Snappy));
    assert_eq!(code_of(decode(&wrapped, MAX)), Code::ChecksumMismatch.0);
}

#[test]
fn every_truncation_is_an_error() {
    for frame in valid_frames() {
        assert!(decode(&frame, MAX).is_ok());
        for len in 0..frame.len() {
            let cut = &frame[..len];
            assert!(decode(cut, MAX).is_err(), "truncated to {len} of {}", frame.len());
            // Also with the header length patched to match, so the inner parsers see the cut.
            if len >= 4 {
                let mut patched = cut.to_vec();
                patched[0..4].copy_from_slice(&(len as i32).to_le_bytes());
                let _ = decode(&patched, MAX); // may legitimately succeed (a dropped section)
            }
        }
    }
}

#[test]
fn truncated_single_body_op_msg_with_patched_length_is_an_error() {
    let frame = encode_msg(1, 0, &OpMsg { flags: 0, body: rich_document(), sequences: vec![] }, None);
    for len in 16..frame.len() {
        let mut patched = frame[..len].to_vec();
        patched[0..4].copy_from_slice(&(len as i32).to_le_bytes());
        assert!(decode(&patched, MAX).is_err(), "len {len}");
    }
}

#[test]
fn length_prefix_bounds() {
    assert_eq!(frame_length(16i32.to_le_bytes(), MAX).unwrap(), 16);
    assert_eq!(frame_length((MAX as i32).to_le_bytes(), MAX).unwrap(), MAX);
    for bad in [15i32, 0, -1, i32::MIN, MAX as i32 + 1, i32::MAX] {
        assert_eq!(code_of(frame_length(bad.to_le_bytes(), MAX)), Code::ProtocolError.0, "{bad}");
    }
    let msg = encode_msg(1, 0, &sample_msg(0), None);
    assert!(decode(&msg, msg.len()).is_ok());
    assert_eq!(code_of(decode(&msg, msg.len() - 1)), Code::ProtocolError.0);
    // Header length disagreeing with the frame.
    let mut longer = msg.clone();
    longer.push(0);
    assert_eq!(code_of(decode(&longer, MAX)), Code::ProtocolError.0);
}

fn compressed_frame(original_op: i32, uncompressed_size: i32, id: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Header { message_length: 0, request_id: 1, response_to: 0, op_code: OP_COMPRESSED }.to_bytes().to_vec();
    f.extend_from_slice(&original_op.to_le_bytes());
    f.extend_from_slice(&uncompressed_size.to_le_bytes());
    f.push(id);
    f.extend_from_slice(payload);
    let len = f.len() as i32;
    f[0..4].copy_from_slice(&len.to_le_bytes());
    f
}

#[test]
fn decompression_bombs_are_rejected() {
    // Claimed size beyond the limit: refused before any decompression or allocation.
    for claimed in [i32::MAX, -1, (MAX - 16 + 1) as i32] {
        let f = compressed_frame(OP_MSG, claimed, Compressor::Zstd.id(), &[0; 8]);
        let e = decode(&f, MAX).unwrap_err();
        assert_eq!(e.code, Code::BadValue.0);
        assert!(e.message.contains("larger than maximum message size"), "{}", e.message);
    }
    // A real bomb: 40 MB of zeros compress to almost nothing; the claimed size is small.
    let zeros = vec![0u8; 40_000_000];
    for c in [Compressor::Zstd, Compressor::Zlib, Compressor::Snappy] {
        let bomb = compress(c, &zeros).unwrap();
        assert!(bomb.len() < 4_000_000, "{c:?}");
        let f = compressed_frame(OP_MSG, 1000, c.id(), &bomb);
        assert_eq!(code_of(decode(&f, MAX)), Code::BadValue.0, "{c:?}");
        // And the public helper never returns more than asked for.
        assert!(decompress(c, &bomb, 1000).is_err());
    }
    // Claimed size within limits but payload shorter than claimed.
    let small = compress(Compressor::Zlib, b"abc").unwrap();
    assert_eq!(code_of(decode(&compressed_frame(OP_MSG, 4, 2, &small), MAX)), Code::BadValue.0);
    assert_eq!(code_of(decode(&compressed_frame(OP_MSG, 4, 0, b"abc"), MAX)), Code::BadValue.0);
}

#[test]
fn compression_header_errors() {
    // Compression header one byte short (no compressor id).
    let mut short = compressed_frame(OP_MSG, 0, 0, &[]);
    short.pop();
    short[0..4].copy_from_slice(&24i32.to_le_bytes());
    assert_eq!(code_of(decode(&short, MAX)), Code::BadValue.0);
    assert_eq!(code_of(decode(&compressed_frame(OP_MSG, 3, 9, b"abc"), MAX)), Code::InternalError.0);
    let nested = compressed_frame(OP_COMPRESSED, 3, 0, b"abc");
    assert_eq!(code_of(decode(&nested, MAX)), Code::ProtocolError.0);
    assert_eq!(code_of(decode(&compressed_frame(2002, 3, 0, b"abc"), MAX)), Code::ProtocolError.0);
}

#[test]
fn compress_decompress_helpers_round_trip() {
    let data: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
    for c in Compressor::ALL {
        let packed = compress(c, &data).unwrap();
        assert_eq!(decompress(c, &packed, data.len()).unwrap(), data, "{c:?}");
        assert!(decompress(c, &packed, data.len() + 1).is_err(), "{c:?} longer");
        assert!(decompress(c, &packed, data.len() - 1).is_err(), "{c:?} shorter");
        if c != Compressor::Noop {
            assert!(packed.len() < data.len(), "{c:?} should compress");
        }
    }
    for c in Compressor::ALL {
        assert_eq!(decompress(c, &compress(c, &[]).unwrap(), 0).unwrap(), Vec::<u8>::new());
    }
}

#[test]
fn compressor_names_and_ids() {
    for c in Compressor::ALL {
        assert_eq!(Compressor::from_name(c.name()), Some(c));
        assert_eq!(Compressor::from_id(c as u8), Some(c));
    }
    assert_eq!(Compressor::from_name("snappy"), Some(Compressor::Snappy));
    assert_eq!(Compressor::Zstd as u8, 3);
    assert_eq!(Compressor::from_name("lz4"), None);
    assert_eq!(Compressor::from_id(4), None);
}

#[test]
fn uncompressible_commands() {
    for name in [
        "hello",
        "isMaster",
        "saslStart",
        "saslContinue",
        "getnonce",
        "authenticate",
        "createUser",
        "updateUser",
        "copydbSaslStart",
        "copydbgetnonce",
        "copydb",
    ] {
        assert!(!is_compressible_command(name), "{name}");
    }
    for name in ["find", "insert", "ping", "aggregate"] {
        assert!(is_compressible_command(name), "{name}");
    }
}

/// Raw OP_MSG from flag bits and pre-encoded section bytes.
fn raw_msg(flag_bits: u32, sections: &[u8]) -> Vec<u8> {
    let mut f = Header { message_length: 0, request_id: 1, response_to: 0, op_code: OP_MSG }.to_bytes().to_vec();
    f.extend_from_slice(&flag_bits.to_le_bytes());
    f.extend_from_slice(sections);
    let len = f.len() as i32;
    f[0..4].copy_from_slice(&len.to_le_bytes());
    f
}

fn body_section(d: &Document) -> Vec<u8> {
    let mut s = vec![0u8];
    s.extend_from_slice(&d.to_vec().unwrap());
    s
}

fn sequence_section(identifier: &str, docs: &[Document]) -> Vec<u8> {
    let mut payload = identifier.as_bytes().to_vec();
    payload.push(0);
    for d in docs {
        payload.extend_from_slice(&d.to_vec().unwrap());
    }
    let mut s = vec![1u8];
    s.extend_from_slice(&((payload.len() + 4) as i32).to_le_bytes());
    s.extend_from_slice(&payload);
    s
}

#[test]
fn op_msg_section_rules() {
    let body = body_section(&doc! { "insert": "c", "$db": "d" });
    let seq = sequence_section("documents", &[doc! { "a": 1 }]);
    let ok = raw_msg(0, &[seq.clone(), body.clone()].concat());
    assert!(decode(&ok, MAX).is_ok(), "sequence may precede body");

    assert_eq!(code_of(decode(&raw_msg(0, &[body.clone(), body.clone()].concat()), MAX)), 40430);
    assert_eq!(code_of(decode(&raw_msg(0, &seq), MAX)), 40587);
    assert_eq!(code_of(decode(&raw_msg(0, &[]), MAX)), 40587);
    assert_eq!(code_of(decode(&raw_msg(0, &[body.clone(), seq.clone(), seq.clone()].concat()), MAX)), 40431);
    let three = [body.clone(), sequence_section("a", &[]), sequence_section("b", &[]), sequence_section("c", &[])].concat();
    assert_eq!(code_of(decode(&raw_msg(0, &three), MAX)), Code::TooManyDocumentSequences.0);
    assert_eq!(code_of(decode(&raw_msg(0, &[body.clone(), vec![2, b'x', 0]].concat()), MAX)), Code::Unauthorized.0);
    assert_eq!(code_of(decode(&raw_msg(0, &[body.clone(), vec![7]].concat()), MAX)), 40432);
    let e = decode(&raw_msg(0, &[body.clone(), vec![7]].concat()), MAX).unwrap_err();
    assert_eq!(e.code_name, "Location40432");
    // Field present both in body and as a sequence.
    let clash = [body_section(&doc! { "documents": [], "$db": "d" }), seq.clone()].concat();
    assert_eq!(code_of(decode(&raw_msg(0, &clash), MAX)), 40433);
    let dotted = [body_section(&doc! { "a": { "b": 1 } }), sequence_section("a.b", &[])].concat();
    assert_eq!(code_of(decode(&raw_msg(0, &dotted), MAX)), 40433);
    // Sequence size that runs past the message, or too small to hold an identifier.
    let mut long = seq.clone();
    long[1..5].copy_from_slice(&1000i32.to_le_bytes());
    assert!(decode(&raw_msg(0, &[body.clone(), long].concat()), MAX).is_err());
    let mut tiny = seq.clone();
    tiny[1..5].copy_from_slice(&4i32.to_le_bytes());
    assert!(decode(&raw_msg(0, &[body.clone(), tiny].concat()), MAX).is_err());
    // Trailing garbage after the last section.
    assert!(decode(&raw_msg(0, &[body.clone(), vec![0, 1]].concat()), MAX).is_err());
}

#[test]
fn op_msg_flag_rules() {
    let body = body_section(&doc! { "ping": 1 });
    for bit in [2u32, 3, 8, 15] {
        let e = decode(&raw_msg(1 << bit, &body), MAX).unwrap_err();
        assert_eq!(e.code, Code::IllegalOpMsgFlag.0, "bit {bit}");
        assert!(e.message.starts_with("Message contains illegal flags value: Ob"));
    }
    // Optional (high) bits are ignored.
    for bit in [16u32, 17, 31] {
        let d = decode(&raw_msg(1 << bit, &body), MAX).unwrap();
        assert!(matches!(d.message, Message::Msg(m) if m.flags == 1 << bit));
    }
    // Checksum flag with no room for a checksum.
    assert_eq!(code_of(decode(&raw_msg(flags::CHECKSUM_PRESENT, &[0, 0, 0, 0]), MAX)), 51251);
}

#[test]
fn document_validation() {
    // Declared length larger than the 16 MiB + 16 KiB limit.
    let mut huge = vec![0u8];
    huge.extend_from_slice(&((DOCUMENT_SIZE_MAX_BYTES + 1) as i32).to_le_bytes());
    huge.push(0);
    let e = decode(&raw_msg(0, &huge), MAX).unwrap_err();
    assert_eq!(e.code, Code::BSONObjectTooLarge.0);
    assert!(e.message.contains("16793600"), "{}", e.message);
    // A document exactly at the limit is accepted.
    let filler = "x".repeat(DOCUMENT_SIZE_MAX_BYTES - (4 + 1 + 2 + 4 + 1 + 1));
    let at_limit = doc! { "s": filler };
    assert_eq!(document_size_bytes(&at_limit), DOCUMENT_SIZE_MAX_BYTES);
    assert!(decode(&raw_msg(0, &body_section(&at_limit)), MAX).is_ok());

    // Invalid UTF-8 in a string.
    let mut bad_utf8 = doc! { "s": "ab" }.to_vec().unwrap();
    let at = bad_utf8.len() - 3;
    bad_utf8[at] = 0xff;
    assert_eq!(code_of(decode(&raw_msg(0, &[vec![0], bad_utf8].concat()), MAX)), Code::InvalidBSON.0);
    // Unknown element type.
    let mut bad_type = doc! { "a": 1 }.to_vec().unwrap();
    bad_type[4] = 0x42;
    assert_eq!(code_of(decode(&raw_msg(0, &[vec![0], bad_type].concat()), MAX)), Code::InvalidBSON.0);
    // Boolean other than 0/1; missing EOO; string length past the end.
    let mut bad_bool = doc! { "a": true }.to_vec().unwrap();
    bad_bool[7] = 2;
    assert_eq!(code_of(decode(&raw_msg(0, &[vec![0], bad_bool].concat()), MAX)), Code::InvalidBSON.0);
    let mut no_eoo = doc! { "a": 1 }.to_vec().unwrap();
    let last = no_eoo.len() - 1;
    no_eoo[last] = 1;
    assert_eq!(code_of(decode(&raw_msg(0, &[vec![0], no_eoo].concat()), MAX)), Code::InvalidBSON.0);
    let mut long_str = doc! { "s": "ab" }.to_vec().unwrap();
    long_str[7..11].copy_from_slice(&100i32.to_le_bytes());
    assert_eq!(code_of(decode(&raw_msg(0, &[vec![0], long_str].concat()), MAX)), Code::InvalidBSON.0);
    // Too-small declared length.
    assert_eq!(code_of(decode(&raw_msg(0, &[0, 4, 0, 0, 0]), MAX)), Code::InvalidBSON.0);
}

/// `{a: {a: ... {}}}` with `depth` levels below the top-level document.
fn nested_bytes(depth: usize) -> Vec<u8> {
    // Build from the inside out: each level is len(4) type(1) "a\0"(2) inner EOO(1).
    let mut inner: Vec<u8> = vec![5, 0, 0, 0, 0];
    for _ in 0..depth {
        let mut next = Vec::with_capacity(inner.len() + 8);
        next.extend_from_slice(&((inner.len() + 8) as i32).to_le_bytes());
        next.push(0x03);
        next.extend_from_slice(b"a\0");
        next.extend_from_slice(&inner);
        next.push(0);
        inner = next;
    }
    inner
}

#[test]
fn depth_is_bounded() {
    let ok = raw_msg(0, &[vec![0], nested_bytes(limits::BSON_DEPTH_MAX)].concat());
    assert!(decode(&ok, MAX).is_ok());
    let too_deep = raw_msg(0, &[vec![0], nested_bytes(limits::BSON_DEPTH_MAX + 1)].concat());
    let e = decode(&too_deep, MAX).unwrap_err();
    assert_eq!(e.code, Code::Overflow.0);
    assert!(e.message.contains("maximum nested object depth"));
    // Far deeper than any stack could recurse: must fail fast, not overflow.
    let absurd = raw_msg(0, &[vec![0], nested_bytes(200_000)].concat());
    assert_eq!(code_of(decode(&absurd, MAX)), Code::Overflow.0);
}

#[test]
fn op_query_and_op_reply_rules() {
    let mut frame = encode_query(1, &sample_query());
    frame.push(0);
    let len = frame.len() as i32;
    frame[0..4].copy_from_slice(&len.to_le_bytes());
    assert!(decode(&frame, MAX).is_err(), "trailing byte after selector");
    // numberReturned that disagrees with the documents present.
    let mut reply = encode_reply(1, 0, &sample_reply(), None);
    reply[32..36].copy_from_slice(&5i32.to_le_bytes());
    assert_eq!(code_of(decode(&reply, MAX)), Code::ProtocolError.0);
}

#[test]
fn unknown_op_codes_are_rejected() {
    for op in [0, 2001, 2002, 2005, 2010, -1] {
        let mut f = Header { message_length: 20, request_id: 1, response_to: 0, op_code: op }.to_bytes().to_vec();
        f.extend_from_slice(&[0; 4]);
        assert_eq!(code_of(decode(&f, MAX)), Code::ProtocolError.0, "{op}");
    }
}

#[test]
fn unencodable_documents_become_error_replies() {
    let msg = OpMsg { flags: 0, body: doc! { "bad\0key": 1 }, sequences: vec![] };
    assert_eq!(code_of(try_encode_msg(1, 0, &msg, None)), Code::InvalidBSON.0);
    let frame = encode_msg(1, 0, &msg, None);
    let Message::Msg(reply) = decode(&frame, MAX).unwrap().message else { panic!() };
    assert_eq!(reply.body.get_f64("ok").unwrap(), 0.0);
    assert_eq!(reply.body.get_i32("code").unwrap(), Code::InvalidBSON.0);
    let r = OpReply { response_flags: 0, cursor_id: 0, starting_from: 0, documents: vec![doc! { "x\0": 1 }] };
    let Message::Reply(reply) = decode(&encode_reply(1, 0, &r, Some(Compressor::Zstd)), MAX).unwrap().message else { panic!() };
    assert_eq!(reply.documents.len(), 1);
    assert_eq!(reply.documents[0].get_str("codeName").unwrap(), "InvalidBSON");
}

#[test]
fn db_pointer_round_trips() {
    // {p: DBPointer("db.c", oid)} built by hand: bson 3 cannot construct one directly.
    let mut value = Vec::new();
    value.extend_from_slice(&5i32.to_le_bytes());
    value.extend_from_slice(b"db.c\0");
    value.extend_from_slice(&[4; 12]);
    let mut raw = vec![0u8; 4];
    raw.push(0x0C);
    raw.extend_from_slice(b"p\0");
    raw.extend_from_slice(&value);
    raw.push(0);
    let len = raw.len() as i32;
    raw[0..4].copy_from_slice(&len.to_le_bytes());
    let Message::Msg(m) = decode(&raw_msg(0, &[vec![0], raw.clone()].concat()), MAX).unwrap().message else { panic!() };
    let mut out = Vec::new();
    bson_codec::write_document(&mut out, &m.body).unwrap();
    assert_eq!(out, raw);
}

#[test]
fn large_message_compresses_and_round_trips() {
    let docs: Vec<Document> = (0..2000).map(|i| doc! { "_id": i, "payload": "abcdefgh".repeat(50) }).collect();
    let msg = OpMsg { flags: 0, body: doc! { "insert": "c" }, sequences: vec![DocumentSequence { identifier: "documents".into(), documents: docs }] };
    let plain = encode_msg(1, 0, &msg, None);
    for c in [Compressor::Snappy, Compressor::Zlib, Compressor::Zstd] {
        let packed = encode_msg(1, 0, &msg, Some(c));
        assert!(packed.len() < plain.len() / 4, "{c:?}: {} vs {}", packed.len(), plain.len());
        assert_eq!(decode(&packed, MAX).unwrap().message, Message::Msg(msg.clone()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes, MAX);
    }

    #[test]
    fn random_bodies_behind_valid_headers_never_panic(
        op in prop_oneof![Just(OP_MSG), Just(OP_QUERY), Just(OP_REPLY), Just(OP_COMPRESSED)],
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut f = Header { message_length: (16 + body.len()) as i32, request_id: 1, response_to: 0, op_code: op }.to_bytes().to_vec();
        f.extend_from_slice(&body);
        let _ = decode(&f, MAX);
    }

    #[test]
    fn mutated_valid_frames_never_panic(
        which in 0usize..1000,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
    ) {
        static FRAMES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
        let frames = FRAMES.get_or_init(valid_frames);
        let mut f = frames[which % frames.len()].clone();
        for (at, byte) in edits {
            let i = at % f.len();
            f[i] = byte;
        }
        let _ = decode(&f, MAX);
    }
}

#[test]
fn a_raw_cursor_batch_encodes_as_the_same_documents_would() {
    let docs = [rich_document(), doc! {"ts": Timestamp { time: 5, increment: 1 }, "op": "i"}];
    let raw: Vec<Vec<u8>> = docs.iter().map(|d| bson::RawDocumentBuf::try_from(d).unwrap().into_bytes()).collect();
    let reply = |batch: Vec<Bson>| doc! {"cursor": {"nextBatch": batch, "id": 7i64, "ns": "local.oplog.rs"}, "ok": 1.0};
    let expected = reply(docs.iter().cloned().map(Bson::Document).collect());
    for compressor in compressors() {
        for flags in [0, flags::CHECKSUM_PRESENT] {
            let msg = OpMsg { flags, body: reply(vec![]), sequences: vec![] };
            let batch = RawBatch { key: "nextBatch", docs: &raw };
            let frame = try_encode_msg_with_batch(3, 2, &msg, Some(batch), compressor).unwrap();
            let plain = try_encode_msg(3, 2, &OpMsg { flags, body: expected.clone(), sequences: vec![] }, compressor).unwrap();
            assert_eq!(frame, plain, "byte for byte what the decoded batch encodes to");
            match decode(&frame, MAX).unwrap().message {
                Message::Msg(m) => assert_eq!(m.body, expected),
                other => panic!("{other:?}"),
            }
            let (header, _, body) = decode_raw_msg(&frame, MAX).unwrap();
            assert_eq!((header.request_id, header.response_to), (3, 2));
            assert_eq!(Document::try_from(body.as_ref()).unwrap(), expected);
        }
    }
    // Bytes not framed as a document (length prefix, trailing NUL) never reach the frame.
    let body = reply(vec![]);
    let mut short = raw[1].clone();
    short.pop();
    let mut no_nul = raw[1].clone();
    *no_nul.last_mut().unwrap() = 1;
    for bad in [short, no_nul, vec![5, 0, 0]] {
        let msg = OpMsg { flags: 0, body: body.clone(), sequences: vec![] };
        let batch = [raw[0].clone(), bad];
        assert!(try_encode_msg_with_batch(1, 0, &msg, Some(RawBatch { key: "nextBatch", docs: &batch }), None).is_err());
    }
    // A body without the empty batch array to fill is an encoding error, not a wrong reply.
    let msg = OpMsg { flags: 0, body: doc! {"ok": 1.0}, sequences: vec![] };
    assert!(try_encode_msg_with_batch(1, 0, &msg, Some(RawBatch { key: "nextBatch", docs: &raw }), None).is_err());
    match decode(&encode_msg_with_batch(1, 0, &msg, Some(RawBatch { key: "nextBatch", docs: &raw }), None), MAX).unwrap().message {
        Message::Msg(m) => assert_eq!(m.body.get_i32("code").ok(), Some(Code::InternalError.0), "{:?}", m.body),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_raw_body_decode_checks_what_the_document_decode_checks() {
    for frame in valid_frames() {
        let full = decode(&frame, MAX).unwrap();
        match (full.message, decode_raw_msg(&frame, MAX)) {
            (Message::Msg(m), Ok((_, _, raw))) if m.sequences.is_empty() => {
                assert_eq!(Document::try_from(raw.as_ref()).unwrap(), m.body)
            }
            (Message::Msg(_), r) => assert!(r.is_err(), "document sequences are refused"),
            (_, r) => assert_eq!(code_of(r), Code::ProtocolError.0, "not an OP_MSG"),
        }
    }
    // Truncations and corruptions of a reply are errors, never panics.
    let good = encode_msg(9, 1, &sample_msg(flags::CHECKSUM_PRESENT), None);
    for cut in 0..good.len() {
        let mut f = good[..cut].to_vec();
        if f.len() >= 4 {
            f[..4].copy_from_slice(&(cut as i32).to_le_bytes());
        }
        assert!(decode_raw_msg(&f, MAX).is_err());
    }
    let mut bad = encode_msg(9, 1, &OpMsg { flags: 0, body: doc! {"a": {"b": 1}}, sequences: vec![] }, None);
    // Header, flags, section kind, outer length, type byte, "a\0": the inner length.
    bad[HEADER_SIZE_BYTES + 4 + 1 + 4 + 1 + 2] = 0x7f;
    assert!(decode(&bad, MAX).is_err());
    assert!(decode_raw_msg(&bad, MAX).is_err());
}

/// What a server runs for an OP_MSG: the body with each document sequence merged in as an
/// array, in the frame's order.
fn merged(msg: &OpMsg) -> Document {
    let mut body = msg.body.clone();
    for s in &msg.sequences {
        body.insert(s.identifier.clone(), Bson::Array(s.documents.iter().cloned().map(Bson::Document).collect()));
    }
    body
}

#[test]
fn msg_command_is_the_body_with_the_sequences_merged() {
    for flags in [0, flags::CHECKSUM_PRESENT] {
        let msg = sample_msg(flags);
        assert!(!msg.sequences.is_empty());
        let frame = encode_msg(1, 0, &msg, None);
        let mut buf = vec![9, 9];
        msg_command_into(&mut buf, &frame).unwrap();
        assert_eq!(&buf[..2], &[9, 9], "appends");
        assert_eq!(Document::try_from(bson::RawDocument::from_bytes(&buf[2..]).unwrap()).unwrap(), merged(&msg));
        // A body alone is the body as it came.
        let body_only = OpMsg { flags, body: msg.body.clone(), sequences: vec![] };
        let mut buf = Vec::new();
        msg_command_into(&mut buf, &encode_msg(1, 0, &body_only, None)).unwrap();
        assert_eq!(buf, msg.body.to_vec().unwrap());
    }
    // A sequence before the body still follows the body's fields.
    let mut frame = encode_msg(1, 0, &OpMsg { flags: 0, body: doc! {"insert": "c", "$db": "d"}, sequences: vec![] }, None);
    let seq_doc = doc! {"_id": 1}.to_vec().unwrap();
    let mut section = vec![1u8];
    section.extend_from_slice(&((4 + 10 + seq_doc.len()) as i32).to_le_bytes());
    section.extend_from_slice(b"documents\0");
    section.extend_from_slice(&seq_doc);
    frame.splice(HEADER_SIZE_BYTES + 4..HEADER_SIZE_BYTES + 4, section);
    let len = frame.len() as i32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    let mut buf = Vec::new();
    msg_command_into(&mut buf, &frame).unwrap();
    assert_eq!(Document::try_from(bson::RawDocument::from_bytes(&buf).unwrap()).unwrap(), doc! {"insert": "c", "$db": "d", "documents": [{"_id": 1}]});
}

#[test]
fn msg_command_of_a_cut_or_foreign_frame_is_an_error() {
    let msg = sample_msg(flags::CHECKSUM_PRESENT);
    let frame = encode_msg(1, 0, &msg, None);
    // Kind byte and body after the header and flags.
    let body_end = HEADER_SIZE_BYTES + 4 + 1 + msg.body.to_vec().unwrap().len();
    for cut in 0..frame.len() {
        let mut short = frame[..cut].to_vec();
        if short.len() >= 4 {
            let len = short.len() as i32;
            short[..4].copy_from_slice(&len.to_le_bytes());
        }
        // Whatever it makes of it, it does not panic. (The checksum is not checked, so a cut
        // that falls between sections can leave a frame that reads as fewer sections.)
        let r = msg_command_into(&mut Vec::new(), &short);
        if cut < body_end + 4 {
            assert!(r.is_err(), "cut at {cut}");
        }
    }
    assert!(msg_command_into(&mut Vec::new(), &encode_query(1, &sample_query())).is_err());
}

#[test]
fn raw_msg_keeps_a_sequences_documents_as_bytes_and_they_encode_back() {
    let docs = vec![doc! {"_id": 1, "a": "x"}, doc! {"_id": 2, "b": [1, 2]}];
    let msg = OpMsg {
        flags: 0,
        body: doc! {"insert": "c", "$db": "d"},
        sequences: vec![DocumentSequence { identifier: "documents".into(), documents: docs.clone() }],
    };
    let frame = encode_msg(7, 0, &msg, None);
    let raw = super::raw_msg(&frame, 1 << 20).unwrap().expect("an uncompressed OP_MSG");
    assert_eq!(raw.body.get_str("insert").unwrap(), "c");
    assert_eq!(raw.sequences.len(), 1);
    assert_eq!(raw.sequences[0].identifier, "documents");
    let back: Vec<Document> = raw.sequences[0].documents.iter().map(|b| Document::try_from(bson::RawDocument::from_bytes(b).unwrap()).unwrap()).collect();
    assert_eq!(back, docs);
    // Re-encoded with another body, the documents arrive as they were.
    let out = try_encode_msg_raw_sequence(9, &doc! {"insert": "c", "$db": "d2"}, &raw.sequences[0]).unwrap();
    let Message::Msg(m) = decode(&out, 1 << 20).unwrap().message else { panic!("not an OP_MSG") };
    assert_eq!(m.body.get_str("$db").unwrap(), "d2");
    assert_eq!(m.sequences[0].documents, docs);
    // A compressed frame or another opcode is left to `decode`; a cut document is refused.
    assert!(super::raw_msg(&encode_msg(7, 0, &msg, Some(Compressor::Snappy)), 1 << 20).unwrap().is_none());
    assert!(super::raw_msg(&encode_query(1, &sample_query()), 1 << 20).unwrap().is_none());
    let mut bad = frame.clone();
    let n = bad.len();
    bad[n - 1] = 1; // the last document loses its terminator
    assert!(super::raw_msg(&bad, 1 << 20).is_err());
}
