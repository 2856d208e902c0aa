//! Oplog entries as change events, in mongod's shape: what a stream on a collection, a
//! database or the whole deployment sees of each entry.

use super::token::Position;
use bson::{doc, Bson, Document};
use common::{Code, Error, Result};

/// What a stream watches.
#[derive(Clone, Debug)]
pub enum Scope {
    Collection { db: String, coll: String },
    Database { db: String },
    Cluster,
}

impl Scope {
    /// Whether events of namespace `db.coll` belong to this stream. Internal databases and
    /// `system.` collections are never watched by a database or cluster stream.
    fn covers(&self, db: &str, coll: &str) -> bool {
        match self {
            Scope::Collection { db: d, coll: c } => d == db && c == coll,
            Scope::Database { db: d } => d == db && !coll.starts_with("system."),
            Scope::Cluster => !is_internal_db(db) && !coll.starts_with("system."),
        }
    }

    fn covers_db(&self, db: &str) -> bool {
        match self {
            Scope::Collection { db: d, .. } | Scope::Database { db: d } => d == db,
            Scope::Cluster => !is_internal_db(db),
        }
    }
}

pub fn is_internal_db(db: &str) -> bool {
    matches!(db, "admin" | "config" | "local")
}

/// The options that shape events.
#[derive(Clone, Debug, Default)]
pub struct Shape {
    pub show_expanded_events: bool,
    /// Events of updates, replaces and deletes carry the document before the change, and
    /// updates the one after it, where the oplog logged the document before
    /// (`fullDocument: whenAvailable | required`, `fullDocumentBeforeChange`).
    pub images: bool,
}

/// One entry's events: each with its position, the event document, and whether the stream
/// ends after it (an invalidate).
pub struct Produced {
    pub at: Position,
    pub event: Document,
    pub invalidates: bool,
    /// The changed document before and after the change, with `Shape::images`, when known.
    pub images: Images,
}

#[derive(Default)]
pub struct Images {
    pub before: Option<Document>,
    pub after: Option<Document>,
}

/// The events `entry` (logged at `ts`) produces for `scope`, in order. A transaction's
/// operations logged in entries before its last (a prepare, a chain's `partialTxn` parts)
/// come from `ops_before`. `before` is the entry logged just before this one, if known: a
/// change's pre-image (`storage::is_pre_image`) is logged there.
pub fn events_of(
    entry: &Document,
    ts: u64,
    before: Option<&Document>,
    scope: &Scope,
    shape: &Shape,
    ops_before: &dyn Fn(&Document) -> Result<Vec<Document>>,
) -> Result<Vec<Produced>> {
    if entry.get_bool("fromMigrate").unwrap_or(false) {
        return Ok(Vec::new());
    }
    let wall = entry.get("wall").cloned().unwrap_or(Bson::Null);
    let mut out = Vec::new();
    let o = entry.get_document("o").ok();
    let is_txn = entry.get_str("op").ok() == Some("c") && entry.get_str("ns").ok() == Some("admin.$cmd");
    if is_txn {
        let Some(o) = o else { return Ok(out) };
        let ops: Vec<Document> = if let Ok(ops) = o.get_array("applyOps") {
            // A prepare or a chain's part is reported with its commit.
            if o.get_bool("prepare").unwrap_or(false) || o.get_bool("partialTxn").unwrap_or(false) {
                return Ok(out);
            }
            let own = ops.iter().filter_map(|op| op.as_document().cloned());
            match o.contains_key("count") {
                true => ops_before(entry)?.into_iter().chain(own).collect(),
                false => own.collect(),
            }
        } else if o.contains_key("commitTransaction") {
            ops_before(entry)?
        } else {
            return Ok(out);
        };
        let session = (entry.get("lsid").cloned(), entry.get("txnNumber").cloned());
        for (i, op) in ops.iter().enumerate() {
            let at = Position { ts, index: i as u32, invalidate: false, fragment: 0 };
            let before = i.checked_sub(1).map(|b| &ops[b]);
            if let Some((mut e, images)) = crud_event(op, at, &wall, before, scope, shape)? {
                if let (Some(lsid), Some(txn)) = &session {
                    e.insert("lsid", lsid.clone());
                    e.insert("txnNumber", txn.clone());
                }
                out.push(Produced { at, event: e, invalidates: false, images });
            }
        }
        return Ok(out);
    }
    let at = Position { ts, index: 0, invalidate: false, fragment: 0 };
    match entry.get_str("op").unwrap_or("") {
        "i" | "u" | "d" => {
            if let Some((e, images)) = crud_event(entry, at, &wall, before, scope, shape)? {
                out.push(Produced { at, event: e, invalidates: false, images });
            }
        }
        "c" => {
            let Some(o) = o else { return Ok(out) };
            let db = entry.get_str("ns").unwrap_or("").strip_suffix(".$cmd").unwrap_or("").to_string();
            catalog_events(o, entry.get("ui"), &db, at, &wall, scope, shape, &mut out);
        }
        _ => {}
    }
    Ok(out)
}

