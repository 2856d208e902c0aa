//! Projections of find() (inclusion/exclusion, `$slice`, `$elemMatch`, positional `field.$`,
//! computed fields) and of the `$project`/`$addFields`/`$unset` aggregation stages.

use crate::expr::Expr;
use crate::filter::{Filter, MatchDetails};
use bson::{Bson, Document};
use common::{Code, Error, Result};

#[derive(Clone, Debug)]
pub struct Projection {
    root: PNode,
    inclusion: bool,
    /// `{}`: return documents unchanged.
    identity: bool,
}

#[derive(Clone, Debug, Default)]
struct PNode {
    children: Vec<(String, PChild)>,
}

#[derive(Clone, Debug)]
enum PChild {
    Include,
    Exclude,
    Sub(PNode),
    Expr(Box<Expr>),
    Slice { skip: Option<i64>, limit: i64 },
    ElemMatch(Box<Filter>),
    Positional,
}

impl PNode {
    fn get(&self, k: &str) -> Option<&PChild> {
        self.children.iter().find(|(n, _)| n == k).map(|(_, c)| c)
    }
    fn get_mut(&mut self, k: &str) -> Option<&mut PChild> {
        self.children.iter_mut().find(|(n, _)| n == k).map(|(_, c)| c)
    }
    fn has_computed(&self) -> bool {
        self.children.iter().any(|(_, c)| match c {
            PChild::Expr(_) => true,
            PChild::Sub(s) => s.has_computed(),
            _ => false,
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Find,
    Aggregate,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum ProjType {
    Inclusion,
    Exclusion,
}

struct Ctx {
    policy: Policy,
    ty: Option<ProjType>,
    id_specified: bool,
    id_included: bool,
    id_excluded: bool,
    has_positional: bool,
    has_elem_match: bool,
    has_find_slice: bool,
}

fn loc(code: i32, msg: impl Into<String>) -> Error {
    Error::location(code, msg)
}

fn check_path(path: &str) -> Result<Vec<String>> {
    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
    for p in &parts {
        if p.is_empty() {
            return Err(loc(15998, "FieldPath field names may not be empty strings."));
        }
        if p.starts_with('$') {
            return Err(loc(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."));
        }
    }
    Ok(parts)
}

fn add_node_at_path(parent: &mut PNode, full: &str, parts: &[String], child: PChild) -> Result<()> {
    let Some((first, rest)) = parts.split_first() else { return Ok(()) };
    if rest.is_empty() {
        if parent.get(first).is_some() {
            return Err(loc(31250, format!("Path collision at {full}")));
        }
        parent.children.push((first.clone(), child));
        return Ok(());
    }
    if parent.get(first).is_none() {
        parent.children.push((first.clone(), PChild::Sub(PNode::default())));
    }
    match parent.get_mut(first) {
        Some(PChild::Sub(node)) => add_node_at_path(node, full, rest, child),
        _ => Err(loc(31249, format!("Path collision at {full} remaining portion {}", rest.join(".")))),
    }
}

/// Position of the first positional operator: ".$." inside, ".$" at the end, or "$" alone.
fn find_positional(path: &str) -> Option<(usize, usize)> {
    if let Some(i) = path.find(".$.") {
        return Some((i, i + 3));
    }
    if path.ends_with(".$") {
        return Some((path.len() - 2, path.len()));
    }
    if path == "$" {
        return Some((0, 1));
    }
    None
}

fn is_incl_excl_type(v: &Bson) -> bool {
    matches!(v, Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_))
}

impl Projection {
    /// Parse a find() projection.
    pub fn parse(spec: &Document) -> Result<Projection> {
        Self::parse_with(spec, Policy::Find)
    }

    /// Parse a `$project` stage specification (no find-only features).
    pub fn parse_agg(spec: &Document) -> Result<Projection> {
        Self::parse_with(spec, Policy::Aggregate)
    }

    /// An exclusion projection of the given paths (`$unset`).
    pub fn exclusion_of(paths: &[String]) -> Result<Projection> {
        let mut root = PNode::default();
        for p in paths {
            let parts = check_path(p)?;
            add_node_at_path(&mut root, p, &parts, PChild::Exclude)?;
        }
        Ok(Projection { root, inclusion: false, identity: paths.is_empty() })
    }

    fn parse_with(spec: &Document, policy: Policy) -> Result<Projection> {
        if spec.is_empty() {
            return Ok(Projection { root: PNode::default(), inclusion: false, identity: true });
        }
        let mut ctx = Ctx {
            policy,
            ty: None,
            id_specified: false,
            id_included: false,
            id_excluded: false,
            has_positional: false,
            has_elem_match: false,
            has_find_slice: false,
        };
        let mut root = PNode::default();
        for (k, v) in spec {
            ctx.id_specified |= k == "_id" || k.starts_with("_id.");
            parse_element(&mut ctx, k, v, &mut root, true)?;
        }
        let ty = match ctx.ty {
            Some(t) => t,
            None => {
                if ctx.has_find_slice {
                    if ctx.id_included {
                        ProjType::Inclusion
                    } else {
                        ProjType::Exclusion
                    }
                } else if ctx.has_elem_match || ctx.id_included {
                    ProjType::Inclusion
                } else {
                    ProjType::Exclusion
                }
            }
        };
        if ty == ProjType::Inclusion && !ctx.id_specified {
            root.children.insert(0, ("_id".to_string(), PChild::Include));
        }
        if ty == ProjType::Exclusion && ctx.id_included {
            root.children.retain(|(k, c)| !(k == "_id" && matches!(c, PChild::Include)));
        }
        Ok(Projection { root, inclusion: ty == ProjType::Inclusion, identity: false })
    }

    pub fn is_inclusion(&self) -> bool {
        self.inclusion
    }

    /// The paths a plain inclusion projection returns (`_id` among them unless excluded), or
    /// `None` if it computes, slices or matches anything: what a covered plan must supply.
    pub fn included_paths(&self) -> Option<Vec<String>> {
        fn walk(node: &PNode, prefix: &str, top: bool, out: &mut Vec<String>) -> bool {
            for (name, child) in &node.children {
                let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                match child {
                    PChild::Include => out.push(path),
                    PChild::Exclude if top && name == "_id" => {}
                    PChild::Sub(sub) => {
                        if !walk(sub, &path, false, out) {
                            return false;
                        }
                    }
                    _ => return false,
                }
            }
            true
        }
        if !self.inclusion || self.identity {
            return None;
        }
        let mut out = Vec::new();
        walk(&self.root, "", true, &mut out).then_some(out)
    }

    pub fn apply(&self, doc: &Document, details: &MatchDetails) -> Result<Document> {
        if self.identity {
            return Ok(doc.clone());
        }
        if self.inclusion {
            let mut out = include_pass(&self.root, doc, doc, details)?;
            if self.root.has_computed() {
                compute_pass(&self.root, &mut out, doc)?;
            }
            Ok(out)
        } else {
            exclude_pass(&self.root, doc, doc, details)
        }
    }
}

fn parse_element(ctx: &mut Ctx, name: &str, v: &Bson, parent: &mut PNode, at_root: bool) -> Result<()> {
    let positional = find_positional(name);
    if positional.is_some() && ctx.policy == Policy::Aggregate {
        return Err(loc(31324, "Cannot use positional projection in aggregation projection"));
    }
    match v {
        Bson::Document(sub) => {
            if positional.is_some() {
                return Err(loc(31271, "positional projection cannot be used with an expression or sub object"));
            }
            parse_sub_object(ctx, name, sub, parent, at_root)
        }
        v if is_incl_excl_type(v) => {
            if crate::expr::truthy(&Some(v.clone())) {
                parse_inclusion(ctx, name, parent, positional, at_root)
            } else {
                let parts = check_path(name)?;
                add_node_at_path(parent, name, &parts, PChild::Exclude)?;
                if at_root && name == "_id" {
                    ctx.id_excluded = true;
                } else {
                    if ctx.ty == Some(ProjType::Inclusion) {
                        return Err(loc(31254, format!("Cannot do exclusion on field {name} in inclusion projection")));
                    }
                    ctx.ty = Some(ProjType::Exclusion);
                }
                Ok(())
            }
        }
        _ => {
            if positional.is_some() {
                return Err(loc(31308, "positional projection cannot be used with a literal"));
            }
            let e = Expr::parse(v)?;
            let parts = check_path(name)?;
            add_node_at_path(parent, name, &parts, PChild::Expr(Box::new(e)))?;
            if ctx.ty == Some(ProjType::Exclusion) {
                return Err(loc(31310, format!("Cannot use an expression {name}: {v} in an exclusion projection")));
            }
            ctx.ty = Some(ProjType::Inclusion);
            Ok(())
        }
    }
}

fn parse_inclusion(ctx: &mut Ctx, name: &str, parent: &mut PNode, positional: Option<(usize, usize)>, at_root: bool) -> Result<()> {
    let top_id = at_root && name == "_id";
    match positional {
        None => {
            let parts = check_path(name)?;
            add_node_at_path(parent, name, &parts, PChild::Include)?;
            if top_id {
                ctx.id_included = true;
            }
        }
        Some((begin, end)) => {
            if ctx.has_positional {
                return Err(loc(31276, "Cannot specify more than one positional projection per query."));
            }
            if ctx.has_elem_match {
                return Err(loc(31256, "Cannot specify positional operator and $elemMatch."));
            }
            if name.ends_with(".$.") {
                return Err(loc(31270, "Path cannot end with '.$.'"));
            }
            let after = &name[end..];
            if find_positional(after).is_some() || after == "$" {
                return Err(loc(31287, format!("Cannot use positional operator twice: {name}")));
            }
            let prefix = &name[..begin];
            if prefix.is_empty() {
                return Err(loc(31277, format!("Positional projection '{name}' does not match the query document.")));
            }
            let parts = check_path(prefix)?;
            add_node_at_path(parent, prefix, &parts, PChild::Positional)?;
            ctx.has_positional = true;
        }
    }
    if !top_id {
        if ctx.ty == Some(ProjType::Exclusion) {
            return Err(loc(31253, format!("Cannot do inclusion on field {name} in exclusion projection")));
        }
        ctx.ty = Some(ProjType::Inclusion);
    }
    Ok(())
}

fn num_i64(v: &Bson) -> Option<i64> {
    crate::num::Num::from_bson(v).map(|n| match n {
        crate::num::Num::I32(i) => i as i64,
        crate::num::Num::I64(i) => i.clamp(i32::MIN as i64, i32::MAX as i64),
        crate::num::Num::F64(d) => {
            if d.is_nan() {
                0
            } else {
                d.trunc().clamp(i32::MIN as f64, i32::MAX as f64) as i64
            }
        }
        crate::num::Num::Dec(d) => d.to_i64_trunc().unwrap_or(0).clamp(i32::MIN as i64, i32::MAX as i64),
    })
}

fn parse_find_slice(v: &Bson) -> Result<PChild> {
    match v {
        Bson::Array(a) => {
            if a.len() != 2 {
                return Err(loc(31272, "$slice array argument should be of form [skip, limit]"));
            }
            let skip = num_i64(&a[0])
                .ok_or_else(|| loc(31257, format!("$slice expects the skip argument to be a number, got {}", crate::expr::type_name(Some(&a[0])))))?;
            let limit = num_i64(&a[1])
                .ok_or_else(|| loc(31258, format!("$slice expects the limit argument to be a number, got {}", crate::expr::type_name(Some(&a[1])))))?;
            if limit <= 0 {
                return Err(loc(31259, format!("$slice limit must be positive, got {limit}")));
            }
            Ok(PChild::Slice { skip: Some(skip), limit })
        }
        v => match num_i64(v) {
            Some(limit) => Ok(PChild::Slice { skip: None, limit }),
            None => Err(loc(31273, "$slice only supports numbers and [skip, limit] arrays")),
        },
    }
}

fn parse_sub_object(ctx: &mut Ctx, name: &str, sub: &Document, parent: &mut PNode, at_root: bool) -> Result<()> {
    if sub.len() == 1 {
        if let Some((op, arg)) = sub.iter().next() {
            if op.starts_with('$') {
                let parts = check_path(name)?;
                if ctx.policy == Policy::Find && op == "$slice" {
                    match parse_find_slice(arg) {
                        Ok(child) => {
                            add_node_at_path(parent, name, &parts, child)?;
                            ctx.has_find_slice = true;
                            return Ok(());
                        }
                        Err(find_err) => {
                            // Maybe the aggregation $slice expression was meant.
                            return match Expr::parse(&Bson::Document(sub.clone())) {
                                Ok(e) => add_expression(ctx, name, &parts, e, parent),
                                Err(_) => Err(find_err),
                            };
                        }
                    }
                }
                if op == "$elemMatch" {
                    if ctx.policy == Policy::Aggregate {
                        return Err(Error::new(Code::InvalidPipelineOperator, "Cannot use $elemMatch in this context"));
                    }
                    let Bson::Document(_) = arg else {
                        return Err(loc(31274, format!("elemMatch: Invalid argument, object required, but got {}", crate::expr::type_name(Some(arg)))));
                    };
                    if ctx.has_positional {
                        return Err(loc(31255, "Cannot specify positional operator and $elemMatch."));
                    }
                    if parts.len() != 1 || !at_root {
                        return Err(loc(31275, "Cannot use $elemMatch projection on a nested field."));
                    }
                    let mut fdoc = Document::new();
                    fdoc.insert(name, bson::doc! {"$elemMatch": arg.clone()});
                    let f = Filter::parse(&fdoc)?;
                    add_node_at_path(parent, name, &parts, PChild::ElemMatch(Box::new(f)))?;
                    ctx.has_elem_match = true;
                    return Ok(());
                }
                if op == "$meta" {
                    return Err(Error::new(Code::NotImplemented, "$meta projections are not supported by shoal"));
                }
                return match Expr::parse(&Bson::Document(sub.clone())) {
                    Ok(e) => add_expression(ctx, name, &parts, e, parent),
                    Err(e) if e.is(Code::InvalidPipelineOperator) => Err(loc(31325, format!("Unknown expression {op}"))),
                    Err(e) => Err(e),
                };
            }
        }
    }
    if sub.is_empty() {
        return Err(loc(51270, format!("An empty sub-projection is not a valid value. Found empty object at path {name}")));
    }
    if sub.keys().next().is_some_and(|k| k.starts_with('$')) {
        return Err(loc(
            15983,
            format!("an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}", sub.len(), sub),
        ));
    }
    let parts = check_path(name)?;
    // Create (or reuse) the node for this path, then parse the sub-object's fields into it.
    let mut node = PNode::default();
    for (k, v) in sub {
        parse_element(ctx, k, v, &mut node, false)?;
    }
    merge_sub(parent, name, &parts, node)
}

fn merge_sub(parent: &mut PNode, full: &str, parts: &[String], node: PNode) -> Result<()> {
    let Some((first, rest)) = parts.split_first() else { return Ok(()) };
    if parent.get(first).is_none() {
        parent.children.push((first.clone(), PChild::Sub(PNode::default())));
    }
    match parent.get_mut(first) {
        Some(PChild::Sub(existing)) => {
            if rest.is_empty() {
                for (k, c) in node.children {
                    if existing.get(&k).is_some() {
                        return Err(loc(31250, format!("Path collision at {full}.{k}")));
                    }
                    existing.children.push((k, c));
                }
                Ok(())
            } else {
                merge_sub(existing, full, rest, node)
            }
        }
        _ => Err(loc(31250, format!("Path collision at {full}"))),
    }
}

fn add_expression(ctx: &mut Ctx, name: &str, parts: &[String], e: Expr, parent: &mut PNode) -> Result<()> {
    if ctx.ty == Some(ProjType::Exclusion) {
        return Err(loc(31252, "Cannot use expression other than $meta in exclusion projection"));
    }
    ctx.ty = Some(ProjType::Inclusion);
    add_node_at_path(parent, name, parts, PChild::Expr(Box::new(e)))
}

fn apply_slice(v: &Bson, skip: Option<i64>, limit: i64) -> Bson {
    let Bson::Array(items) = v else { return v.clone() };
    let len = items.len() as i64;
    let (start, end) = match skip {
        None => {
            if limit >= 0 {
                (0, limit.min(len))
            } else {
                ((len + limit).max(0), len)
            }
        }
        Some(s) => {
            let start = if s >= 0 { s.min(len) } else { (len + s).max(0) };
            (start, (start + limit).min(len))
        }
    };
    Bson::Array(items[start as usize..end as usize].to_vec())
}

fn positional_error() -> Error {
    loc(51246, "Executor error during find command :: caused by :: positional operator '.$' couldn't find a matching element in the array")
}

fn apply_positional(v: &Bson, details: &MatchDetails) -> Result<Bson> {
    match v {
        Bson::Array(items) => {
            let idx = details.elem_match_index.ok_or_else(positional_error)?;
            let e = items.get(idx).ok_or_else(positional_error)?;
            Ok(Bson::Array(vec![e.clone()]))
        }
        other => Ok(other.clone()),
    }
}

/// Inclusion, phase 1: copy included fields in document order.
fn include_pass(node: &PNode, doc: &Document, root: &Document, details: &MatchDetails) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        let Some(child) = node.get(k) else { continue };
        match child {
            PChild::Include => {
                out.insert(k.clone(), v.clone());
            }
            PChild::Sub(sub) => match v {
                Bson::Document(d) => {
                    out.insert(k.clone(), include_pass(sub, d, root, details)?);
                }
                Bson::Array(items) => {
                    out.insert(k.clone(), include_array(sub, items, root, details)?);
                }
                _ => {}
            },
            PChild::Slice { skip, limit } => {
                out.insert(k.clone(), apply_slice(v, *skip, *limit));
            }
            PChild::ElemMatch(f) => {
                if let Bson::Array(items) = v {
                    let (ok, d) = f.try_matches_details(root)?;
                    if let (true, Some(i)) = (ok, d.elem_match_index) {
                        if let Some(e) = items.get(i) {
                            out.insert(k.clone(), Bson::Array(vec![e.clone()]));
                        }
                    }
                }
            }
            PChild::Positional => {
                out.insert(k.clone(), apply_positional(v, details)?);
            }
            PChild::Expr(_) | PChild::Exclude => {}
        }
    }
    Ok(out)
}

fn include_array(sub: &PNode, items: &[Bson], root: &Document, details: &MatchDetails) -> Result<Bson> {
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        match i {
            Bson::Document(d) => out.push(Bson::Document(include_pass(sub, d, root, details)?)),
            Bson::Array(inner) => out.push(include_array(sub, inner, root, details)?),
            _ => {}
        }
    }
    Ok(Bson::Array(out))
}

/// Inclusion phase 2 and `$addFields`: set computed fields (evaluated against `root`).
fn compute_pass(node: &PNode, out: &mut Document, root: &Document) -> Result<()> {
    for (k, child) in &node.children {
        match child {
            PChild::Expr(e) => match e.eval(root)? {
                Some(v) => {
                    out.insert(k.clone(), v);
                }
                None => {
                    out.remove(k);
                }
            },
            PChild::Sub(sub) if sub.has_computed() => match out.get_mut(k) {
                Some(Bson::Document(d)) => compute_pass(sub, d, root)?,
                Some(Bson::Array(items)) => {
                    for i in items.iter_mut() {
                        compute_on_value(sub, i, root)?;
                    }
                }
                _ => {
                    let mut d = Document::new();
                    compute_pass(sub, &mut d, root)?;
                    out.insert(k.clone(), d);
                }
            },
            _ => {}
        }
    }
    Ok(())
}

fn compute_on_value(sub: &PNode, v: &mut Bson, root: &Document) -> Result<()> {
    match v {
        Bson::Document(d) => compute_pass(sub, d, root),
        Bson::Array(items) => {
            for i in items.iter_mut() {
                compute_on_value(sub, i, root)?;
            }
            Ok(())
        }
        _ => {
            let mut d = Document::new();
            compute_pass(sub, &mut d, root)?;
            *v = Bson::Document(d);
            Ok(())
        }
    }
}

fn exclude_pass(node: &PNode, doc: &Document, root: &Document, details: &MatchDetails) -> Result<Document> {
    let mut out = Document::new();
    for (k, v) in doc {
        match node.get(k) {
            Some(PChild::Exclude) => {}
            Some(PChild::Sub(sub)) => {
                out.insert(k.clone(), exclude_value(sub, v, root, details)?);
            }
            Some(PChild::Slice { skip, limit }) => {
                out.insert(k.clone(), apply_slice(v, *skip, *limit));
            }
            Some(PChild::Positional) => {
                out.insert(k.clone(), apply_positional(v, details)?);
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(out)
}

fn exclude_value(sub: &PNode, v: &Bson, root: &Document, details: &MatchDetails) -> Result<Bson> {
    Ok(match v {
        Bson::Document(d) => Bson::Document(exclude_pass(sub, d, root, details)?),
        Bson::Array(items) => Bson::Array(items.iter().map(|i| exclude_value(sub, i, root, details)).collect::<Result<Vec<_>>>()?),
        other => other.clone(),
    })
}

/// `$addFields`/`$set` stage: computed fields set on a copy of the document, with dotted
/// paths creating sub-documents (and applying to each element of arrays on the way).
#[derive(Clone, Debug)]
pub struct AddFields {
    root: PNode,
}

impl AddFields {
    pub fn parse(spec: &Document) -> Result<AddFields> {
        let mut root = PNode::default();
        for (k, v) in spec {
            let parts = check_path(k)?;
            let e = match v {
                Bson::Document(d) if !d.is_empty() && !d.keys().next().is_some_and(|f| f.starts_with('$')) => {
                    // A nested object literal: each of its fields is a computed field.
                    add_nested_object(&mut root, k, &parts, d)?;
                    continue;
                }
                other => Expr::parse(other)?,
            };
            add_node_at_path(&mut root, k, &parts, PChild::Expr(Box::new(e)))?;
        }
        Ok(AddFields { root })
    }

    pub fn apply(&self, doc: &Document) -> Result<Document> {
        let mut out = doc.clone();
        compute_pass(&self.root, &mut out, doc)?;
        Ok(out)
    }
}

fn add_nested_object(root: &mut PNode, full: &str, parts: &[String], d: &Document) -> Result<()> {
    // {$addFields: {a: {b: 1}}} behaves like {"a.b": 1}: the literal's fields are computed
    // fields merged into an existing sub-document.
    for (k, v) in d {
        let sub_full = format!("{full}.{k}");
        let mut sub_parts = parts.to_vec();
        sub_parts.extend(check_path(k)?);
        match v {
            Bson::Document(sd) if !sd.is_empty() && !sd.keys().next().is_some_and(|f| f.starts_with('$')) => {
                add_nested_object(root, &sub_full, &sub_parts, sd)?
            }
            other => add_node_at_path(root, &sub_full, &sub_parts, PChild::Expr(Box::new(Expr::parse(other)?)))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn p(spec: Document, d: Document) -> Document {
        Projection::parse(&spec).unwrap().apply(&d, &MatchDetails::default()).unwrap()
    }

    #[test]
    fn inclusion_and_exclusion() {
        let d = doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1, "x": 2}, 5]};
        assert_eq!(p(doc! {"a": 1}, d.clone()), doc! {"_id": 1, "a": 1});
        assert_eq!(p(doc! {"a": 1, "_id": 0}, d.clone()), doc! {"a": 1});
        assert_eq!(p(doc! {"b.c": 1, "e.c": 1}, d.clone()), doc! {"_id": 1, "b": {"c": 2}, "e": [{"c": 1}]});
        assert_eq!(p(doc! {"b": {"d": 1}}, d.clone()), doc! {"_id": 1, "b": {"d": 3}});
        assert_eq!(p(doc! {"a": 0, "b.c": 0}, d.clone()), doc! {"_id": 1, "b": {"d": 3}, "e": [{"c": 1, "x": 2}, 5]});
        assert_eq!(p(doc! {"e.x": 0}, d.clone()), doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "e": [{"c": 1}, 5]});
        assert_eq!(p(doc! {"_id": 0}, d.clone()).get("_id"), None);
        assert_eq!(p(doc! {"_id": 1}, d.clone()), doc! {"_id": 1});
        assert_eq!(p(doc! {}, d.clone()), d);
    }

    #[test]
    fn included_paths_of_plain_inclusions_only() {
        let paths = |spec: Document| Projection::parse(&spec).unwrap().included_paths();
        assert_eq!(paths(doc! {"a": 1, "_id": 0}), Some(vec!["a".to_string()]));
        assert_eq!(paths(doc! {"a": 1}), Some(vec!["_id".to_string(), "a".to_string()]));
        assert_eq!(paths(doc! {"b": {"c": 1}, "a.d": 1, "_id": 0}), Some(vec!["b.c".to_string(), "a.d".to_string()]));
        assert_eq!(paths(doc! {"a": 0}), None);
        assert_eq!(paths(doc! {}), None);
        assert_eq!(paths(doc! {"a": {"$slice": 1}, "b": 1}), None);
        assert_eq!(paths(doc! {"a": 1, "x": {"$add": [1, 2]}}), None);
        assert_eq!(paths(doc! {"a.$": 1}), None);
    }

    #[test]
    fn errors() {
        assert_eq!(Projection::parse(&doc! {"a": 1, "b": 0}).unwrap_err().code, 31254);
        assert_eq!(Projection::parse(&doc! {"a": 0, "b": 1}).unwrap_err().code, 31253);
        assert_eq!(Projection::parse(&doc! {"a": 1, "a.b": 1}).unwrap_err().code, 31249);
        assert_eq!(Projection::parse(&doc! {"a": {"b": {"$elemMatch": {"x": 1}}}}).unwrap_err().code, 31275);
        assert_eq!(Projection::parse(&doc! {"a.b": 1, "a": 1}).unwrap_err().code, 31250);
        assert_eq!(Projection::parse(&doc! {"a": {}}).unwrap_err().code, 51270);
        assert_eq!(Projection::parse(&doc! {"a": {"$meta": "textScore"}}).unwrap_err().code, 238);
        assert_eq!(Projection::parse(&doc! {"a": 0, "b": {"$add": [1, 2]}}).unwrap_err().code, 31252);
        assert_eq!(Projection::parse(&doc! {"a.$": 1, "b.$": 1}).unwrap_err().code, 31276);
        // Not the find() form, so MongoDB parses it as the $slice expression, which fails later.
        let pr = Projection::parse(&doc! {"a": {"$slice": [1, 0]}}).unwrap();
        assert_eq!(pr.apply(&doc! {"a": [1]}, &MatchDetails::default()).unwrap_err().code, 28724);
        assert_eq!(Projection::parse(&doc! {"a": {"$slice": "x"}}).unwrap_err().code, 31273);
        assert_eq!(Projection::parse(&doc! {"a": {"$foo": 1}}).unwrap_err().code, 31325);
    }

    #[test]
    fn computed_fields() {
        let d = doc! {"_id": 1, "a": 2, "b": {"c": 3}};
        assert_eq!(p(doc! {"x": {"$add": ["$a", 1]}}, d.clone()), doc! {"_id": 1, "x": 3});
        assert_eq!(p(doc! {"_id": 0, "y": "$b.c", "a": 1}, d.clone()), doc! {"a": 2, "y": 3});
        assert_eq!(p(doc! {"_id": 0, "z": {"$literal": 1}}, d.clone()), doc! {"z": 1});
        assert_eq!(p(doc! {"_id": 0, "s": "hello"}, d.clone()), doc! {"s": "hello"});
        assert_eq!(p(doc! {"_id": 0, "b.n": "$a"}, d.clone()), doc! {"b": {"n": 2}});
    }

    #[test]
    fn slice_elem_match_positional() {
        let d = doc! {"_id": 1, "a": [1, 2, 3, 4, 5], "b": 1};
        assert_eq!(p(doc! {"a": {"$slice": 2}}, d.clone()), doc! {"_id": 1, "a": [1, 2], "b": 1});
        assert_eq!(p(doc! {"a": {"$slice": -2}}, d.clone()), doc! {"_id": 1, "a": [4, 5], "b": 1});
        assert_eq!(p(doc! {"a": {"$slice": [1, 2]}, "b": 1}, d.clone()), doc! {"_id": 1, "a": [2, 3], "b": 1});
        assert_eq!(p(doc! {"a": {"$slice": [-2, 5]}, "_id": 0, "b": 0}, d.clone()), doc! {"a": [4, 5]});

        let school = doc! {"_id": 1, "zipcode": "63109", "students": [
        {"name": "john", "school": 102, "age": 10},
        {"name": "jess", "school": 102, "age": 11},
        {"name": "jeff", "school": 108, "age": 15}]};
        assert_eq!(
            p(doc! {"students": {"$elemMatch": {"school": 102}}}, school.clone()),
            doc! {"_id": 1, "students": [{"name": "john", "school": 102, "age": 10}]}
        );
        assert_eq!(p(doc! {"students": {"$elemMatch": {"school": 999}}}, school), doc! {"_id": 1});

        let grades = doc! {"_id": 1, "grades": [80, 85, 90]};
        let f = Filter::parse(&doc! {"grades": {"$gte": 85}}).unwrap();
        let (_, details) = f.matches_details(&grades);
        let proj = Projection::parse(&doc! {"grades.$": 1}).unwrap();
        assert_eq!(proj.apply(&grades, &details).unwrap(), doc! {"_id": 1, "grades": [85]});
        assert_eq!(proj.apply(&grades, &MatchDetails::default()).unwrap_err().code, 51246);
    }

    #[test]
    fn add_fields_and_unset() {
        let d = doc! {"_id": 1, "a": [{"x": 1}, 2], "b": 1};
        let af = AddFields::parse(&doc! {"a.y": 5, "c": {"$add": ["$b", 1]}, "b": "new"}).unwrap();
        assert_eq!(af.apply(&d).unwrap(), doc! {"_id": 1, "a": [{"x": 1, "y": 5}, {"y": 5}], "b": "new", "c": 2});
        let un = Projection::exclusion_of(&["b".to_string(), "a.x".to_string()]).unwrap();
        assert_eq!(un.apply(&d, &MatchDetails::default()).unwrap(), doc! {"_id": 1, "a": [{}, 2]});
        let nested = AddFields::parse(&doc! {"s": {"f": "u", "g": {"h": 1}}}).unwrap();
        assert_eq!(nested.apply(&doc! {"_id": 1, "s": {"x": 0, "g": 5}}).unwrap(), doc! {"_id": 1, "s": {"x": 0, "g": {"h": 1}, "f": "u"}});
    }
}
