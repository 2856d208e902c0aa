//! Oplog application: make one MongoDB-shaped oplog entry take effect, idempotently, so that
//! applying an entry twice (a fetcher that restarts, an initial sync that overlaps the oplog
//! it then applies) leaves the same data as applying it once. This is what a secondary does
//! with each entry it fetches, and what the applyOps command does.
//!
//! Idempotence, as in mongod's oplog application: inserts and whole-document updates are
//! upserts by `_id`; deleting a missing document succeeds; catalog commands that already took
//! effect (create of an existing collection, drop of a missing one, an index that exists)
//! succeed.

use bson::{Bson, Document};
use common::{Code, Error, Result};
use query::filter::MatchDetails;
use query::update::Update;
use storage::{Collection, IndexSpec, Store};

/// Apply `entry`; the caller makes the result durable (`Store::commit_durable`).
pub fn apply_entry(store: &Store, entry: &Document) -> Result<()> {
    let op = entry.get_str("op").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no string field 'op'"))?;
    let ns = entry.get_str("ns").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no string field 'ns'"))?;
    let o = entry.get_document("o").map_err(|_| Error::new(Code::FailedToParse, "oplog entry has no object field 'o'"))?;
    // The collection's UUID on the member that logged the entry: a collection this creates
    // takes it, so a collection has one UUID across the set.
    let ui = match entry.get("ui") {
        Some(Bson::Binary(b)) => Some(b.to_uuid().map_err(|_| Error::new(Code::FailedToParse, "oplog entry field 'ui' is not a UUID"))?),
        _ => None,
    };
    match op {
        "n" => Ok(()),
        "i" => {
            let coll = collection(store, ns, Some(ui))?.expect("created");
            upsert(&coll, o, true)
        }
        "u" => {
            let id = entry.get_document("o2").ok().and_then(|o2| o2.get("_id")).ok_or_else(|| Error::new(Code::FailedToParse, "update oplog entry has no o2._id"))?;
            let coll = collection(store, ns, Some(ui))?.expect("created");
            update(&coll, id, o)
        }
        "d" => {
            let id = o.get("_id").ok_or_else(|| Error::new(Code::FailedToParse, "delete oplog entry has no o._id"))?;
            let Some(coll) = collection(store, ns, None)? else { return Ok(()) };
            let mut w = coll.writer();
            if let Some((rid, old)) = w.snapshot().find_by_id(id)? {
                w.delete(rid, &old)?;
            }
            Ok(())
        }
        "c" => command(store, ns, o, ui),
        other => Err(Error::new(Code::FailedToParse, format!("unknown oplog operation type '{other}'"))),
    }
}

/// `db.coll` split; the collection, created when missing and `create` is given (with the
/// entry's UUID, if it has one).
fn collection(store: &Store, ns: &str, create: Option<Option<bson::Uuid>>) -> Result<Option<Collection>> {
    let (db, name) = ns.split_once('.').ok_or_else(|| Error::new(Code::InvalidNamespace, format!("invalid namespace in oplog entry: {ns}")))?;
    match (store.collection(db, name), create) {
        (Some(c), _) => Ok(Some(c)),
        (None, Some(uuid)) => Ok(Some(store.create_collection_as(db, name, Document::new(), uuid, true)?)),
        (None, None) => Ok(None),
    }
}

/// Insert `doc`, or replace the document with its `_id`. For an insert entry the insert
/// is tried first (`insert_first`), as mongod's applier does: nearly every such entry needs
/// it, and its unique check finds an existing `_id` without a lookup of its own.
fn upsert(coll: &Collection, doc: &Document, insert_first: bool) -> Result<()> {
    let id = doc.get("_id").ok_or_else(|| Error::new(Code::FailedToParse, "insert oplog entry has no o._id"))?;
    let mut w = coll.writer();
    if insert_first {
        match w.insert(doc) {
            Err(e) if e.code == Code::DuplicateKey.0 => {}
            other => return other.map(|_| ()),
        }
    }
    match w.snapshot().find_by_id(id)? {
        Some((rid, old)) => w.update(rid, &old, doc),
        None => w.insert(doc).map(|_| ()),
    }
}

