//! A command's `let` (find, aggregate, update, delete, findAndModify): constants that its
//! expressions name as `$$name`. Each is evaluated once, against no document, as mongod
//! does, and put where the command's expressions use it, as `{$literal: value}`, before
//! those are parsed. Only expression positions take it (`$expr` in a filter, the
//! expressions of pipeline stages, projections): elsewhere `"$$name"` is a string value.
//! An expression that binds the same name again (`$let`, `$map`, `$filter`, `$reduce`)
//! keeps its own inside.

use crate::expr::{validate_var_name, Expr};
use bson::{doc, Bson, Document};
use common::{Error, Result};

/// Most variables one command may define.
pub const VARS_MAX: usize = 1000;

#[derive(Debug, Default)]
pub struct LetVars {
    vars: Vec<(String, Option<Bson>)>,
}

impl LetVars {
    /// The command's `let` document: each name a user variable name, each value an
    /// expression of no document.
    pub fn parse(spec: &Document) -> Result<LetVars> {
        if spec.len() > VARS_MAX {
            return Err(Error::bad_value(format!("a command may define at most {VARS_MAX} variables in 'let'")));
        }
        let mut vars = Vec::with_capacity(spec.len());
        for (name, value) in spec {
            validate_var_name(name)?;
            vars.push((name.clone(), Expr::parse(value)?.eval(&Document::new())?));
        }
        Ok(LetVars { vars })
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// These and `more` (an update statement's constants, `c`), which win on a name in both.
    pub fn with(&self, more: LetVars) -> LetVars {
        let mut vars: Vec<_> = self.vars.iter().filter(|(n, _)| !more.vars.iter().any(|(m, _)| m == n)).cloned().collect();
        vars.extend(more.vars);
        LetVars { vars }
    }

    /// A query filter with its `$expr`s bound.
    pub fn filter(&self, filter: &Document) -> Document {
        let mut out = Document::new();
        for (k, v) in filter {
            let v = match (k.as_str(), v) {
                ("$expr", e) => self.expression(e),
                ("$and" | "$or" | "$nor", Bson::Array(items)) => {
                    Bson::Array(items.iter().map(|i| if let Bson::Document(d) = i { Bson::Document(self.filter(d)) } else { i.clone() }).collect())
                }
                _ => v.clone(),
            };
            out.insert(k.clone(), v);
        }
        out
    }

    /// A pipeline with every stage's expressions bound.
    pub fn pipeline(&self, stages: &[Document]) -> Vec<Document> {
        stages.iter().map(|s| self.stage(s)).collect()
    }

    fn stage(&self, stage: &Document) -> Document {
        let Some((name, arg)) = stage.iter().next().filter(|_| stage.len() == 1) else { return stage.clone() };
        let arg = match (name.as_str(), arg) {
            ("$match", Bson::Document(f)) => Bson::Document(self.filter(f)),
            ("$facet", Bson::Document(facets)) => Bson::Document(
                facets
                    .iter()
                    .map(|(k, v)| {
                        let v = match v {
                            Bson::Array(sub) => {
                                Bson::Array(sub.iter().map(|s| if let Bson::Document(d) = s { Bson::Document(self.stage(d)) } else { s.clone() }).collect())
                            }
                            other => other.clone(),
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            ),
            // Field names, numbers and namespaces: no expressions.
            ("$sort" | "$limit" | "$skip" | "$count" | "$unwind" | "$sample" | "$out" | "$merge" | "$unset" | "$collStats" | "$indexStats", _) => arg.clone(),
            _ => self.expression(arg),
        };
        doc! { name.clone(): arg }
    }

    /// An expression (or a projection) with the variables it uses bound.
    pub fn expression(&self, e: &Bson) -> Bson {
        self.bind(e, &mut Vec::new())
    }

    fn bind(&self, e: &Bson, shadowed: &mut Vec<String>) -> Bson {
        match e {
            Bson::String(s) => self.variable(s, shadowed).unwrap_or_else(|| e.clone()),
            Bson::Array(items) => Bson::Array(items.iter().map(|i| self.bind(i, shadowed)).collect()),
            Bson::Document(d) => {
                let op = d.keys().next().map(String::as_str).filter(|_| d.len() == 1);
                match (op, d.iter().next().map(|(_, v)| v)) {
                    (Some("$literal"), _) => e.clone(),
                    (Some(op @ ("$let" | "$map" | "$filter" | "$reduce")), Some(Bson::Document(args))) => {
                        Bson::Document(doc! { op: self.binding(op, args, shadowed) })
                    }
                    _ => Bson::Document(d.iter().map(|(k, v)| (k.clone(), self.bind(v, shadowed))).collect()),
                }
            }
            _ => e.clone(),
        }
    }

    /// The arguments of an operator that binds names of its own: those shadow ours in the
    /// arguments that see them.
    fn binding(&self, op: &str, args: &Document, shadowed: &mut Vec<String>) -> Document {
        let own: Vec<String> = match op {
            "$let" => args.get_document("vars").map(|v| v.keys().cloned().collect()).unwrap_or_default(),
            "$map" | "$filter" => vec![args.get_str("as").unwrap_or("this").to_string()],
            _ => vec!["this".to_string(), "value".to_string()],
        };
        let inner = |k: &str| matches!((op, k), ("$let", "in") | ("$map", "in") | ("$filter", "cond" | "limit") | ("$reduce", "in"));
        let mut out = Document::new();
        for (k, v) in args {
            let v = if inner(k) {
                let n = shadowed.len();
                shadowed.extend(own.iter().cloned());
                let v = self.bind(v, shadowed);
                shadowed.truncate(n);
                v
            } else {
                self.bind(v, shadowed)
            };
            out.insert(k.clone(), v);
        }
        out
    }

    /// `$$name` or `$$name.path` for one of ours that is not shadowed: its value.
    fn variable(&self, s: &str, shadowed: &[String]) -> Option<Bson> {
        let rest = s.strip_prefix("$$")?;
        let name = rest.split_once('.').map_or(rest, |(n, _)| n);
        if shadowed.iter().any(|n| n == name) {
            return None;
        }
        let (_, value) = self.vars.iter().find(|(n, _)| n == name)?;
        let literal = match value {
            Some(v) => doc! {"$literal": v.clone()},
            // A variable whose value is missing: the expression sees missing, as mongod's.
            None => return Some(Bson::String("$$REMOVE".into())),
        };
        if rest.len() == name.len() {
            return Some(Bson::Document(literal));
        }
        // A path into the value follows the expression language's path rules, arrays
        // included: bind the name again around the path.
        Some(Bson::Document(doc! {"$let": {"vars": {name: literal}, "in": s}}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(vars: &Document, e: Bson, d: &Document) -> Option<Bson> {
        let v = LetVars::parse(vars).unwrap();
        Expr::parse(&v.expression(&e)).unwrap().eval(d).unwrap()
    }

    #[test]
    fn variables_in_expressions_paths_and_shadows() {
        let vars = doc! {"x": 5, "o": {"a": [{"b": 1}, {"b": 2}]}, "s": {"$concat": ["a", "b"]}};
        assert_eq!(eval(&vars, Bson::String("$$x".into()), &doc! {}), Some(Bson::Int32(5)));
        assert_eq!(eval(&vars, Bson::String("$$s".into()), &doc! {}), Some(Bson::String("ab".into())));
        assert_eq!(eval(&vars, Bson::String("$$o.a.b".into()), &doc! {}), Some(Bson::Array(vec![Bson::Int32(1), Bson::Int32(2)])));
        assert_eq!(eval(&vars, Bson::Document(doc! {"$add": ["$$x", "$n"]}), &doc! {"n": 1}), Some(Bson::Int32(6)));
        // $let binding x again keeps its own inside "in", and ours in "vars".
        let e = doc! {"$let": {"vars": {"x": {"$add": ["$$x", 1]}}, "in": "$$x"}};
        assert_eq!(eval(&vars, Bson::Document(e), &doc! {}), Some(Bson::Int32(6)));
        let e = doc! {"$map": {"input": [1, 2], "as": "x", "in": {"$multiply": ["$$x", 10]}}};
        assert_eq!(eval(&vars, Bson::Document(e), &doc! {}), Some(Bson::Array(vec![Bson::Int32(10), Bson::Int32(20)])));
        // A literal stays literal.
        assert_eq!(eval(&vars, Bson::Document(doc! {"$literal": "$$x"}), &doc! {}), Some(Bson::String("$$x".into())));
    }

    #[test]
    fn filters_bind_only_expr() {
        let v = LetVars::parse(&doc! {"x": 1}).unwrap();
        let f = v.filter(&doc! {"a": "$$x", "$or": [{"$expr": {"$eq": ["$a", "$$x"]}}]});
        assert_eq!(f.get_str("a").unwrap(), "$$x");
        let inner = f.get_array("$or").unwrap()[0].as_document().unwrap().get_document("$expr").unwrap().clone();
        assert_eq!(inner, doc! {"$eq": ["$a", {"$literal": 1}]});
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(LetVars::parse(&doc! {"NOW": 1}).is_err());
        assert!(LetVars::parse(&doc! {"a-b": 1}).is_err());
        assert!(LetVars::parse(&doc! {"ok": "$$NOW"}).is_ok());
    }
}
