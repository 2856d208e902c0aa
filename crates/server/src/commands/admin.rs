//! Catalog and statistics commands: listDatabases, listCollections, listIndexes, create, drop,
//! dropDatabase, renameCollection, collStats, dbStats, validate, createIndexes, dropIndexes.

use super::{cursor_reply, Ctx};
use bson::{doc, Bson, Document};
use common::value::as_i64;
use common::value::check_fields;
use common::{Code, Error, Result};
use storage::IndexSpec;

/// Largest capped collection (MongoDB: 1 PB).
const CAPPED_SIZE_BYTES_MAX: i64 = 1 << 50;

fn scale(ctx: &Ctx) -> Result<i64> {
    match ctx.cmd.get("scale") {
        None => Ok(1),
        Some(v) => match as_i64(v) {
            Some(s) if s >= 1 => Ok(s),
            _ => Err(Error::bad_value("Scale factor must be greater than zero")),
        },
    }
}

pub fn list_databases(ctx: &mut Ctx) -> Result<Document> {
    check_fields("listDatabases", ctx.cmd, &["filter", "nameOnly", "authorizedDatabases"])?;
    let filter = match ctx.doc_arg("filter")? {
        Some(f) => Some(query::filter::Filter::parse(f)?),
        None => None,
    };
    let name_only = ctx.bool_arg("nameOnly")?.unwrap_or(false);
    // Under authorization, a user without the cluster-wide listDatabases action sees the
    // databases their roles name (mongod's authorizedDatabases default), or is refused when
    // asking for all.
    let visible: Option<Vec<String>> =
        if ctx.shared.auth.enabled && !crate::auth::is_authorized(ctx.conn, "listDatabases", &crate::auth::roles::Resource::Cluster) {
            if ctx.bool_arg("authorizedDatabases")? == Some(false) {
                return Err(Error::new(Code::Unauthorized, "Insufficient permissions to list all databases"));
            }
            Some(
                ctx.conn
                    .auth
                    .user
                    .as_ref()
                    .map(|u| {
                        u.grants
                            .builtin
                            .iter()
                            .filter_map(|(r, d)| crate::auth::roles::database_of(r, d))
                            .chain(u.grants.privileges.iter().filter_map(|p| p.resource.database().map(String::from)))
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        } else {
            None
        };
    let mut dbs = Vec::new();
    let mut total: i64 = 0;
    for name in ctx.shared.store.database_names() {
        if visible.as_ref().is_some_and(|v| !v.contains(&name)) {
            continue;
        }
        let d = if name_only {
            doc! { "name": name.clone() }
        } else {
            let stats = ctx.shared.store.database_stats(&name);
            let size = stats.storage_size_bytes.max(1) as i64 + stats.index_size_bytes as i64;
            doc! { "name": name.clone(), "sizeOnDisk": size, "empty": stats.objects == 0 }
        };
        if filter.as_ref().map(|f| f.matches(&d)).unwrap_or(true) {
            total += d.get_i64("sizeOnDisk").unwrap_or(0);
            dbs.push(Bson::Document(d));
        }
    }
    if name_only {
        return Ok(doc! { "databases": dbs });
    }
    Ok(doc! { "databases": dbs, "totalSize": total, "totalSizeMb": total / (1024 * 1024) })
}

fn collection_info(meta: &storage::CollectionMeta, name_only: bool) -> Document {
    if name_only {
        return doc! { "name": meta.name.clone(), "type": "collection" };
    }
    let id_index =
        meta.indexes.iter().find(|i| i.name == "_id_").map(|i| i.spec.clone()).unwrap_or_else(|| doc! { "v": 2, "key": { "_id": 1 }, "name": "_id_" });
    doc! {
        "name": meta.name.clone(),
        "type": "collection",
        "options": meta.options.clone(),
        "info": { "readOnly": false, "uuid": Bson::Binary(bson::Binary::from_uuid(meta.uuid)) },
        "idIndex": id_index,
    }
}

pub fn list_collections(ctx: &mut Ctx) -> Result<Document> {
    check_fields("listCollections", ctx.cmd, &["filter", "nameOnly", "authorizedCollections", "cursor", "includePendingDrops"])?;
    let filter = match ctx.doc_arg("filter")? {
        Some(f) => Some(query::filter::Filter::parse(f)?),
        None => None,
    };
    let name_only = ctx.bool_arg("nameOnly")?.unwrap_or(false);
    let mut out = Vec::new();
    for meta in ctx.shared.store.list_collections(ctx.db) {
        let info = collection_info(&meta, false);
        if filter.as_ref().map(|f| f.matches(&info)).unwrap_or(true) {
            out.push(if name_only { collection_info(&meta, true) } else { info });
        }
    }
    Ok(cursor_reply(&format!("{}.$cmd.listCollections", ctx.db), 0, out, true))
}

pub fn list_indexes(ctx: &mut Ctx) -> Result<Document> {
    check_fields("listIndexes", ctx.cmd, &["cursor", "includeBuildUUIDs", "includeIndexBuildInfo"])?;
    let name = ctx.collection_name()?;
    let coll = ctx.store().collection(ctx.db, name).ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("ns does not exist: {}", ctx.ns(name))))?;
    let specs = coll.meta().indexes.into_iter().map(|i| i.spec).collect();
    Ok(cursor_reply(&ctx.ns(name), 0, specs, true))
}

pub fn create(ctx: &mut Ctx) -> Result<Document> {
    let name = ctx.collection_name()?.to_string();
    let mut options = Document::new();
    for (k, v) in ctx.cmd.iter().skip(1) {
        match k.as_str() {
            k if common::value::GENERIC_ARGS.contains(&k) => {}
            // Options shoal stores and honours (nothing to enforce for these).
            "validationLevel" | "validationAction" | "storageEngine" | "indexOptionDefaults" | "idIndex" => {
                options.insert(k, v.clone());
            }
            "capped" => {
                if ctx.bool_arg("capped")?.unwrap_or(false) {
                    options.insert("capped", true);
                }
            }
            "size" | "max" => {
                let n = as_i64(v).ok_or_else(|| {
                    Error::type_mismatch(format!("BSON field 'create.{k}' is the wrong type '{}', expected a number", common::value::type_name(v)))
                })?;
                if n < 0 {
                    return Err(Error::bad_value(format!("the '{k}' field of a capped collection must not be negative")));
                }
                options.insert(k, n);
            }
            "viewOn" | "pipeline" => return Err(Error::new(Code::CommandNotSupported, "views are not supported by shoal yet")),
            "validator" => return Err(Error::new(Code::CommandNotSupported, "document validation is not supported by shoal yet")),
            storage::PRE_AND_POST_IMAGES_OPTION => {
                if pre_and_post_images_enabled(ctx.db, "create", v)? {
                    options.insert(k, doc! {"enabled": true});
                }
            }
            "timeseries" | "clusteredIndex" | "expireAfterSeconds" | "collation" | "encryptedFields" => {
                return Err(Error::new(Code::CommandNotSupported, format!("create option '{k}' is not supported by shoal yet")))
            }
            "autoIndexId" | "flags" | "temp" => {}
            other => return Err(Error::location(40415, format!("BSON field 'create.{other}' is an unknown field."))),
        }
    }
    if options.get_bool("capped").unwrap_or(false) {
        // MongoDB rounds a capped size up to a multiple of 256 bytes; size is required.
        let size = match options.get("size").and_then(as_i64) {
            Some(s) if s > 0 => s,
            _ => return Err(Error::new(Code::InvalidOptions, "the 'size' field is required when 'capped' is true")),
        };
        if size > CAPPED_SIZE_BYTES_MAX {
            return Err(Error::new(Code::InvalidOptions, format!("capped collection size must be at most {CAPPED_SIZE_BYTES_MAX} bytes")));
        }
        options.insert("size", (size + 255) / 256 * 256);
        if options.get("max").and_then(as_i64) == Some(0) {
            options.remove("max");
        }
    } else {
        for k in ["size", "max"] {
            if options.contains_key(k) {
                return Err(Error::new(Code::InvalidOptions, format!("the '{k}' option is only allowed for capped collections")));
            }
        }
    }
    ctx.store().create_collection(ctx.db, &name, options)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

/// `changeStreamPreAndPostImages: {enabled: <bool>}` of `cmd` (create or collMod) on
/// database `db`: whether it enables them.
fn pre_and_post_images_enabled(db: &str, cmd: &str, v: &Bson) -> Result<bool> {
    let field = storage::PRE_AND_POST_IMAGES_OPTION;
    let Bson::Document(d) = v else {
        return Err(Error::type_mismatch(format!("BSON field '{cmd}.{field}' is the wrong type '{}', expected type 'object'", common::value::type_name(v))));
    };
    let mut enabled = None;
    for (k, v) in d {
        match (k.as_str(), v) {
            ("enabled", Bson::Boolean(b)) => enabled = Some(*b),
            ("enabled", v) => {
                return Err(Error::type_mismatch(format!(
                    "BSON field '{field}.enabled' is the wrong type '{}', expected type 'bool'",
                    common::value::type_name(v)
                )))
            }
            (k, _) => return Err(Error::location(40415, format!("BSON field '{field}.{k}' is an unknown field."))),
        }
    }
    let enabled = enabled.ok_or_else(|| Error::location(40414, format!("BSON field '{field}.enabled' is missing but a required field")))?;
    if enabled && matches!(db, "admin" | "config" | "local") {
        return Err(Error::new(Code::InvalidOptions, format!("{field} collection option is not supported on config, local or admin databases")));
    }
    Ok(enabled)
}

/// `collMod`: the collection options shoal keeps (pre- and post-images for change streams,
/// and the validation settings it stores), logged so that every member and change stream
/// sees the change. Options of features shoal lacks are refused.
pub fn coll_mod(ctx: &mut Ctx) -> Result<Document> {
    let name = ctx.collection_name()?.to_string();
    let mut changes = Document::new();
    for (k, v) in ctx.cmd.iter().skip(1) {
        match k.as_str() {
            k if common::value::GENERIC_ARGS.contains(&k) => {}
            storage::PRE_AND_POST_IMAGES_OPTION => {
                let enabled = pre_and_post_images_enabled(ctx.db, "collMod", v)?;
                changes.insert(k, doc! {"enabled": enabled});
            }
            "validationLevel" | "validationAction" => {
                changes.insert(k, v.clone());
            }
            "validator" | "index" | "viewOn" | "pipeline" | "expireAfterSeconds" | "timeseries" | "cappedSize" | "cappedMax" | "dryRun" => {
                return Err(Error::new(Code::CommandNotSupported, format!("collMod option '{k}' is not supported by shoal yet")))
            }
            other => return Err(Error::location(40415, format!("BSON field 'collMod.{other}' is an unknown field."))),
        }
    }
    ctx.store().modify_collection(ctx.db, &name, &changes)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

pub fn drop(ctx: &mut Ctx) -> Result<Document> {
    let name = ctx.collection_name()?.to_string();
    let ns = ctx.ns(&name);
    let n_indexes = ctx.store().collection(ctx.db, &name).map(|c| c.meta().indexes.len() as i32);
    ctx.shared.cursors.kill_ns(&ns);
    match n_indexes {
        Some(n) => {
            ctx.store().drop_collection(ctx.db, &name)?;
            ctx.commit_write()?;
            Ok(doc! { "nIndexesWas": n, "ns": ns })
        }
        // MongoDB 7.0: dropping a missing collection succeeds.
        None => Ok(Document::new()),
    }
}

pub fn drop_database(ctx: &mut Ctx) -> Result<Document> {
    for meta in ctx.shared.store.list_collections(ctx.db) {
        ctx.shared.cursors.kill_ns(&format!("{}.{}", ctx.db, meta.name));
    }
    ctx.store().drop_database(ctx.db)?;
    ctx.commit_write()?;
    Ok(doc! { "dropped": ctx.db })
}

fn split_ns(ns: &str) -> Result<(&str, &str)> {
    match ns.split_once('.') {
        Some((db, coll)) if !db.is_empty() && !coll.is_empty() => Ok((db, coll)),
        _ => Err(Error::new(Code::InvalidNamespace, format!("Invalid namespace specified '{ns}'"))),
    }
}

pub fn rename_collection(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "renameCollection may only be run against the admin database."));
    }
    check_fields("renameCollection", ctx.cmd, &["to", "dropTarget", "stayTemp"])?;
    let from = ctx.collection_name()?.to_string();
    let to = ctx.str_arg("to")?.ok_or_else(|| Error::location(40414, "BSON field 'renameCollection.to' is missing but a required field"))?.to_string();
    let drop_target = ctx.bool_arg("dropTarget")?.unwrap_or(false);
    let (from_db, from_coll) = split_ns(&from)?;
    let (to_db, to_coll) = split_ns(&to)?;
    if from == to {
        return Err(Error::new(Code::IllegalOperation, "Can't rename a collection to itself"));
    }
    ctx.store().rename_collection(from_db, from_coll, to_db, to_coll, drop_target)?;
    ctx.shared.cursors.kill_ns(&from);
    ctx.commit_write()?;
    Ok(Document::new())
}