fn split_ns(ns: &str) -> Option<(&str, &str)> {
    ns.split_once('.')
}

fn head(op_type: &str, at: Position, wall: &Bson) -> Document {
    doc! {
        "_id": at.token(),
        "operationType": op_type,
        "clusterTime": Bson::Timestamp(common::optime::ts_of(at.ts)),
        "wallTime": wall.clone(),
    }
}

/// An insert, update, replace or delete event of a CRUD operation (an entry, or one
/// operation of a transaction's), and with `Shape::images` the document before and after
/// the change when `before` (the entry or operation logged just before) is its pre-image.
fn crud_event(op: &Document, at: Position, wall: &Bson, before: Option<&Document>, scope: &Scope, shape: &Shape) -> Result<Option<(Document, Images)>> {
    let ns = op.get_str("ns").unwrap_or("");
    let Some((db, coll)) = split_ns(ns) else { return Ok(None) };
    if !scope.covers(db, coll) {
        return Ok(None);
    }
    let bad = |what: &str| Error::new(Code::FailedToParse, format!("an oplog entry on {ns} has no {what}"));
    let o = op.get_document("o").map_err(|_| bad("o"))?;
    let ns_doc = doc! {"db": db, "coll": coll};
    let head = |op_type: &str| {
        let mut e = head(op_type, at, wall);
        if let (true, Some(ui)) = (shape.show_expanded_events, op.get("ui")) {
            e.insert("collectionUUID", ui.clone());
        }
        e
    };
    let key_of = |d: &Document| -> Result<Document> { Ok(doc! {"_id": d.get("_id").cloned().ok_or_else(|| bad("_id"))?}) };
    let mut images = Images::default();
    let pre_image = |key: &Document| -> Option<Document> {
        let pre = before.filter(|b| shape.images && storage::is_pre_image(b) && b.get_str("ns").ok() == Some(ns))?.get_document("o").ok()?;
        (pre.get("_id") == key.get("_id")).then(|| pre.clone())
    };
    let event = match op.get_str("op").unwrap_or("") {
        "i" => {
            let mut e = head("insert");
            e.insert("fullDocument", o.clone());
            e.insert("ns", ns_doc);
            e.insert("documentKey", key_of(o)?);
            e
        }
        "d" => {
            let mut e = head("delete");
            let key = key_of(o)?;
            images.before = pre_image(&key);
            e.insert("ns", ns_doc);
            e.insert("documentKey", key);
            e
        }
        "u" => {
            let key = key_of(op.get_document("o2").map_err(|_| bad("o2"))?)?;
            images.before = pre_image(&key);
            match storage::diff::of_update_entry(o) {
                Some(diff) => {
                    if let Some(pre) = &images.before {
                        images.after = Some(storage::diff::apply(pre, diff)?);
                    }
                    let mut e = head("update");
                    e.insert("ns", ns_doc);
                    e.insert("documentKey", key);
                    e.insert("updateDescription", update_description(diff, shape.show_expanded_events)?);
                    e
                }
                None if o.keys().next().is_some_and(|k| k.starts_with('$')) => {
                    return Err(Error::new(Code::ChangeStreamFatalError, format!("an update oplog entry on {ns} in a form change streams cannot read: {o}")));
                }
                None => {
                    let mut e = head("replace");
                    let mut full = o.clone();
                    if !full.contains_key("_id") {
                        full.insert("_id", key.get("_id").cloned().unwrap_or(Bson::Null));
                    }
                    e.insert("fullDocument", full);
                    e.insert("ns", ns_doc);
                    e.insert("documentKey", key);
                    e
                }
            }
        }
        _ => return Ok(None),
    };
    Ok(Some((event, images)))
}

