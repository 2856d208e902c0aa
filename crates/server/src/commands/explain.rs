//! The explain command for find, count, distinct and aggregate: the chosen plan in MongoDB's
//! queryPlanner shape, and with executionStats the plan run to completion with its counters.

use super::Ctx;
use crate::exec::planned_scan;
use crate::plan::{Access, Plan};
use bson::{doc, Bson, Document};
use common::value::check_fields;
use common::{Code, Error, Result};
use query::sort::SortSpec;
use std::time::Instant;

fn index_stage(p: &crate::plan::IndexPlan) -> Document {
    doc! {
        "stage": "IXSCAN",
        "keyPattern": p.index.key.clone(),
        "indexName": p.index.name.clone(),
        "isMultiKey": p.multikey,
        "isUnique": p.index.unique,
        "isSparse": p.index.sparse,
        "isPartial": p.index.partial_filter.is_some(),
        "indexVersion": 2,
        "direction": if p.reverse { "backward" } else { "forward" },
        "indexBounds": p.bounds_display.clone(),
    }
}

/// The stage tree of a plan, innermost access stage first wrapped by sort/skip/limit/projection.
/// `sort_memory_bytes_max`: the blocking sort's limit, shown as its memLimit.
fn plan_tree(plan: &Plan, filter: &Document, sort: &Document, skip: i64, limit: i64, projection: Option<&Document>, sort_memory_bytes_max: usize) -> Document {
    let mut stage = match &plan.access {
        Access::CollScan { reverse } => {
            let mut d = doc! { "stage": "COLLSCAN" };
            if !filter.is_empty() {
                d.insert("filter", filter.clone());
            }
            d.insert("direction", if *reverse { "backward" } else { "forward" });
            d
        }
        Access::IdPoint(_) => doc! { "stage": "IDHACK" },
        // Covered: the projection reads the index entries; no FETCH.
        Access::IndexScan(p) if p.covered => index_stage(p),
        Access::IndexScan(p) => {
            let mut d = doc! { "stage": "FETCH" };
            if !filter.is_empty() {
                d.insert("filter", filter.clone());
            }
            d.insert("inputStage", index_stage(p));
            d
        }
    };
    if !sort.is_empty() && !plan.provides_sort {
        let mut s = doc! { "stage": "SORT", "sortPattern": sort.clone(), "memLimit": sort_memory_bytes_max as i64, "type": "simple" };
        if limit > 0 {
            s.insert("limitAmount", limit + skip);
        }
        s.insert("inputStage", stage);
        stage = s;
    }
    if skip > 0 {
        stage = doc! { "stage": "SKIP", "skipAmount": skip, "inputStage": stage };
    }
    if limit > 0 && (sort.is_empty() || plan.provides_sort) {
        stage = doc! { "stage": "LIMIT", "limitAmount": limit, "inputStage": stage };
    }
    if let Some(p) = projection.filter(|p| !p.is_empty()) {
        let covered = matches!(&plan.access, Access::IndexScan(ip) if ip.covered);
        let name = if covered { "PROJECTION_COVERED" } else { "PROJECTION_DEFAULT" };
        stage = doc! { "stage": name, "transformBy": p.clone(), "inputStage": stage };
    }
    stage
}