pub fn coll_stats(ctx: &mut Ctx) -> Result<Document> {
    let name = ctx.collection_name()?.to_string();
    let scale = scale(ctx)?;
    let ns = ctx.ns(&name);
    let coll = ctx.store().collection(ctx.db, &name).ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("Collection [{ns}] not found.")))?;
    Ok(coll_stats_doc(&ns, &coll, scale))
}

pub fn coll_stats_doc(ns: &str, coll: &storage::Collection, scale: i64) -> Document {
    let s = coll.stats();
    let mut index_sizes = Document::new();
    let mut total_index: i64 = 0;
    for (name, size) in &s.index_sizes {
        index_sizes.insert(name.clone(), *size as i64 / scale);
        total_index += *size as i64;
    }
    let storage_size = s.storage_size_bytes.max(4096) as i64;
    let avg = s.size_bytes.checked_div(s.count).unwrap_or(0) as i64;
    let mut out = doc! {
        "ns": ns,
        "size": s.size_bytes as i64 / scale,
        "count": s.count as i64,
        "avgObjSize": avg,
        "storageSize": storage_size / scale,
        "freeStorageSize": 0i64,
        "capped": coll.is_capped(),
        "nindexes": s.index_sizes.len() as i32,
        "indexBuilds": [],
        "totalIndexSize": total_index / scale,
        "totalSize": (storage_size + total_index) / scale,
        "indexSizes": index_sizes,
        "scaleFactor": scale,
    };
    if coll.is_capped() {
        // A capped collection's bounds, as mongod reports them.
        let options = coll.meta().options;
        if let Some(max) = options.get("max").and_then(as_i64) {
            out.insert("max", max);
        }
        if let Some(size) = options.get("size").and_then(as_i64) {
            out.insert("maxSize", size / scale);
        }
    }
    out
}