fn update(coll: &Collection, id: &Bson, o: &Document) -> Result<()> {
    if o.contains_key("$v") && o.contains_key("diff") {
        return Err(Error::new(Code::CommandNotSupported, "oplog update entries in delta format ($v: 2) are not supported yet"));
    }
    let modifier = o.keys().next().is_some_and(|k| k.starts_with('$'));
    if !modifier {
        // A whole document (what shoal logs): an upsert, with the entry's _id.
        let mut doc = o.clone();
        if !doc.contains_key("_id") {
            doc.insert("_id", id.clone());
        }
        return upsert(coll, &doc, false);
    }
    let u = Update::parse(&Bson::Document(o.clone()), None)?;
    let mut w = coll.writer();
    let Some((rid, old)) = w.snapshot().find_by_id(id)? else {
        return Err(Error::new(Code::NoMatchingDocument, format!("cannot apply an update operator to a missing document: _id {id}")));
    };
    let new = u.apply(&old, &MatchDetails::default(), false)?;
    w.update(rid, &old, &new)
}

fn command(store: &Store, ns: &str, o: &Document, ui: Option<bson::Uuid>) -> Result<()> {
    let db = ns.strip_suffix(".$cmd").ok_or_else(|| Error::new(Code::InvalidNamespace, format!("command oplog entry on {ns}, not on db.$cmd")))?;
    let (name, arg) = o.iter().next().ok_or_else(|| Error::new(Code::FailedToParse, "empty command in oplog entry"))?;
    let coll_name = || arg.as_str().ok_or_else(|| Error::new(Code::FailedToParse, format!("oplog {name} needs a collection name")));
    match name.as_str() {
        "create" => {
            let mut options = o.clone();
            options.remove("create");
            match store.create_collection_as(db, coll_name()?, options, ui, false) {
                Err(e) if e.code == Code::NamespaceExists.0 => Ok(()),
                other => other.map(|_| ()),
            }
        }
        "drop" => store.drop_collection(db, coll_name()?).map(|_| ()),
        "dropDatabase" => store.drop_database(db),
        "createIndexes" => {
            let coll = collection(store, &format!("{db}.{}", coll_name()?), Some(ui))?.expect("created");
            let mut spec = o.clone();
            spec.remove("createIndexes");
            coll.create_index(IndexSpec::from_spec(spec)?).map(|_| ())
        }
        "dropIndexes" | "deleteIndexes" => {
            let Some(coll) = store.collection(db, coll_name()?) else { return Ok(()) };
            let index = o.get_str("index").map_err(|_| Error::new(Code::FailedToParse, "oplog dropIndexes needs an index name"))?;
            match coll.drop_index(index) {
                Err(e) if e.code == Code::IndexNotFound.0 => Ok(()),
                other => other,
            }
        }
        "renameCollection" => {
            let from = coll_name()?;
            let to = o.get_str("to").map_err(|_| Error::new(Code::FailedToParse, "oplog renameCollection needs 'to'"))?;
            let split = |ns: &str| ns.split_once('.').map(|(d, c)| (d.to_string(), c.to_string()));
            let ((from_db, from_c), (to_db, to_c)) = match (split(from), split(to)) {
                (Some(f), Some(t)) => (f, t),
                _ => return Err(Error::new(Code::InvalidNamespace, "oplog renameCollection needs full namespaces")),
            };
            let drop_target = !matches!(o.get("dropTarget"), None | Some(Bson::Boolean(false)));
            if store.collection(&from_db, &from_c).is_none() && store.collection(&to_db, &to_c).is_some() {
                return Ok(()); // already renamed
            }
            store.rename_collection(&from_db, &from_c, &to_db, &to_c, drop_target)
        }
        other => Err(Error::new(Code::CommandNotSupported, format!("applying oplog command '{other}' is not supported yet"))),
    }
}