/// `updatedFields`, `removedFields` and `truncatedArrays` of an update's diff, and with
/// `expanded` (showExpandedEvents) `disambiguatedPaths`: each of those paths that a reader
/// could not split back into its parts (a field name that is a number or holds a dot),
/// with its parts, array indexes as integers.
pub fn update_description(diff: &Document, expanded: bool) -> Result<Document> {
    let mut d = Description::default();
    d.walk_object(diff, &mut Vec::new())?;
    let mut out = doc! {"updatedFields": d.updated, "removedFields": d.removed, "truncatedArrays": d.truncated};
    if expanded {
        out.insert("disambiguatedPaths", d.disambiguated);
    }
    Ok(out)
}

/// Nesting limit of a diff walked: BSON's own depth.
const DIFF_DEPTH_MAX: usize = 200;

/// One part of a changed field's path.
#[derive(Clone)]
enum Part<'a> {
    Field(&'a str),
    Index(u32),
}

#[derive(Default)]
struct Description {
    updated: Document,
    removed: Vec<Bson>,
    truncated: Vec<Bson>,
    disambiguated: Document,
}

impl Description {
    /// The dotted path of `parts`, noted in `disambiguated` when it is ambiguous.
    fn path(&mut self, parts: &[Part]) -> String {
        let text: Vec<String> = parts
            .iter()
            .map(|p| match p {
                Part::Field(f) => f.to_string(),
                Part::Index(i) => i.to_string(),
            })
            .collect();
        let joined = text.join(".");
        let ambiguous = parts.iter().any(|p| matches!(p, Part::Field(f) if f.contains('.') || (!f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))));
        if ambiguous {
            let listed: Vec<Bson> = parts
                .iter()
                .map(|p| match p {
                    Part::Field(f) => Bson::String(f.to_string()),
                    Part::Index(i) => Bson::Int32(*i as i32),
                })
                .collect();
            self.disambiguated.insert(joined.clone(), listed);
        }
        joined
    }

    fn walk_object<'a>(&mut self, diff: &'a Document, parts: &mut Vec<Part<'a>>) -> Result<()> {
        check_depth(parts.len())?;
        for (k, v) in diff {
            match (k.as_str(), v) {
                ("u" | "i", Bson::Document(fields)) => {
                    for (f, v) in fields {
                        parts.push(Part::Field(f));
                        let path = self.path(parts);
                        parts.pop();
                        self.updated.insert(path, v.clone());
                    }
                }
                ("d", Bson::Document(fields)) => {
                    for f in fields.keys() {
                        parts.push(Part::Field(f));
                        let path = self.path(parts);
                        parts.pop();
                        self.removed.push(Bson::String(path));
                    }
                }
                (s, Bson::Document(sub)) if s.starts_with('s') => {
                    parts.push(Part::Field(&s[1..]));
                    let r = self.walk_sub(sub, parts);
                    parts.pop();
                    r?;
                }
                _ => return Err(Error::new(Code::FailedToParse, format!("an update diff has an unknown field '{k}'"))),
            }
        }
        Ok(())
    }

    fn walk_sub<'a>(&mut self, sub: &'a Document, parts: &mut Vec<Part<'a>>) -> Result<()> {
        match matches!(sub.get("a"), Some(Bson::Boolean(true))) {
            true => self.walk_array(sub, parts),
            false => self.walk_object(sub, parts),
        }
    }

    fn walk_array<'a>(&mut self, diff: &'a Document, parts: &mut Vec<Part<'a>>) -> Result<()> {
        check_depth(parts.len())?;
        for (k, v) in diff {
            match k.as_str() {
                "a" => {}
                "l" => {
                    let path = self.path(parts);
                    self.truncated.push(Bson::Document(doc! {"field": path, "newSize": v.clone()}));
                }
                _ => {
                    let (kind, index) = k.split_at(1);
                    let index: u32 = index.parse().map_err(|_| Error::new(Code::FailedToParse, format!("an array diff has an unknown field '{k}'")))?;
                    parts.push(Part::Index(index));
                    let r = match (kind, v) {
                        ("u", v) => {
                            let path = self.path(parts);
                            self.updated.insert(path, v.clone());
                            Ok(())
                        }
                        ("s", Bson::Document(sub)) => self.walk_sub(sub, parts),
                        _ => Err(Error::new(Code::FailedToParse, format!("an array diff has an unknown field '{k}'"))),
                    };
                    parts.pop();
                    r?;
                }
            }
        }
        Ok(())
    }
}