pub fn db_stats(ctx: &mut Ctx) -> Result<Document> {
    let scale = scale(ctx)?;
    let s = ctx.shared.store.database_stats(ctx.db);
    let avg = s.data_size_bytes.checked_div(s.objects).unwrap_or(0) as f64;
    let storage = if s.collections > 0 { s.storage_size_bytes.max(4096) } else { 0 } as i64;
    Ok(doc! {
        "db": ctx.db,
        "collections": s.collections as i64,
        "views": 0i64,
        "objects": s.objects as i64,
        "avgObjSize": avg,
        "dataSize": (s.data_size_bytes as i64 / scale) as f64,
        "storageSize": (storage / scale) as f64,
        "indexes": s.indexes as i64,
        "indexSize": (s.index_size_bytes as i64 / scale) as f64,
        "totalSize": ((storage + s.index_size_bytes as i64) / scale) as f64,
        "scaleFactor": scale,
        "fsUsedSize": 0.0,
        "fsTotalSize": 0.0,
    })
}

pub fn validate(ctx: &mut Ctx) -> Result<Document> {
    check_fields("validate", ctx.cmd, &["full", "repair", "metadata", "checkBSONConformance", "background", "scandata"])?;
    let name = ctx.collection_name()?.to_string();
    let ns = ctx.ns(&name);
    if ctx.bool_arg("repair")?.unwrap_or(false) {
        return Err(Error::new(Code::CommandNotSupported, "validate with repair is not supported"));
    }
    let coll = ctx
        .shared
        .store
        .collection(ctx.db, &name)
        .ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("Collection '{ns}' does not exist to validate.")))?;
    let r = coll.validate();
    let mut keys = Document::new();
    let mut details = Document::new();
    for (n, k) in &r.keys_per_index {
        keys.insert(n.clone(), *k as i64);
        details.insert(n.clone(), doc! { "valid": r.valid });
    }
    Ok(doc! {
        "ns": ns,
        "uuid": Bson::Binary(bson::Binary::from_uuid(coll.meta().uuid)),
        "nInvalidDocuments": 0i64,
        "nNonCompliantDocuments": 0i64,
        "nrecords": r.records as i64,
        "nIndexes": r.keys_per_index.len() as i32,
        "keysPerIndex": keys,
        "indexDetails": details,
        "valid": r.valid,
        "repaired": false,
        "warnings": [],
        "errors": r.errors.clone(),
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
    })
}

