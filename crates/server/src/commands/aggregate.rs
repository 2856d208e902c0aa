//! The aggregate command: feed a collection scan into the pure pipeline of the `query` crate.
//! Stages that need the catalog (`$collStats`) are answered here.

use super::Ctx;
use crate::cursor::{Cursor, Source, FIRST_BATCH_DOCS_DEFAULT};
use bson::{doc, Bson, DateTime, Document};
use common::value::check_fields;
use common::{Code, Error, Result};
use query::agg::{Pipeline, RunOptions, Stage};

pub fn aggregate(ctx: &mut Ctx) -> Result<Document> {
    check_fields(
        "aggregate",
        ctx.cmd,
        &[
            "pipeline",
            "cursor",
            "explain",
            "allowDiskUse",
            "bypassDocumentValidation",
            "hint",
            "collation",
            "let",
            "fromMongos",
            "needsMerge",
            "isMapReduceCommand",
        ],
    )?;
    let coll_name = match ctx.cmd.get("aggregate") {
        Some(Bson::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) if common::value::as_i64(v) == Some(1) => None,
        _ => return Err(Error::new(Code::InvalidNamespace, "Invalid input namespace: aggregate's first field must be a collection name or 1")),
    };
    let stages = ctx.array_arg("pipeline")?.ok_or_else(|| Error::location(40414, "BSON field 'aggregate.pipeline' is missing but a required field"))?;
    let stages: Vec<Document> = stages
        .iter()
        .map(|s| s.as_document().cloned().ok_or_else(|| Error::type_mismatch("Each element of the 'pipeline' array must be an object")))
        .collect::<Result<_>>()?;
    if ctx.bool_arg("explain")?.unwrap_or(false) {
        return Err(Error::new(Code::CommandNotSupported, "aggregate explain is not supported by shoal yet"));
    }
    let batch_size = match ctx.doc_arg("cursor")? {
        Some(c) => match c.get("batchSize") {
            Some(v) => match common::value::as_i64(v) {
                Some(b) if b >= 0 => b as usize,
                _ => return Err(Error::location(51024, "BSON field 'batchSize' value must be >= 0")),
            },
            None => FIRST_BATCH_DOCS_DEFAULT,
        },
        None => return Err(Error::failed_to_parse("The 'cursor' option is required, except for aggregate with the explain argument")),
    };
    let allow_disk_use = ctx.bool_arg("allowDiskUse")?.unwrap_or(false);
    if let Some(c) = ctx.cmd.get("collation") {
        super::crud::check_collation(c)?;
    }
    let vars = ctx.let_vars()?;
    let stages = if vars.is_empty() { stages } else { vars.pipeline(&stages) };
    let pipeline = Pipeline::parse(&stages)?;
    let ns = match &coll_name {
        Some(c) => ctx.ns(c),
        None => format!("{}.$cmd.aggregate", ctx.db),
    };

    // Catalog stages are answered here; a leading $collStats produces the pipeline's input.
    let mut input_override: Option<Vec<Document>> = None;
    let mut rest = Vec::new();
    for (i, stage) in pipeline.stages.into_iter().enumerate() {
        match stage {
            Stage::External(name, spec) if name == "$collStats" && i == 0 => {
                let Some(c) = &coll_name else {
                    return Err(Error::location(40602, "$collStats must be run against a collection"));
                };
                input_override = Some(vec![coll_stats_stage(ctx, c, &spec)?]);
            }
            Stage::External(name, spec) if name == "$listLocalSessions" => {
                if i != 0 || coll_name.is_some() {
                    return Err(Error::new(Code::InvalidNamespace, "$listLocalSessions must be the first stage of an {aggregate: 1}"));
                }
                let current = ctx.conn.auth.user.as_ref().map(|u| (u.user.as_str(), u.db.as_str()));
                let users = access::sessions::list_spec(&Bson::Document(spec), current)?;
                input_override = Some(ctx.shared.sessions.list(users.as_deref()));
            }
            Stage::External(name, spec) if name == "$changeStream" => {
                if i != 0 {
                    return Err(Error::location(40602, "$changeStream is only valid as the first stage in a pipeline"));
                }
                return crate::change_stream::open(ctx, coll_name.as_deref(), &spec, &stages[1..], batch_size);
            }
            Stage::External(name, _) if name == "$changeStreamSplitLargeEvent" => {
                return Err(Error::new(Code::IllegalOperation, "$changeStreamSplitLargeEvent can only be used in a $changeStream pipeline"));
            }
            Stage::External(name, _) if name == "$shardedDataDistribution" => {
                return Err(Error::location(6789101, "The $shardedDataDistribution stage can only be run on mongoS"));
            }
            Stage::External(name, _) => {
                return Err(Error::new(Code::CommandNotSupported, format!("{name} is not supported by shoal yet")));
            }
            s => rest.push(s),
        }
    }
    let pipeline = Pipeline { stages: rest };
    let opts = RunOptions { allow_disk_use, mem_limit_bytes: common::limits::AGG_MEMORY_BYTES_MAX };
    let results = match input_override {
        Some(docs) => pipeline.run_interruptible(&mut docs.into_iter().map(Ok), &opts, &|| ctx.op.check())?,
        None => match coll_name.as_deref().and_then(|c| ctx.store().collection(ctx.db, c)) {
            Some(coll) => {
                let leading = pipeline.leading_match().unwrap_or_default();
                let (mut scan, _) = ctx.planned_scan(coll.snapshot(), &leading, None, ctx.cmd.get("hint"), None)?;
                let op = ctx.op;
                let mut input = std::iter::from_fn(|| scan.next(op).transpose().map(|r| r.map(|(_, d, _)| d)));
                pipeline.run_interruptible(&mut input, &opts, &|| op.check())?
            }
            None => pipeline.run_interruptible(&mut std::iter::empty(), &opts, &|| ctx.op.check())?,
        },
    };
    let mut cursor = Cursor::new(ns.clone(), Source::Buffered(results.into()));
    cursor.lsid = ctx.lsid();
    let (batch, done) = cursor.next_batch(batch_size, ctx.op)?;
    let id = if done { 0 } else { ctx.register_cursor(cursor)? };
    Ok(super::cursor_batch_reply(ctx, &ns, id, batch, true))
}

fn coll_stats_stage(ctx: &Ctx, coll: &str, spec: &Document) -> Result<Document> {
    let ns = ctx.ns(coll);
    let mut out = doc! { "ns": ns.clone(), "host": ctx.shared.host_port(), "localTime": DateTime::now() };
    let c = ctx.store().collection(ctx.db, coll);
    for (k, v) in spec {
        match k.as_str() {
            "storageStats" => {
                let Some(c) = &c else {
                    return Err(Error::new(
                        Code::NamespaceNotFound,
                        format!("Unable to retrieve storageStats in $collStats stage :: caused by :: Collection [{ns}] not found."),
                    ));
                };
                let scale = v.as_document().and_then(|d| d.get("scale")).and_then(common::value::as_i64).unwrap_or(1).max(1);
                out.insert("storageStats", super::admin::coll_stats_doc(&ns, c, scale));
            }
            "count" => {
                let n = match &c {
                    Some(c) => c.snapshot().count()? as i64,
                    None => 0,
                };
                out.insert("count", n);
            }
            "latencyStats" | "queryExecStats" => {
                return Err(Error::new(Code::CommandNotSupported, format!("$collStats.{k} is not supported by shoal yet")));
            }
            other => return Err(Error::location(40415, format!("BSON field '$collStats.{other}' is an unknown field."))),
        }
    }
    Ok(out)
}
