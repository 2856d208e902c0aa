use super::*;
use bson::{bson, doc};

fn ev(e: Bson, d: Document) -> Value {
    Expr::parse(&e).unwrap().eval(&d).unwrap()
}
fn ev0(e: Bson) -> Bson {
    ev(e, Document::new()).unwrap_or(Bson::String("<missing>".into()))
}
fn code(e: Bson) -> i32 {
    match Expr::parse(&e) {
        Err(err) => err.code,
        Ok(x) => x.eval(&doc! {"s": "str", "n": 5}).unwrap_err().code,
    }
}
fn dec(s: &str) -> Bson {
    Bson::Decimal128(s.parse().unwrap())
}

#[test]
fn field_paths_and_variables() {
    let d = doc! {"a": {"b": 1}, "arr": [{"x": 1}, {"y": 2}, {"x": [3]}, 4]};
    assert_eq!(ev(bson!("$a.b"), d.clone()), Some(Bson::Int32(1)));
    assert_eq!(ev(bson!("$arr.x"), d.clone()), Some(bson!([1, [3]])));
    assert_eq!(ev(bson!("$nope"), d.clone()), None);
    assert_eq!(ev(bson!("$$ROOT.a"), d.clone()), Some(bson!({"b": 1})));
    assert_eq!(ev(bson!("$$REMOVE"), d.clone()), None);
    assert!(matches!(ev(bson!("$$NOW"), d.clone()), Some(Bson::DateTime(_))));
    assert_eq!(ev(bson!({"$let": {"vars": {"x": 2, "y": "$a.b"}, "in": {"$add": ["$$x", "$$y"]}}}), d.clone()), Some(Bson::Int32(3)));
    assert_eq!(ev(bson!({"o": "$a.b", "m": "$missing", "l": [1, "$missing"]}), d), Some(bson!({"o": 1, "l": [1, null]})));
    assert_eq!(code(bson!("$$undefinedVar")), 17276);
    assert_eq!(code(bson!({"$foo": 1})), 168);
    assert_eq!(code(bson!({"$add": [1], "b": 2})), 15983);
}

#[test]
fn arithmetic() {
    assert_eq!(ev0(bson!({"$add": [1, 2]})), Bson::Int32(3));
    assert_eq!(ev0(bson!({"$add": [2147483647, 1]})), Bson::Int64(2147483648));
    assert_eq!(ev0(bson!({"$add": [1, 2.5]})), Bson::Double(3.5));
    assert_eq!(ev0(bson!({"$add": [1, null]})), Bson::Null);
    assert_eq!(ev0(bson!({"$add": [dec("1.1"), 1]})), dec("2.1"));
    assert_eq!(ev0(bson!({"$add": [Bson::DateTime(DateTime::from_millis(1000)), 500]})), Bson::DateTime(DateTime::from_millis(1500)));
    assert_eq!(ev0(bson!({"$subtract": [5, 7]})), Bson::Int32(-2));
    assert_eq!(ev0(bson!({"$subtract": [Bson::DateTime(DateTime::from_millis(3000)), Bson::DateTime(DateTime::from_millis(1000))]})), Bson::Int64(2000));
    assert_eq!(ev0(bson!({"$multiply": [2, 3, 4]})), Bson::Int32(24));
    assert_eq!(ev0(bson!({"$divide": [9, 2]})), Bson::Double(4.5));
    assert_eq!(ev0(bson!({"$mod": [9, 4]})), Bson::Int32(1));
    assert_eq!(ev0(bson!({"$mod": [-9, 4]})), Bson::Int32(-1));
    assert_eq!(ev0(bson!({"$mod": [9.5, 4]})), Bson::Double(1.5));
    assert_eq!(ev0(bson!({"$abs": -5})), Bson::Int32(5));
    assert_eq!(ev0(bson!({"$ceil": 1.2})), Bson::Double(2.0));
    assert_eq!(ev0(bson!({"$floor": -1.2})), Bson::Double(-2.0));
    assert_eq!(ev0(bson!({"$sqrt": 25})), Bson::Double(5.0));
    assert_eq!(ev0(bson!({"$pow": [2, 10]})), Bson::Int32(1024));
    assert_eq!(ev0(bson!({"$pow": [2, -1]})), Bson::Double(0.5));
    assert_eq!(ev0(bson!({"$round": [10.5]})), Bson::Double(10.0));
    assert_eq!(ev0(bson!({"$round": [11.5]})), Bson::Double(12.0));
    assert_eq!(ev0(bson!({"$round": [1234.5678, 2]})), Bson::Double(1234.57));
    assert_eq!(ev0(bson!({"$round": [1234.5678, -2]})), Bson::Double(1200.0));
    assert_eq!(ev0(bson!({"$round": [1250, -2]})), Bson::Int32(1200));
    assert_eq!(ev0(bson!({"$trunc": [7.89, 1]})), Bson::Double(7.8));
    assert_eq!(ev0(bson!({"$log10": 100})), Bson::Double(2.0));
    assert_eq!(ev0(bson!({"$ln": 1})), Bson::Double(0.0));
    assert_eq!(code(bson!({"$divide": [1, 0]})), 16608);
    assert_eq!(code(bson!({"$mod": [1, 0]})), 16610);
    assert_eq!(code(bson!({"$add": ["$s", 1]})), 16554);
    assert_eq!(code(bson!({"$subtract": [1]})), 16020);
    assert_eq!(code(bson!({"$sqrt": -1})), 28714);
    assert_eq!(code(bson!({"$ln": 0})), 28766);
    assert_eq!(code(bson!({"$add": [Bson::DateTime(DateTime::from_millis(1)), Bson::DateTime(DateTime::from_millis(1))]})), 16612);
}

