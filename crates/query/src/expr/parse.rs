//! Parsing: an expression's BSON into the tree (`Node`), once per query, with its
//! variables resolved to slots and mongod's errors for bad operators and arguments.

use super::*;

#[derive(Default)]
pub(crate) struct Scope {
    pub(crate) names: Vec<(String, usize)>,
    pub(crate) slots: usize,
    pub(crate) depth: usize,
}

impl Scope {
    pub(crate) fn bind(&mut self, name: &str) -> usize {
        let slot = self.slots;
        self.slots += 1;
        self.names.push((name.to_string(), slot));
        slot
    }
    pub(crate) fn lookup(&self, name: &str) -> Option<usize> {
        self.names.iter().rev().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
    pub(crate) fn pop(&mut self, n: usize) {
        let keep = self.names.len().saturating_sub(n);
        self.names.truncate(keep);
    }
}

pub(crate) fn err(code: i32, msg: impl Into<String>) -> Error {
    Error::location(code, msg)
}

/// MongoDB's type names ($type, error messages), "missing" for an absent value.
pub fn type_name(v: Option<&Bson>) -> &'static str {
    v.map_or("missing", common::value::type_name)
}

pub(crate) fn tn(v: &Value) -> &'static str {
    type_name(v.as_ref())
}

/// Validate a field path component ("$a.b" parts).
pub(crate) fn check_field_name(part: &str) -> Result<()> {
    if part.is_empty() {
        return Err(err(15998, "FieldPath field names may not be empty strings."));
    }
    if part.starts_with('$') {
        return Err(err(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."));
    }
    if part.contains('\0') {
        return Err(err(16411, "FieldPath field names may not contain '\\0'."));
    }
    Ok(())
}

pub(crate) fn parse_path(s: &str) -> Result<Vec<String>> {
    if s.is_empty() {
        return Err(err(40352, "FieldPath cannot be constructed with empty string"));
    }
    if s.ends_with('.') {
        return Err(err(40353, "FieldPath must not end with a '.'."));
    }
    let parts: Vec<String> = s.split('.').map(str::to_string).collect();
    for p in &parts {
        check_field_name(p)?;
    }
    Ok(parts)
}

pub(crate) fn validate_var_name(name: &str) -> Result<()> {
    let Some(first) = name.chars().next() else {
        return Err(err(16869, "empty variable names are not allowed"));
    };
    if !first.is_ascii_lowercase() && first.is_ascii() {
        return Err(err(16870, format!("'{name}' starts with an invalid character for a user variable name")));
    }
    for c in name.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii()) {
            return Err(err(16871, format!("'{name}' contains an invalid character for a variable name: '{c}'")));
        }
    }
    Ok(())
}

pub(crate) fn parse_string_operand(s: &str, scope: &Scope) -> Result<Node> {
    if let Some(rest) = s.strip_prefix("$$") {
        let (name, path) = match rest.split_once('.') {
            Some((n, p)) => (n, parse_path(p)?),
            None => (rest, Vec::new()),
        };
        let var = match name {
            "ROOT" => Var::Root,
            "CURRENT" => Var::Current,
            "REMOVE" => Var::Remove,
            "NOW" => Var::Now,
            "CLUSTER_TIME" => Var::ClusterTime,
            "" => return Err(err(16869, "empty variable names are not allowed")),
            _ => match scope.lookup(name) {
                Some(slot) => Var::User(slot),
                None => return Err(err(17276, format!("Use of undefined variable: {name}"))),
            },
        };
        return Ok(Node::Var(var, path));
    }
    if let Some(rest) = s.strip_prefix('$') {
        if rest.is_empty() {
            return Err(err(16872, "'$' by itself is not a valid FieldPath"));
        }
        return Ok(Node::Field(parse_path(rest)?));
    }
    Ok(Node::Lit(Bson::String(s.to_string())))
}

pub(crate) fn parse_node(v: &Bson, scope: &mut Scope) -> Result<Node> {
    scope.depth += 1;
    if scope.depth > EXPR_DEPTH_MAX {
        return Err(Error::new(Code::Overflow, "expression nesting too deep"));
    }
    let r = parse_node_inner(v, scope);
    scope.depth -= 1;
    r
}

