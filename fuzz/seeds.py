"""Write the hand-made seeds of each fuzz target's corpus (fuzz/corpus/TARGET/seed-*).

Run with a Python that has pymongo's bson (the test venv): .venv/bin/python fuzz/seeds.py
The fuzzer grows the corpus from these (scripts/fuzz.sh with SHOAL_FUZZ_KEEP=1).
"""
import os
import struct
import zlib

import bson
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp, DBRef
import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
OP_MSG, OP_QUERY, OP_REPLY, OP_COMPRESSED = 2013, 2004, 1, 2012


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def header(length, op, request_id=1, response_to=0):
    return struct.pack("<iiii", length, request_id, response_to, op)


def op_msg(body, sequences=(), flags=0, checksum=False):
    payload = struct.pack("<I", flags | (1 if checksum else 0)) + b"\x00" + bson.encode(body)
    for ident, docs in sequences:
        section = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        payload += b"\x01" + struct.pack("<i", 4 + len(section)) + section
    frame = header(16 + len(payload) + (4 if checksum else 0), OP_MSG) + payload
    if checksum:
        frame += struct.pack("<I", 0)  # wrong on purpose: the checksum path is exercised either way
    return frame


def op_query(ns, query):
    payload = struct.pack("<i", 0) + ns.encode() + b"\x00" + struct.pack("<ii", 0, -1) + bson.encode(query)
    return header(16 + len(payload), OP_QUERY) + payload


def op_reply(docs):
    payload = struct.pack("<iqii", 8, 0, 0, len(docs)) + b"".join(bson.encode(d) for d in docs)
    return header(16 + len(payload), OP_REPLY) + payload


def compressed(frame, compressor_id=2):
    inner = frame[16:]
    op = struct.unpack("<i", frame[12:16])[0]
    data = zlib.compress(inner) if compressor_id == 2 else inner
    payload = struct.pack("<iiB", op, len(inner), compressor_id) + data
    return header(16 + len(payload), OP_COMPRESSED) + payload


ALL_TYPES = {
    "d": 1.5, "nan": float("nan"), "negzero": -0.0, "inf": float("-inf"), "s": "a\x00b é", "doc": {"x": {"y": [1, {"z": None}]}},
    "arr": [1, "two", [3]], "bin": Binary(b"\x00\x01\x02", 0), "uuid": Binary(b"\x07" * 16, 4), "oid": ObjectId("64b7f0000000000000000001"),
    "t": True, "f": False, "date": datetime.datetime(2020, 1, 2, 3, 4, 5), "null": None, "re": Regex("^a.*b$", "imsx"),
    "code": Code("function() {}"), "scope": Code("x", {"a": 1}), "i": 7, "big": Int64(1 << 40), "ts": Timestamp(5, 6),
    "dec": Decimal128("-1.000E+10"), "min": MinKey(), "max": MaxKey(), "ref": DBRef("c", 1),
}

# wire_message
write("wire_message", "find", op_msg({"find": "c", "filter": {"a": {"$gt": 1}}, "limit": 1, "$db": "test", "lsid": {"id": Binary(b"\x01" * 16, 4)}}))
write("wire_message", "insert-sequence", op_msg({"insert": "c", "ordered": True, "$db": "test"}, [("documents", [{"_id": 1, "a": "x"}, {"_id": 2}])]))
write("wire_message", "update-sequence", op_msg({"update": "c", "$db": "test"}, [("updates", [{"q": {"_id": 1}, "u": {"$set": {"a": 1}}}])]))
write("wire_message", "two-sequences", op_msg({"bulkWrite": 1, "$db": "admin"}, [("ops", [{"insert": 0, "document": {}}]), ("nsInfo", [{"ns": "t.c"}])]))
write("wire_message", "checksum", op_msg({"ping": 1, "$db": "admin"}, checksum=True))
write("wire_message", "more-to-come", op_msg({"insert": "c", "$db": "t", "writeConcern": {"w": 0}}, flags=2))
write("wire_message", "all-types", op_msg(dict(ALL_TYPES, **{"$db": "t"})))
write("wire_message", "op-query-hello", op_query("admin.$cmd", {"isMaster": 1, "client": {"driver": {"name": "x"}}}))
write("wire_message", "op-reply", op_reply([{"ok": 1}, {"n": 2}]))
write("wire_message", "compressed-zlib", compressed(op_msg({"find": "c", "$db": "t"})))
write("wire_message", "compressed-noop", compressed(op_msg({"ping": 1, "$db": "t"}), 0))