fn parse_index_spec(v: &Bson) -> Result<IndexSpec> {
    let Bson::Document(spec) = v else {
        return Err(Error::type_mismatch("The field 'indexes' must be an array of objects"));
    };
    let key = match spec.get("key") {
        Some(Bson::Document(k)) if !k.is_empty() => k.clone(),
        Some(Bson::Document(_)) => return Err(Error::new(Code::CannotCreateIndex, "Index keys cannot be empty.")),
        _ => return Err(Error::new(Code::FailedToParse, "The 'key' field is a required property of an index specification")),
    };
    for (field, dir) in &key {
        let ok = match dir {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => as_i64(dir) != Some(0) || matches!(dir, Bson::Double(d) if *d != 0.0),
            // Hashed keys are validated (one per index, never unique) by storage.
            Bson::String(s) if s == "hashed" => true,
            Bson::String(s) => return Err(Error::new(Code::CannotCreateIndex, format!("Index type '{s}' on field '{field}' is not supported by shoal yet"))),
            _ => false,
        };
        if !ok || field.is_empty() {
            return Err(Error::new(
                Code::CannotCreateIndex,
                format!("Values in the index key pattern can only be numbers or strings; bad key: {field}: {dir}"),
            ));
        }
    }
    let name = match spec.get("name") {
        Some(Bson::String(n)) if !n.is_empty() => n.clone(),
        Some(_) => return Err(Error::new(Code::CannotCreateIndex, "index name must be a non-empty string")),
        None => return Err(Error::new(Code::FailedToParse, "The 'name' field is a required property of an index specification")),
    };
    let mut full = doc! { "v": 2, "key": key.clone(), "name": name.clone() };
    let mut unique = false;
    let mut sparse = false;
    let mut partial = None;
    let mut ttl = None;
    for (k, v) in spec {
        match k.as_str() {
            "key" | "name" | "v" | "ns" => {}
            "unique" => {
                unique = v.as_bool().unwrap_or(as_i64(v).unwrap_or(0) != 0);
                if unique {
                    full.insert("unique", true);
                }
            }
            "sparse" => {
                sparse = v.as_bool().unwrap_or(as_i64(v).unwrap_or(0) != 0);
                if sparse {
                    full.insert("sparse", true);
                }
            }
            "partialFilterExpression" => match v {
                Bson::Document(d) => {
                    query::filter::Filter::parse(d)?;
                    partial = Some(d.clone());
                    full.insert("partialFilterExpression", d.clone());
                }
                _ => return Err(Error::type_mismatch("partialFilterExpression must be an object")),
            },
            "expireAfterSeconds" => {
                let secs = as_i64(v).ok_or_else(|| Error::new(Code::CannotCreateIndex, "TTL index 'expireAfterSeconds' option must be numeric"))?;
                ttl = Some(secs);
                full.insert("expireAfterSeconds", secs);
            }
            "background" | "hidden" => {
                full.insert(k.clone(), v.clone());
            }
            // A valid option, and one that would order the index's strings otherwise.
            "collation" => super::crud::check_collation(v)?,
            other => {
                return Err(Error::new(
                    Code::InvalidIndexSpecificationOption,
                    format!("The field '{other}' is not valid for an index specification. Specification: {spec}"),
                ))
            }
        }
    }
    Ok(IndexSpec { name, key, unique, sparse, partial_filter: partial, expire_after_seconds: ttl, spec: full })
}