pub(crate) fn parse_node_inner(v: &Bson, scope: &mut Scope) -> Result<Node> {
    match v {
        Bson::String(s) => parse_string_operand(s, scope),
        Bson::Array(items) => {
            let nodes = items.iter().map(|i| parse_node(i, scope)).collect::<Result<Vec<_>>>()?;
            if let Some(lits) = all_literals(&nodes) {
                return Ok(Node::Lit(Bson::Array(lits)));
            }
            Ok(Node::Array(nodes))
        }
        Bson::Document(d) => parse_document(d, scope),
        other => Ok(Node::Lit(other.clone())),
    }
}

pub(crate) fn all_literals(nodes: &[Node]) -> Option<Vec<Bson>> {
    nodes
        .iter()
        .map(|n| match n {
            Node::Lit(b) => Some(b.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn parse_document(d: &Document, scope: &mut Scope) -> Result<Node> {
    let Some((first, _)) = d.iter().next() else {
        return Ok(Node::Lit(Bson::Document(Document::new())));
    };
    if first.starts_with('$') {
        if d.len() != 1 {
            return Err(err(
                15983,
                format!(
                    "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {}, while parsing object {}",
                    d.len(),
                    d,
                    d
                ),
            ));
        }
        let (name, arg) = d.iter().next().ok_or_else(|| Error::internal("empty"))?;
        return parse_operator(name, arg, scope);
    }
    let mut fields = Vec::with_capacity(d.len());
    for (k, v) in d {
        if k.starts_with('$') {
            return Err(err(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."));
        }
        if k.contains('.') {
            return Err(err(16412, "FieldPath field names may not contain '.'. Consider using $getField or $setField."));
        }
        if k.is_empty() {
            return Err(err(15998, "FieldPath field names may not be empty strings."));
        }
        fields.push((k.clone(), parse_node(v, scope)?));
    }
    Ok(Node::Object(fields))
}

pub(crate) fn args_of(arg: &Bson) -> Vec<&Bson> {
    match arg {
        Bson::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

pub(crate) fn check_arity(name: &str, arity: &Arity, n: usize) -> Result<()> {
    match *arity {
        Arity::Exactly(k) if n != k => Err(err(16020, format!("Expression {name} takes exactly {k} arguments. {n} were passed in."))),
        Arity::AtLeast(k) if n < k => Err(err(16020, format!("Expression {name} takes at least {k} arguments, and {n} were passed in."))),
        Arity::Between(lo, hi) if n < lo || n > hi => {
            Err(err(28667, format!("Expression {name} takes at least {lo} arguments, and at most {hi}, but {n} were passed in.")))
        }
        _ => Ok(()),
    }
}

/// Parse `{field: expr, ...}` named arguments, rejecting unknown fields with `unknown(name)`.
pub(crate) fn named_args<'a>(
    arg: &'a Bson,
    allowed: &[&str],
    not_object: impl FnOnce() -> Error,
    unknown: impl Fn(&str) -> Error,
) -> Result<Vec<Option<&'a Bson>>> {
    let Bson::Document(d) = arg else { return Err(not_object()) };
    let mut out = vec![None; allowed.len()];
    for (k, v) in d {
        match allowed.iter().position(|a| a == k) {
            Some(i) => out[i] = Some(v),
            None => return Err(unknown(k)),
        }
    }
    Ok(out)
}

pub(crate) fn opt_node(v: Option<&Bson>, scope: &mut Scope) -> Result<Option<Box<Node>>> {
    v.map(|v| parse_node(v, scope).map(Box::new)).transpose()
}

pub(crate) fn parse_operator(name: &str, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    if let Some((op, arity)) = simple_op(name) {
        // An operator of no arguments is written with an empty object (`{$rand: {}}`).
        let none = matches!((&arity, arg), (Arity::Exactly(0), Bson::Document(d)) if d.is_empty());
        let args = if none { Vec::new() } else { args_of(arg) };
        check_arity(name, &arity, args.len())?;
        let nodes = args.into_iter().map(|a| parse_node(a, scope)).collect::<Result<Vec<_>>>()?;
        return Ok(Node::Op(op, nodes));
    }
    if let Some(part) = date_part(name) {
        return parse_date_part(name, part, arg, scope);
    }
    match name {
        "$literal" => Ok(Node::Lit(arg.clone())),
        "$cond" => parse_cond(arg, scope),
        "$switch" => parse_switch(arg, scope),
        "$let" => parse_let(arg, scope),
        "$map" => parse_map(arg, scope),
        "$filter" => parse_filter(arg, scope),
        "$reduce" => parse_reduce(arg, scope),
        "$trim" | "$ltrim" | "$rtrim" => {
            let kind = match name {
                "$trim" => TrimKind::Both,
                "$ltrim" => TrimKind::Left,
                _ => TrimKind::Right,
            };
            let a = named_args(
                arg,
                &["input", "chars"],
                || err(50696, format!("{name} only supports an object as its argument")),
                |k| err(50694, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(50695, format!("{name} requires an 'input' field")))?;
            Ok(Node::Trim { kind, input: Box::new(parse_node(input, scope)?), chars: opt_node(a[1], scope)? })
        }
        "$regexMatch" | "$regexFind" | "$regexFindAll" => {
            let kind = match name {
                "$regexMatch" => RegexKind::Match,
                "$regexFind" => RegexKind::Find,
                _ => RegexKind::FindAll,
            };
            let a = named_args(
                arg,
                &["input", "regex", "options"],
                || err(51103, format!("{name} expects an object of named arguments but found: {}", type_name(Some(arg)))),
                |k| err(31024, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(31022, format!("{name} requires 'input' parameter")))?;
            let regex = a[1].ok_or_else(|| err(31023, format!("{name} requires 'regex' parameter")))?;
            let input = Box::new(parse_node(input, scope)?);
            let regex_node = Box::new(parse_node(regex, scope)?);
            let options = opt_node(a[2], scope)?;
            // Compile once when pattern and options are constants.
            let compiled = match (&*regex_node, options.as_deref()) {
                (Node::Lit(r), None) => Some(compile_expr_regex(name, Some(r), None)?).flatten(),
                (Node::Lit(r), Some(Node::Lit(o))) => Some(compile_expr_regex(name, Some(r), Some(o))?).flatten(),
                _ => None,
            };
            Ok(Node::Regex { kind, input, regex: regex_node, options, compiled })
        }
        "$replaceOne" | "$replaceAll" => {
            let a = named_args(
                arg,
                &["input", "find", "replacement"],
                || err(51751, format!("{name} requires an object as an argument, found: {}", type_name(Some(arg)))),
                |k| err(51750, format!("{name} found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(51749, format!("{name} requires 'input' to be specified")))?;
            let find = a[1].ok_or_else(|| err(51748, format!("{name} requires 'find' to be specified")))?;
            let repl = a[2].ok_or_else(|| err(51747, format!("{name} requires 'replacement' to be specified")))?;
            Ok(Node::Replace {
                all: name == "$replaceAll",
                input: Box::new(parse_node(input, scope)?),
                find: Box::new(parse_node(find, scope)?),
                replacement: Box::new(parse_node(repl, scope)?),
            })
        }
        "$dateToString" => {
            let a = named_args(
                arg,
                &["format", "date", "timezone", "onNull"],
                || err(18629, "$dateToString only supports an object as its argument"),
                |k| err(18534, format!("Unrecognized argument to $dateToString: {k}")),
            )?;
            let date = a[1].ok_or_else(|| err(18628, "Missing 'date' parameter to $dateToString"))?;
            if let Some(f) = a[0] {
                if !matches!(f, Bson::String(_)) && !matches!(f, Bson::Document(_)) && !is_expr_string(f) {
                    return Err(err(18533, format!("$dateToString requires that 'format' be a string, found: {} with value {}", type_name(Some(f)), f)));
                }
            }
            Ok(Node::DateToString {
                format: opt_node(a[0], scope)?,
                date: Box::new(parse_node(date, scope)?),
                timezone: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$dateFromString" => {
            let a = named_args(
                arg,
                &["dateString", "timezone", "onError", "onNull", "format"],
                || err(40540, format!("$dateFromString only supports an object as an argument, found: {}", type_name(Some(arg)))),
                |k| err(40541, format!("Unrecognized argument to $dateFromString: {k}")),
            )?;
            let s = a[0].ok_or_else(|| err(40542, "Missing 'dateString' parameter to $dateFromString"))?;
            if a[4].is_some() {
                return Err(Error::new(Code::NotImplemented, "$dateFromString 'format' is not supported by shoal"));
            }
            Ok(Node::DateFromString {
                string: Box::new(parse_node(s, scope)?),
                timezone: opt_node(a[1], scope)?,
                on_error: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$convert" => {
            let a = named_args(
                arg,
                &["input", "to", "onError", "onNull", "format", "base"],
                || err(ConversionCodes::NOT_OBJECT, format!("$convert expects an object of named arguments but found: {}", type_name(Some(arg)))),
                |k| err(ConversionCodes::UNKNOWN, format!("$convert found an unknown argument: {k}")),
            )?;
            let input = a[0].ok_or_else(|| err(ConversionCodes::MISSING_INPUT, "Missing 'input' parameter to $convert"))?;
            let to = a[1].ok_or_else(|| err(ConversionCodes::MISSING_TO, "Missing 'to' parameter to $convert"))?;
            if a[4].is_some() || a[5].is_some() {
                return Err(Error::new(Code::NotImplemented, "$convert 'format'/'base' are not supported by shoal"));
            }
            Ok(Node::Convert {
                input: Box::new(parse_node(input, scope)?),
                to: Box::new(parse_node(to, scope)?),
                on_error: opt_node(a[2], scope)?,
                on_null: opt_node(a[3], scope)?,
            })
        }
        "$getField" => {
            if let Bson::Document(d) = arg {
                if d.keys().next().is_some_and(|k| !k.starts_with('$')) {
                    let a = named_args(
                        arg,
                        &["field", "input"],
                        || err(3041703, "$getField requires an object"),
                        |k| err(3041701, format!("$getField found an unknown argument: {k}")),
                    )?;
                    let field = a[0].ok_or_else(|| err(3041702, "$getField requires 'field' to be specified"))?;
                    return Ok(Node::GetField { field: Box::new(parse_node(field, scope)?), input: opt_node(a[1], scope)? });
                }
            }
            Ok(Node::GetField { field: Box::new(parse_node(arg, scope)?), input: None })
        }
        "$setField" | "$unsetField" => {
            let allowed: &[&str] = if name == "$setField" { &["field", "input", "value"] } else { &["field", "input"] };
            let a = named_args(
                arg,
                allowed,
                || err(4161100, format!("{name} only supports an object as its argument")),
                |k| err(4161101, format!("{name} found an unknown argument: {k}")),
            )?;
            let field = a[0].ok_or_else(|| err(4161102, format!("{name} requires 'field' to be specified")))?;
            let input = a[1].ok_or_else(|| err(4161103, format!("{name} requires 'input' to be specified")))?;
            let field = match field {
                Bson::String(s) if !s.starts_with('$') => s.clone(),
                Bson::Document(d) if d.len() == 1 && d.contains_key("$literal") => match d.get("$literal") {
                    Some(Bson::String(s)) => s.clone(),
                    _ => return Err(err(4161107, format!("{name} requires 'field' to evaluate to type String"))),
                },
                _ => return Err(err(4161106, format!("{name} requires 'field' to evaluate to a constant, but got a non-constant argument"))),
            };
            let value = if name == "$setField" {
                let v = a[2].ok_or_else(|| err(4161104, "$setField requires 'value' to be specified"))?;
                let node = parse_node(v, scope)?;
                match node {
                    Node::Var(Var::Remove, ref p) if p.is_empty() => None,
                    n => Some(Box::new(n)),
                }
            } else {
                None
            };
            Ok(Node::SetField { field, input: Box::new(parse_node(input, scope)?), value })
        }
        _ if UNSUPPORTED_OPERATORS.contains(&name) => Err(Error::new(Code::NotImplemented, format!("Expression {name} is not supported by shoal"))),
        _ => Err(Error::new(Code::InvalidPipelineOperator, format!("Unrecognized expression '{name}'"))),
    }
}

pub(crate) fn is_expr_string(v: &Bson) -> bool {
    matches!(v, Bson::String(s) if s.starts_with('$'))
}

pub(crate) struct ConversionCodes;
impl ConversionCodes {
    const NOT_OBJECT: i32 = 4997700;
    const UNKNOWN: i32 = 4997701;
    const MISSING_INPUT: i32 = 4997702;
    const MISSING_TO: i32 = 4997703;
}

pub(crate) fn parse_date_part(name: &str, part: DatePart, arg: &Bson, scope: &mut Scope) -> Result<Node> {
    // {date, timezone} form when the object's first key is not an operator.
    if let Bson::Document(d) = arg {
        if d.keys().next().is_some_and(|k| !k.starts_with('$')) {
            let mut date = None;
            let mut tz = None;
            for (k, v) in d {
                match k.as_str() {
                    "date" => date = Some(v),
                    "timezone" => tz = Some(v),
                    _ => return Err(err(40535, format!("unrecognized option to {name}: \"{k}\""))),
                }
            }
            let date = date.ok_or_else(|| err(40539, format!("missing 'date' argument to {name}, provided: {d}")))?;
            return Ok(Node::DatePart { part, date: Box::new(parse_node(date, scope)?), timezone: opt_node(tz, scope)? });
        }
    }
    let args = args_of(arg);
    check_arity(name, &Arity::Exactly(1), args.len())?;
    Ok(Node::DatePart { part, date: Box::new(parse_node(args[0], scope)?), timezone: None })
}

pub(crate) fn parse_cond(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    match arg {
        Bson::Document(d) => {
            let (mut i, mut t, mut e) = (None, None, None);
            for (k, v) in d {
                match k.as_str() {
                    "if" => i = Some(v),
                    "then" => t = Some(v),
                    "else" => e = Some(v),
                    _ => return Err(err(17083, format!("Unrecognized parameter to $cond: {k}"))),
                }
            }
            let i = i.ok_or_else(|| err(17080, "Missing 'if' parameter to $cond"))?;
            let t = t.ok_or_else(|| err(17081, "Missing 'then' parameter to $cond"))?;
            let e = e.ok_or_else(|| err(17082, "Missing 'else' parameter to $cond"))?;
            Ok(Node::Cond(Box::new((parse_node(i, scope)?, parse_node(t, scope)?, parse_node(e, scope)?))))
        }
        _ => {
            let args = args_of(arg);
            check_arity("$cond", &Arity::Exactly(3), args.len())?;
            Ok(Node::Cond(Box::new((parse_node(args[0], scope)?, parse_node(args[1], scope)?, parse_node(args[2], scope)?))))
        }
    }
}

pub(crate) fn parse_switch(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let Bson::Document(d) = arg else {
        return Err(err(40060, format!("$switch requires an object as an argument, found: {}", type_name(Some(arg)))));
    };
    let mut branches = Vec::new();
    let mut default = None;
    let mut saw_branches = false;
    for (k, v) in d {
        match k.as_str() {
            "branches" => {
                saw_branches = true;
                let Bson::Array(bs) = v else {
                    return Err(err(40061, format!("$switch expected an array for 'branches', found: {}", type_name(Some(v)))));
                };
                for b in bs {
                    let Bson::Document(bd) = b else {
                        return Err(err(40062, format!("$switch expected each branch to be an object, found: {}", type_name(Some(b)))));
                    };
                    let (mut c, mut t) = (None, None);
                    for (bk, bv) in bd {
                        match bk.as_str() {
                            "case" => c = Some(parse_node(bv, scope)?),
                            "then" => t = Some(parse_node(bv, scope)?),
                            _ => return Err(err(40063, format!("$switch found an unknown argument to a branch: {bk}"))),
                        }
                    }
                    let c = c.ok_or_else(|| err(40064, "$switch requires each branch have a 'case' expression"))?;
                    let t = t.ok_or_else(|| err(40065, "$switch requires each branch have a 'then' expression."))?;
                    branches.push((c, t));
                }
            }
            "default" => default = Some(Box::new(parse_node(v, scope)?)),
            _ => return Err(err(40067, format!("$switch found an unknown argument: {k}"))),
        }
    }
    if !saw_branches || branches.is_empty() {
        return Err(err(40068, "$switch requires at least one branch."));
    }
    Ok(Node::Switch { branches, default })
}

pub(crate) fn parse_let(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let Bson::Document(d) = arg else {
        return Err(err(16874, "$let only supports an object as its argument"));
    };
    let (mut vars, mut body) = (None, None);
    for (k, v) in d {
        match k.as_str() {
            "vars" => vars = Some(v),
            "in" => body = Some(v),
            _ => return Err(err(16875, format!("Unrecognized parameter to $let: {k}"))),
        }
    }
    let vars = vars.ok_or_else(|| err(16876, "Missing 'vars' parameter to $let"))?;
    let body = body.ok_or_else(|| err(16877, "Missing 'in' parameter to $let"))?;
    let Bson::Document(vd) = vars else {
        return Err(err(10065, "invalid parameter: expected an object (vars)"));
    };
    // Variable definitions are evaluated in the outer scope.
    let mut defs = Vec::with_capacity(vd.len());
    for (name, e) in vd {
        validate_var_name(name)?;
        defs.push((name.clone(), parse_node(e, scope)?));
    }
    let mut bound = Vec::with_capacity(defs.len());
    for (name, node) in defs {
        let slot = scope.bind(&name);
        bound.push((slot, node));
    }
    let body = parse_node(body, scope);
    scope.pop(bound.len());
    Ok(Node::Let { vars: bound, body: Box::new(body?) })
}

pub(crate) fn var_name_arg(v: Option<&Bson>, default: &str, code: i32, op: &str) -> Result<String> {
    match v {
        None => Ok(default.to_string()),
        Some(Bson::String(s)) => {
            validate_var_name(s)?;
            Ok(s.clone())
        }
        Some(other) => Err(err(code, format!("{op} 'as' must be a string, found: {}", type_name(Some(other))))),
    }
}

pub(crate) fn parse_map(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "as", "in"],
        || err(16878, "$map only supports an object as its argument"),
        |k| err(16879, format!("Unrecognized parameter to $map: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(16880, "Missing 'input' parameter to $map"))?;
    let body = a[2].ok_or_else(|| err(16882, "Missing 'in' parameter to $map"))?;
    let name = var_name_arg(a[1], "this", 16881, "$map")?;
    let input = parse_node(input, scope)?;
    let var = scope.bind(&name);
    let body = parse_node(body, scope);
    scope.pop(1);
    Ok(Node::Map { input: Box::new(input), var, body: Box::new(body?) })
}

pub(crate) fn parse_filter(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "as", "cond", "limit"],
        || err(28646, "$filter only supports an object as its argument"),
        |k| err(28647, format!("Unrecognized parameter to $filter: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(28648, "Missing 'input' parameter to $filter"))?;
    let cond = a[2].ok_or_else(|| err(28650, "Missing 'cond' parameter to $filter"))?;
    let name = var_name_arg(a[1], "this", 28649, "$filter")?;
    let input = parse_node(input, scope)?;
    let limit = opt_node(a[3], scope)?;
    let var = scope.bind(&name);
    let cond = parse_node(cond, scope);
    scope.pop(1);
    Ok(Node::Filter { input: Box::new(input), var, cond: Box::new(cond?), limit })
}

pub(crate) fn parse_reduce(arg: &Bson, scope: &mut Scope) -> Result<Node> {
    let a = named_args(
        arg,
        &["input", "initialValue", "in"],
        || err(40075, format!("$reduce requires an object as an argument, found: {}", type_name(Some(arg)))),
        |k| err(40076, format!("$reduce found an unknown argument: {k}")),
    )?;
    let input = a[0].ok_or_else(|| err(40077, "$reduce requires 'input' to be specified"))?;
    let initial = a[1].ok_or_else(|| err(40078, "$reduce requires 'initialValue' to be specified"))?;
    let body = a[2].ok_or_else(|| err(40079, "$reduce requires 'in' to be specified"))?;
    let input = parse_node(input, scope)?;
    let initial = parse_node(initial, scope)?;
    let value_var = scope.bind("value");
    let this_var = scope.bind("this");
    let body = parse_node(body, scope);
    scope.pop(2);
    Ok(Node::Reduce { input: Box::new(input), initial: Box::new(initial), value_var, this_var, body: Box::new(body?) })
}