# bson_document
write("bson_document", "all-types", bson.encode(ALL_TYPES))
write("bson_document", "command", bson.encode({"aggregate": "c", "pipeline": [{"$match": {"a": 1}}], "cursor": {}, "$db": "t"}))
write("bson_document", "deep", bson.encode({"a": {"a": {"a": {"a": {"a": [[[[{"b": 1}]]]]}}}}}))
write("bson_document", "empty", bson.encode({}))

# query_filter
filters = [
    {"a": 1}, {"a.b.c": {"$gt": 1, "$lte": 10}}, {"$and": [{"a": {"$in": [1, "x", None]}}, {"b": {"$nin": [[1], {"c": 1}]}}]},
    {"$or": [{"a": {"$exists": False}}, {"a": {"$type": ["string", 16]}}], "b": {"$ne": None}},
    {"$nor": [{"a": {"$size": 2}}], "c": {"$all": [1, 2]}}, {"d.f": {"$elemMatch": {"g": {"$gte": 1}}}},
    {"b": {"$regex": "^x", "$options": "i"}}, {"b": Regex("x$", "m")}, {"a": {"$not": {"$mod": [2, 1]}}},
    {"$expr": {"$gt": [{"$add": ["$a", 1]}, {"$size": {"$ifNull": ["$c", []]}}]}}, {"a": {"$bitsAllSet": [0, 1], "$bitsAnyClear": 5}},
    {"c": [1, 2, [3]]}, {"c.2.0": 3}, {"d": {"e": None, "f": [{"g": 1}, {"g": "2"}]}}, {"$comment": "x", "_id": {"$eq": 1}},
    {"a": {"$lt": MaxKey(), "$gt": MinKey()}}, {"n": float("nan")}, {"dec": {"$gte": Decimal128("1.5")}},
    {"$jsonSchema": {"required": ["a"], "properties": {"a": {"bsonType": "int"}}}}, {"t": {"$type": "date"}},
]
for i, f in enumerate(filters):
    write("query_filter", f"f{i}", bson.encode(f))

# update
updates = [
    {"u": {"$set": {"a.1.b": 3, "x.y": [1]}, "$inc": {"n": 2}, "$unset": {"c": ""}}},
    {"u": {"$push": {"a": {"$each": [3, 1, 2], "$sort": 1, "$slice": -2, "$position": 0}}}},
    {"u": {"$pull": {"a": {"b": {"$gte": 2}}}, "$addToSet": {"z": {"$each": [1, 1, 2]}}}},
    {"u": {"$rename": {"c.d": "e"}, "$min": {"m": 1}, "$max": {"m": 9}, "$mul": {"k": 1.5}}},
    {"u": {"$currentDate": {"now": True, "ts": {"$type": "timestamp"}}, "$setOnInsert": {"new": 1}, "$pop": {"a": -1}}},
    {"u": {"$bit": {"n": {"and": 5, "or": 2, "xor": 1}}}, "d": {"_id": 1, "n": 12}},
    {"u": {"$set": {"a.$[x].b": 9}}, "f": [{"x.b": {"$gt": 1}}], "d": {"_id": 1, "a": [{"b": 1}, {"b": 2}]}},
    {"u": {"$set": {"a.$.b": 7}}, "i": 1, "d": {"_id": 1, "a": [{"b": 1}, {"b": 2}]}},
    {"u": {"$inc": {"a.$[].b": 1}}, "d": {"_id": 1, "a": [{"b": 1}, {"b": 2}]}},
    {"u": {"b": 1, "c": {"d": 2}}},
    {"u": [{"$set": {"s": {"$concat": ["$c.d", "!"]}}}, {"$unset": "a"}, {"$replaceWith": {"$mergeObjects": ["$$ROOT", {"r": 1}]}}]},
]
for i, u in enumerate(updates):
    write("update", f"u{i}", bson.encode(u))