pub fn create_indexes(ctx: &mut Ctx) -> Result<Document> {
    check_fields("createIndexes", ctx.cmd, &["indexes", "commitQuorum", "ignoreUnknownIndexOptions", "isTimeseriesNamespace"])?;
    let name = ctx.collection_name()?.to_string();
    let specs = ctx.array_arg("indexes")?.ok_or_else(|| Error::location(40414, "BSON field 'createIndexes.indexes' is missing but a required field"))?;
    if specs.is_empty() {
        return Err(Error::bad_value("Must specify at least one index to create"));
    }
    let specs: Vec<IndexSpec> = specs.iter().map(parse_index_spec).collect::<Result<_>>()?;
    let existed = ctx.store().collection(ctx.db, &name).is_some();
    let coll = ctx.store().collection_or_create(ctx.db, &name)?;
    let before = coll.meta().indexes.len() as i32;
    for spec in specs {
        ctx.op.check()?;
        coll.create_index(spec)?;
    }
    let after = coll.meta().indexes.len() as i32;
    ctx.commit_write()?;
    let mut r = doc! { "numIndexesBefore": before, "numIndexesAfter": after, "createdCollectionAutomatically": !existed };
    if before == after {
        r.insert("note", "all indexes already exist");
    }
    Ok(r)
}