pub fn explain(ctx: &mut Ctx) -> Result<Document> {
    check_fields("explain", ctx.cmd, &["verbosity"])?;
    let inner = ctx.doc_arg("explain")?.ok_or_else(|| Error::location(40414, "BSON field 'explain.explain' is missing but a required field"))?.clone();
    let verbosity = ctx.str_arg("verbosity")?.unwrap_or("allPlansExecution").to_string();
    if !matches!(verbosity.as_str(), "queryPlanner" | "executionStats" | "allPlansExecution") {
        return Err(Error::bad_value(format!("verbosity string must be one of {{'queryPlanner', 'executionStats', 'allPlansExecution'}}, got {verbosity}")));
    }
    let name = inner.keys().next().cloned().unwrap_or_default();
    let coll_name = match inner.get(&name) {
        Some(Bson::String(s)) => s.clone(),
        _ => return Err(Error::new(Code::InvalidNamespace, "explain: the explained command must name a collection")),
    };
    // What each command filters, sorts, skips, limits and projects.
    let empty = Document::new();
    let (filter, sort, skip, limit, projection) = match name.as_str() {
        "find" => (
            inner.get_document("filter").unwrap_or(&empty).clone(),
            inner.get_document("sort").unwrap_or(&empty).clone(),
            inner.get("skip").and_then(common::value::as_i64).unwrap_or(0),
            inner.get("limit").and_then(common::value::as_i64).unwrap_or(0).abs(),
            inner.get_document("projection").ok().cloned(),
        ),
        "count" => (
            inner.get_document("query").unwrap_or(&empty).clone(),
            empty.clone(),
            inner.get("skip").and_then(common::value::as_i64).unwrap_or(0),
            inner.get("limit").and_then(common::value::as_i64).unwrap_or(0).abs(),
            None,
        ),
        "distinct" => (inner.get_document("query").unwrap_or(&empty).clone(), empty.clone(), 0, 0, None),
        "aggregate" => {
            let stages = inner.get_array("pipeline").map_err(|_| Error::type_mismatch("aggregate.pipeline must be an array"))?;
            let docs: Vec<Document> = stages.iter().filter_map(|s| s.as_document().cloned()).collect();
            let p = query::agg::Pipeline::parse(&docs)?;
            (p.leading_match().unwrap_or_default(), empty.clone(), 0, 0, None)
        }
        other => return Err(Error::new(Code::CommandNotSupported, format!("explain of '{other}' is not supported by shoal yet"))),
    };
    let natural = crate::commands::crud::natural_sort(&sort)?;
    let sort = if natural.is_some() { Document::new() } else { sort };
    let sort_spec = SortSpec::parse(&sort)?;
    query::filter::Filter::parse(&filter)?;
    let projected = match projection.as_ref().filter(|p| !p.is_empty()) {
        Some(p) => query::projection::Projection::parse(p)?.included_paths(),
        None => None,
    };
    let ns = ctx.ns(&coll_name);
    let started = Instant::now();
    let (winning, stats) = match ctx.store().collection(ctx.db, &coll_name) {
        None => (doc! { "stage": "EOF" }, doc! { "nReturned": 0i64, "totalKeysExamined": 0i64, "totalDocsExamined": 0i64 }),
        Some(coll) => {
            let hint = natural.as_ref().or(inner.get("hint"));
            let (mut scan, plan) = planned_scan(coll.snapshot(), &filter, Some(&sort_spec), hint, projected.as_deref())?;
            let tree = plan_tree(&plan, &filter, &sort, skip, limit, projection.as_ref(), ctx.shared.config.sort_memory_bytes_max);
            let mut n: i64 = 0;
            if verbosity != "queryPlanner" {
                while scan.next(ctx.op)?.is_some() {
                    n += 1;
                }
                n = (n - skip).max(0);
                if limit > 0 {
                    n = n.min(limit);
                }
            }
            (tree, doc! { "nReturned": n, "totalKeysExamined": scan.keys_examined as i64, "totalDocsExamined": scan.docs_examined as i64 })
        }
    };
    let mut out = doc! {
        "explainVersion": "1",
        "queryPlanner": {
            "namespace": ns,
            "indexFilterSet": false,
            "parsedQuery": filter.clone(),
            "maxIndexedOrSolutionsReached": false,
            "maxIndexedAndSolutionsReached": false,
            "maxScansToExplodeReached": false,
            "winningPlan": winning.clone(),
            "rejectedPlans": [],
        },
    };
    if verbosity != "queryPlanner" {
        let mut es = doc! { "executionSuccess": true };
        es.extend(stats.clone());
        es.insert("executionTimeMillis", started.elapsed().as_millis() as i64);
        let mut stages = winning;
        stages.insert("nReturned", stats.get("nReturned").cloned().unwrap_or(Bson::Int64(0)));
        stages.insert("keysExamined", stats.get("totalKeysExamined").cloned().unwrap_or(Bson::Int64(0)));
        stages.insert("docsExamined", stats.get("totalDocsExamined").cloned().unwrap_or(Bson::Int64(0)));
        es.insert("executionStages", stages);
        if verbosity == "allPlansExecution" {
            es.insert("allPlansExecution", Vec::<Bson>::new());
        }
        out.insert("executionStats", es);
    }
    out.insert("command", inner);
    out.insert("serverInfo", doc! { "host": ctx.shared.host_name.clone(), "port": ctx.shared.config.port as i32, "version": common::server::VERSION, "gitVersion": concat!("shoal-", env!("CARGO_PKG_VERSION")) });
    Ok(out)
}