# aggregate
pipelines = [
    {"p": [{"$match": {"a": {"$exists": True}}}, {"$group": {"_id": "$a", "n": {"$sum": 1}, "avg": {"$avg": "$_id"}, "all": {"$push": "$$ROOT"}}}, {"$sort": {"n": -1}}]},
    {"p": [{"$unwind": {"path": "$b", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": True}}, {"$project": {"b": 1, "x": {"$multiply": ["$b", 2]}}}]},
    {"p": [{"$addFields": {"s": {"$substrCP": [{"$toString": "$a"}, 0, 1]}, "c": {"$cond": [{"$eq": ["$a", 1]}, "one", "other"]}}}, {"$limit": 2}, {"$skip": 1}]},
    {"p": [{"$facet": {"n": [{"$count": "n"}], "g": [{"$sortByCount": "$a"}]}}]},
    {"p": [{"$bucket": {"groupBy": "$_id", "boundaries": [0, 2, 10], "default": "other", "output": {"ids": {"$addToSet": "$_id"}}}}]},
    {"p": [{"$replaceRoot": {"newRoot": {"$mergeObjects": [{"x": 1}, "$c"]}}}, {"$set": {"m": {"$map": {"input": [1, 2], "as": "v", "in": {"$add": ["$$v", 1]}}}}}]},
    {"p": [{"$group": {"_id": None, "mn": {"$min": "$a"}, "mx": {"$max": "$a"}, "first": {"$first": "$a"}, "last": {"$last": "$a"}}}]},
    {"p": [{"$project": {"d": {"$dateToString": {"date": "$$NOW", "format": "%Y-%m-%d"}}, "r": {"$range": [0, 5, 2]}, "f": {"$filter": {"input": "$b", "cond": {"$gt": ["$$this", 1]}}}}}]},
    {"p": [{"$match": {"$expr": {"$in": ["$a", [1, "x"]]}}}, {"$unset": ["b"]}], "in": [{"a": 1, "b": 2}, {"a": "x"}, {"a": [1]}]},
]
for i, p in enumerate(pipelines):
    write("aggregate", f"p{i}", bson.encode(p))

# index_key
keys = [
    ALL_TYPES,
    {"a": 1, "b": Int64(1), "c": 1.0, "d": Decimal128("1.0"), "e": Decimal128("1E+0"), "f": 0.1, "g": Decimal128("0.1")},
    {"a": -0.0, "b": 0, "c": Decimal128("-0"), "d": float("nan"), "e": Decimal128("NaN"), "f": float("inf"), "g": Decimal128("-Infinity")},
    {"a": "", "b": "\x00", "c": "\x00\x00", "d": "a", "e": "a\x00", "f": b"a".decode(), "g": "\xff"},
    {"a": [], "b": [None], "c": [[]], "d": {}, "e": {"": None}, "f": {"a": 1}, "g": {"a": 1, "b": 1}},
    {"a": 123456789012345678, "b": Int64(-(1 << 63)), "c": 1e308, "d": 5e-324, "e": Decimal128("9.999999999999999999999999999999999E+6144"), "f": 2 ** 53 + 1.0, "g": Int64(2 ** 53 + 1)},
]
for i, k in enumerate(keys):
    write("index_key", f"k{i}", bson.encode(k))
print("seeds written to", os.path.join(HERE, "corpus"))