#[test]
fn comparison_and_logic() {
    assert_eq!(ev0(bson!({"$eq": [1, 1.0]})), Bson::Boolean(true));
    assert_eq!(ev(bson!({"$eq": ["$missing", null]}), doc! {}), Some(Bson::Boolean(false)));
    assert_eq!(ev0(bson!({"$gt": ["a", 1]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$cmp": [1, 2]})), Bson::Int32(-1));
    assert_eq!(ev0(bson!({"$and": [1, "x", []]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$and": [1, 0]})), Bson::Boolean(false));
    assert_eq!(ev0(bson!({"$or": [null, false]})), Bson::Boolean(false));
    assert_eq!(ev0(bson!({"$not": [0]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$cond": [true, "y", "n"]})), Bson::String("y".into()));
    assert_eq!(ev0(bson!({"$cond": {"if": false, "then": "y", "else": "n"}})), Bson::String("n".into()));
    assert_eq!(ev(bson!({"$ifNull": ["$a", "$b", 3]}), doc! {"b": 2}), Some(Bson::Int32(2)));
    assert_eq!(ev(bson!({"$ifNull": ["$a", 3]}), doc! {"a": null}), Some(Bson::Int32(3)));
    let sw = bson!({"$switch": {"branches": [{"case": {"$gt": ["$n", 10]}, "then": "big"}, {"case": {"$gt": ["$n", 1]}, "then": "mid"}], "default": "small"}});
    assert_eq!(ev(sw.clone(), doc! {"n": 5}), Some(Bson::String("mid".into())));
    assert_eq!(ev(sw, doc! {"n": 0}), Some(Bson::String("small".into())));
    assert_eq!(code(bson!({"$switch": {"branches": [{"case": false, "then": 1}]}})), 40066);
    assert_eq!(code(bson!({"$cond": {"if": 1, "then": 2}})), 17082);
}

#[test]
fn strings() {
    assert_eq!(ev0(bson!({"$concat": ["a", "b", "c"]})), Bson::String("abc".into()));
    assert_eq!(ev0(bson!({"$concat": ["a", null]})), Bson::Null);
    assert_eq!(code(bson!({"$concat": ["a", 1]})), 16702);
    assert_eq!(ev0(bson!({"$substr": ["hello", 1, 3]})), Bson::String("ell".into()));
    assert_eq!(ev0(bson!({"$substrBytes": ["hello", 2, -1]})), Bson::String("llo".into()));
    assert_eq!(ev0(bson!({"$substrCP": ["héllo", 1, 2]})), Bson::String("él".into()));
    assert_eq!(code(bson!({"$substrBytes": ["héllo", 2, 1]})), 28656);
    assert_eq!(ev0(bson!({"$toLower": "ABc"})), Bson::String("abc".into()));
    assert_eq!(ev0(bson!({"$toUpper": 5})), Bson::String("5".into()));
    assert_eq!(ev0(bson!({"$toUpper": null})), Bson::String("".into()));
    assert_eq!(ev0(bson!({"$strLenBytes": "héllo"})), Bson::Int32(6));
    assert_eq!(ev0(bson!({"$strLenCP": "héllo"})), Bson::Int32(5));
    assert_eq!(code(bson!({"$strLenCP": 1})), 34471);
    assert_eq!(ev0(bson!({"$split": ["a-b-c", "-"]})), bson!(["a", "b", "c"]));
    assert_eq!(code(bson!({"$split": ["a", ""]})), 40087);
    assert_eq!(ev0(bson!({"$trim": {"input": "  x  "}})), Bson::String("x".into()));
    assert_eq!(ev0(bson!({"$ltrim": {"input": "xxabx", "chars": "x"}})), Bson::String("abx".into()));
    assert_eq!(ev0(bson!({"$rtrim": {"input": "xxabx", "chars": "x"}})), Bson::String("xxab".into()));
    assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "e"]})), Bson::Int32(3));
    assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "e", 5]})), Bson::Int32(5));
    assert_eq!(ev0(bson!({"$indexOfBytes": ["cafeteria", "z"]})), Bson::Int32(-1));
    assert_eq!(ev0(bson!({"$indexOfCP": ["héllo", "l"]})), Bson::Int32(2));
    assert_eq!(ev0(bson!({"$strcasecmp": ["ABC", "abc"]})), Bson::Int32(0));
    assert_eq!(ev0(bson!({"$regexMatch": {"input": "Hello", "regex": "^h", "options": "i"}})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$regexMatch": {"input": null, "regex": "^h"}})), Bson::Boolean(false));
    assert_eq!(ev0(bson!({"$regexFind": {"input": "xab12", "regex": "([a-z])(\\d)"}})), bson!({"match": "b1", "idx": 2, "captures": ["b", "1"]}));
    assert_eq!(ev0(bson!({"$regexFindAll": {"input": "a1b2", "regex": "\\d"}})).as_array().map(|a| a.len()), Some(2));
    assert_eq!(code(bson!({"$regexMatch": {"input": 1, "regex": "x"}})), 51104);
    assert_eq!(ev0(bson!({"$replaceAll": {"input": "a.b.c", "find": ".", "replacement": "-"}})), Bson::String("a-b-c".into()));
    assert_eq!(ev0(bson!({"$replaceOne": {"input": "a.b.c", "find": ".", "replacement": "-"}})), Bson::String("a-b.c".into()));
}

#[test]
fn arrays() {
    assert_eq!(ev0(bson!({"$arrayElemAt": [[1, 2, 3], -1]})), Bson::Int32(3));
    assert_eq!(ev0(bson!({"$arrayElemAt": [[1, 2, 3], 5]})), Bson::String("<missing>".into()));
    assert_eq!(code(bson!({"$arrayElemAt": ["$s", 0]})), 28689);
    assert_eq!(ev0(bson!({"$first": [[1, 2]]})), Bson::Int32(1));
    assert_eq!(ev0(bson!({"$last": [[1, 2]]})), Bson::Int32(2));
    assert_eq!(ev0(bson!({"$concatArrays": [[1], [2, 3]]})), bson!([1, 2, 3]));
    assert_eq!(ev0(bson!({"$in": [2, [1, 2]]})), Bson::Boolean(true));
    assert_eq!(code(bson!({"$in": [2, "$s"]})), 40081);
    assert_eq!(ev0(bson!({"$size": [[1, 2]]})), Bson::Int32(2));
    assert_eq!(code(bson!({"$size": "$missing"})), 17124);
    assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], 2]})), bson!([1, 2]));
    assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], -2]})), bson!([3, 4]));
    assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], 1, 2]})), bson!([2, 3]));
    assert_eq!(ev0(bson!({"$slice": [[1, 2, 3, 4], -3, 2]})), bson!([2, 3]));
    assert_eq!(ev0(bson!({"$isArray": [[1]]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$reverseArray": [[1, 2]]})), bson!([2, 1]));
    assert_eq!(ev0(bson!({"$range": [0, 10, 3]})), bson!([0, 3, 6, 9]));
    assert_eq!(ev0(bson!({"$range": [5, 0, -2]})), bson!([5, 3, 1]));
    assert_eq!(code(bson!({"$range": [0, 5, 0]})), 34449);
    assert_eq!(ev0(bson!({"$indexOfArray": [["a", "b"], "b"]})), Bson::Int32(1));
    assert_eq!(ev0(bson!({"$filter": {"input": [1, 5, 9], "as": "x", "cond": {"$gt": ["$$x", 3]}}})), bson!([5, 9]));
    assert_eq!(ev0(bson!({"$filter": {"input": [1, 5, 9], "cond": {"$gt": ["$$this", 0]}, "limit": 1}})), bson!([1]));
    assert_eq!(ev0(bson!({"$map": {"input": [1, 2], "as": "v", "in": {"$multiply": ["$$v", 10]}}})), bson!([10, 20]));
    assert_eq!(ev0(bson!({"$reduce": {"input": ["a", "b"], "initialValue": "", "in": {"$concat": ["$$value", "$$this"]}}})), Bson::String("ab".into()));
    assert_eq!(ev0(bson!({"$arrayToObject": [[["a", 1], ["b", 2]]]})), bson!({"a": 1, "b": 2}));
    assert_eq!(ev0(bson!({"$arrayToObject": [[{"k": "a", "v": 1}]]})), bson!({"a": 1}));
    assert_eq!(ev0(bson!({"$objectToArray": {"$literal": {"a": 1}}})), bson!([{"k": "a", "v": 1}]));
    assert_eq!(ev0(bson!({"$mergeObjects": [{"a": 1}, null, {"a": 2, "b": 3}]})), bson!({"a": 2, "b": 3}));
    assert_eq!(ev0(bson!({"$setUnion": [[1, 2], [2, 3]]})), bson!([1, 2, 3]));
    assert_eq!(ev0(bson!({"$setIntersection": [[1, 2], [2, 3]]})), bson!([2]));
    assert_eq!(ev0(bson!({"$setDifference": [[1, 2], [2, 3]]})), bson!([1]));
    assert_eq!(ev0(bson!({"$setEquals": [[1, 2], [2, 1, 1]]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$setIsSubset": [[1], [2, 1]]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$allElementsTrue": [[1, true]]})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$anyElementTrue": [[0, false]]})), Bson::Boolean(false));
    assert_eq!(ev0(bson!({"$sum": [[1, 2, "x"]]})), Bson::Int32(3));
    assert_eq!(ev0(bson!({"$sum": [1, 2.5]})), Bson::Double(3.5));
    assert_eq!(ev0(bson!({"$avg": [[1, 2]]})), Bson::Double(1.5));
    assert_eq!(ev0(bson!({"$avg": [["x"]]})), Bson::Null);
    assert_eq!(ev0(bson!({"$max": [[1, 5, null]]})), Bson::Int32(5));
    assert_eq!(ev0(bson!({"$min": [4, 2, 8]})), Bson::Int32(2));
    assert_eq!(ev0(bson!({"$stdDevPop": [[1, 3]]})), Bson::Double(1.0));
}

#[test]
fn types_and_conversion() {
    assert_eq!(ev(bson!({"$type": "$x"}), doc! {}), Some(Bson::String("missing".into())));
    assert_eq!(ev0(bson!({"$type": 1i64})), Bson::String("long".into()));
    assert_eq!(ev0(bson!({"$toString": 1.5})), Bson::String("1.5".into()));
    assert_eq!(ev0(bson!({"$toString": 42i64})), Bson::String("42".into()));
    assert_eq!(ev0(bson!({"$toString": true})), Bson::String("true".into()));
    assert_eq!(ev0(bson!({"$toInt": "42"})), Bson::Int32(42));
    assert_eq!(ev0(bson!({"$toInt": 4.9})), Bson::Int32(4));
    assert_eq!(ev0(bson!({"$toLong": true})), Bson::Int64(1));
    assert_eq!(ev0(bson!({"$toDouble": "2.5"})), Bson::Double(2.5));
    assert_eq!(ev0(bson!({"$toDecimal": 2.5})), dec("2.50000000000000"));
    assert_eq!(ev0(bson!({"$toBool": 0})), Bson::Boolean(false));
    assert_eq!(ev0(bson!({"$toBool": ""})), Bson::Boolean(true));
    assert_eq!(ev0(bson!({"$toInt": null})), Bson::Null);
    assert_eq!(ev0(bson!({"$toObjectId": "5ab9cbfa31c2ab715d42129e"})), Bson::ObjectId(ObjectId::parse_str("5ab9cbfa31c2ab715d42129e").unwrap()));
    assert_eq!(ev0(bson!({"$toDate": "2018-03-27T16:58:51.538Z"})), Bson::DateTime(DateTime::from_millis(1522169931538)));
    assert_eq!(code(bson!({"$toInt": "abc"})), 241);
    assert_eq!(code(bson!({"$toInt": 1e20})), 241);
    assert_eq!(ev0(bson!({"$convert": {"input": "abc", "to": "int", "onError": -1}})), Bson::Int32(-1));
    assert_eq!(ev0(bson!({"$convert": {"input": null, "to": "int", "onNull": 0}})), Bson::Int32(0));
    assert_eq!(ev0(bson!({"$convert": {"input": "7", "to": 16}})), Bson::Int32(7));
    assert_eq!(ev0(bson!({"$isNumber": dec("1")})), Bson::Boolean(true));
}

#[test]
fn dates() {
    let d = doc! {"d": Bson::DateTime(DateTime::from_millis(1_388_564_139_736))}; // 2014-01-01T08:15:39.736Z
    let part = |op: &str| ev(bson!({op: "$d"}), d.clone());
    assert_eq!(part("$year"), Some(Bson::Int32(2014)));
    assert_eq!(part("$month"), Some(Bson::Int32(1)));
    assert_eq!(part("$dayOfMonth"), Some(Bson::Int32(1)));
    assert_eq!(part("$hour"), Some(Bson::Int32(8)));
    assert_eq!(part("$minute"), Some(Bson::Int32(15)));
    assert_eq!(part("$second"), Some(Bson::Int32(39)));
    assert_eq!(part("$millisecond"), Some(Bson::Int32(736)));
    assert_eq!(part("$dayOfWeek"), Some(Bson::Int32(4)));
    assert_eq!(part("$dayOfYear"), Some(Bson::Int32(1)));
    assert_eq!(part("$week"), Some(Bson::Int32(0)));
    assert_eq!(ev(bson!({"$hour": {"date": "$d", "timezone": "+02:00"}}), d.clone()), Some(Bson::Int32(10)));
    assert_eq!(ev(bson!({"$dateToString": {"format": "%Y-%m-%d", "date": "$d"}}), d.clone()), Some(Bson::String("2014-01-01".into())));
    assert_eq!(ev(bson!({"$dateToString": {"date": "$d"}}), d.clone()), Some(Bson::String("2014-01-01T08:15:39.736Z".into())));
    assert_eq!(ev(bson!({"$dateToString": {"date": "$x", "onNull": "none"}}), d.clone()), Some(Bson::String("none".into())));
    assert_eq!(ev(bson!({"$year": "$x"}), d.clone()), Some(Bson::Null));
    assert_eq!(code(bson!({"$year": "$s"})), 16006);
    assert_eq!(ev0(bson!({"$dateFromString": {"dateString": "2014-01-01T08:15:39.736Z"}})), Bson::DateTime(DateTime::from_millis(1_388_564_139_736)));
}

#[test]
fn get_set_field_and_literal() {
    let d = doc! {"a.b": 1, "x": {"y": 2}};
    assert_eq!(ev(bson!({"$getField": "a.b"}), d.clone()), Some(Bson::Int32(1)));
    assert_eq!(ev(bson!({"$getField": {"field": "y", "input": "$x"}}), d.clone()), Some(Bson::Int32(2)));
    assert_eq!(ev(bson!({"$setField": {"field": "z", "input": "$x", "value": 3}}), d.clone()), Some(bson!({"y": 2, "z": 3})));
    assert_eq!(ev(bson!({"$unsetField": {"field": "y", "input": "$x"}}), d.clone()), Some(bson!({})));
    assert_eq!(ev(bson!({"$literal": "$x"}), d), Some(Bson::String("$x".into())));
}

#[test]
fn operators_without_arguments_take_an_empty_object() {
    let r = Expr::parse(&Bson::Document(doc! {"$rand": {}})).unwrap().eval(&Document::new()).unwrap();
    assert!(matches!(r, Some(Bson::Double(x)) if (0.0..1.0).contains(&x)));
    assert!(Expr::parse(&Bson::Document(doc! {"$rand": [1]})).is_err());
}