fn check_depth(depth: usize) -> Result<()> {
    match depth > DIFF_DEPTH_MAX {
        true => Err(Error::new(Code::FailedToParse, "an update diff nests too deeply")),
        false => Ok(()),
    }
}

/// drop, rename and dropDatabase events (and, with showExpandedEvents, create, modify,
/// createIndexes and dropIndexes), each followed by an invalidate when it ends the stream's
/// collection or database.
#[allow(clippy::too_many_arguments)]
fn catalog_events(o: &Document, ui: Option<&Bson>, db: &str, at: Position, wall: &Bson, scope: &Scope, shape: &Shape, out: &mut Vec<Produced>) {
    let Some((name, arg)) = o.iter().next() else { return };
    let expanded = |op_type: &str, coll: &str, description: Document| {
        let mut e = head(op_type, at, wall);
        if let Some(ui) = ui {
            e.insert("collectionUUID", ui.clone());
        }
        e.insert("ns", doc! {"db": db, "coll": coll});
        e.insert("operationDescription", description);
        Produced { at, event: e, invalidates: false, images: Images::default() }
    };
    let invalidate = |out: &mut Vec<Produced>| {
        let at = Position { invalidate: true, ..at };
        out.push(Produced { at, event: head("invalidate", at, wall), invalidates: true, images: Images::default() });
    };
    match (name.as_str(), arg) {
        ("drop", Bson::String(coll)) if scope.covers(db, coll) => {
            let mut e = head("drop", at, wall);
            e.insert("ns", doc! {"db": db, "coll": coll});
            out.push(Produced { at, event: e, invalidates: false, images: Images::default() });
            if matches!(scope, Scope::Collection { .. }) {
                invalidate(out);
            }
        }
        ("renameCollection", Bson::String(from)) => {
            let to = o.get_str("to").unwrap_or("");
            let (Some((fdb, fcoll)), Some((tdb, tcoll))) = (split_ns(from), split_ns(to)) else { return };
            if !scope.covers(fdb, fcoll) && !scope.covers(tdb, tcoll) {
                return;
            }
            let mut e = head("rename", at, wall);
            if let (true, Some(ui)) = (shape.show_expanded_events, ui) {
                e.insert("collectionUUID", ui.clone());
            }
            e.insert("ns", doc! {"db": fdb, "coll": fcoll});
            e.insert("to", doc! {"db": tdb, "coll": tcoll});
            if shape.show_expanded_events {
                let mut desc = doc! {"to": {"db": tdb, "coll": tcoll}};
                if let Some(t) = o.get("dropTarget").filter(|t| !matches!(t, Bson::Boolean(false))) {
                    desc.insert("dropTarget", t.clone());
                }
                e.insert("operationDescription", desc);
            }
            out.push(Produced { at, event: e, invalidates: false, images: Images::default() });
            if matches!(scope, Scope::Collection { .. }) {
                invalidate(out);
            }
        }
        ("dropDatabase", _) if scope.covers_db(db) && !matches!(scope, Scope::Collection { .. }) => {
            let mut e = head("dropDatabase", at, wall);
            e.insert("ns", doc! {"db": db});
            out.push(Produced { at, event: e, invalidates: false, images: Images::default() });
            if matches!(scope, Scope::Database { .. }) {
                invalidate(out);
            }
        }
        ("create", Bson::String(coll)) if shape.show_expanded_events && scope.covers(db, coll) => {
            let mut desc = o.clone();
            desc.remove("create");
            out.push(expanded("create", coll, desc));
        }
        ("collMod", Bson::String(coll)) if shape.show_expanded_events && scope.covers(db, coll) => {
            let mut desc = o.clone();
            desc.remove("collMod");
            out.push(expanded("modify", coll, desc));
        }
        ("createIndexes", Bson::String(coll)) if shape.show_expanded_events && scope.covers(db, coll) => {
            let mut spec = o.clone();
            spec.remove("createIndexes");
            out.push(expanded("createIndexes", coll, doc! {"indexes": [spec]}));
        }
        ("dropIndexes" | "deleteIndexes", Bson::String(coll)) if shape.show_expanded_events && scope.covers(db, coll) => {
            let index = match o.get("index") {
                Some(Bson::String(name)) => doc! {"name": name},
                Some(Bson::Document(spec)) => spec.clone(),
                _ => Document::new(),
            };
            out.push(expanded("dropIndexes", coll, doc! {"indexes": [index]}));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_description_names_paths_as_mongod_does() {
        let diff = doc! {"d": {"gone": false}, "u": {"a": 2}, "i": {"new": true}, "ssub": {"u": {"x": 1}, "sdeep": {"d": {"y": false}}}, "sarr": {"a": true, "l": 2, "u1": "v", "s0": {"u": {"k": 1}}}};
        assert_eq!(
            update_description(&diff, false).unwrap(),
            doc! {
                "updatedFields": {"a": 2, "new": true, "sub.x": 1, "arr.1": "v", "arr.0.k": 1},
                "removedFields": ["gone", "sub.deep.y"],
                "truncatedArrays": [{"field": "arr", "newSize": 2}],
            }
        );
        assert_eq!(update_description(&doc! {"x": 1}, false).unwrap_err().code, Code::FailedToParse.0);
        assert_eq!(update_description(&doc! {"sarr": {"a": true, "uX": 1}}, false).unwrap_err().code, Code::FailedToParse.0);
    }

    #[test]
    fn ambiguous_paths_are_listed_by_their_parts() {
        // `a.1` where 1 is a field; `b.0.1` through an array; `c.d.e` where "d.e" is one field.
        let diff = doc! {"sa": {"u": {"1": 2}}, "sb": {"a": true, "s0": {"d": {"1": false}}}, "sc": {"u": {"d.e": 3}}, "sarr": {"a": true, "u4": 5}};
        let d = update_description(&diff, true).unwrap();
        assert_eq!(d.get_document("disambiguatedPaths").unwrap(), &doc! {"a.1": ["a", "1"], "b.0.1": ["b", 0, "1"], "c.d.e": ["c", "d.e"]});
        assert_eq!(d.get_document("updatedFields").unwrap(), &doc! {"a.1": 2, "c.d.e": 3, "arr.4": 5});
        assert_eq!(update_description(&doc! {"u": {"x": 1}}, true).unwrap().get_document("disambiguatedPaths").unwrap(), &doc! {});
    }
}