pub fn drop_indexes(ctx: &mut Ctx) -> Result<Document> {
    check_fields(ctx.name, ctx.cmd, &["index"])?;
    let name = ctx.collection_name()?.to_string();
    let ns = ctx.ns(&name);
    let coll = ctx.store().collection(ctx.db, &name).ok_or_else(|| Error::new(Code::NamespaceNotFound, format!("ns not found {ns}")))?;
    let meta = coll.meta();
    let n_was = meta.indexes.len() as i32;
    let targets: Vec<String> = match ctx.cmd.get("index") {
        Some(Bson::String(s)) if s == "*" => meta.indexes.iter().filter(|i| i.name != "_id_").map(|i| i.name.clone()).collect(),
        Some(Bson::String(s)) => vec![s.clone()],
        Some(Bson::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| Error::type_mismatch("dropIndexes index names must be strings")))
            .collect::<Result<_>>()?,
        Some(Bson::Document(key)) => match meta.indexes.iter().find(|i| &i.key == key) {
            Some(i) => vec![i.name.clone()],
            None => return Err(Error::new(Code::IndexNotFound, format!("can't find index with key: {key}"))),
        },
        _ => return Err(Error::location(40414, "BSON field 'dropIndexes.index' is missing but a required field")),
    };
    for t in &targets {
        if !meta.indexes.iter().any(|i| &i.name == t) {
            return Err(Error::new(Code::IndexNotFound, format!("index not found with name [{t}]")));
        }
    }
    for t in targets {
        coll.drop_index(&t)?;
    }
    ctx.commit_write()?;
    Ok(doc! { "nIndexesWas": n_was })
}
