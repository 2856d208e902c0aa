//! Evaluation: a tree against one document, with the variables in scope.

use super::*;

pub(crate) struct Ctx<'a> {
    pub(crate) root: &'a Document,
    pub(crate) vars: Vec<Value>,
    pub(crate) now: Option<DateTime>,
}

impl Expr {
    pub fn parse(e: &Bson) -> Result<Expr> {
        Self::parse_with_variables(e, &[])
    }

    /// Parse with extra user variables in scope (e.g. `$lookup`'s `let`); their values are
    /// given to `eval_with_variables` in the same order.
    pub fn parse_with_variables(e: &Bson, names: &[String]) -> Result<Expr> {
        let mut scope = Scope::default();
        for n in names {
            validate_var_name(n)?;
            scope.bind(n);
        }
        let node = parse_node(e, &mut scope)?;
        Ok(Expr { node, slots: scope.slots })
    }

    /// Evaluate against `root` ($$ROOT/$$CURRENT). Missing results are `None`.
    pub fn eval(&self, root: &Document) -> Result<Option<Bson>> {
        self.eval_with_variables(root, &[])
    }

    pub fn eval_with_variables(&self, root: &Document, values: &[Bson]) -> Result<Option<Bson>> {
        let mut ctx = Ctx { root, vars: Vec::new(), now: None };
        if self.slots > 0 {
            ctx.vars = vec![None; self.slots];
            for (slot, v) in values.iter().enumerate().take(self.slots) {
                ctx.vars[slot] = Some(v.clone());
            }
        }
        eval(&self.node, &mut ctx)
    }

    /// The value when the expression is a constant (no field paths or variables).
    pub fn constant(&self) -> Option<&Bson> {
        match &self.node {
            Node::Lit(b) => Some(b),
            _ => None,
        }
    }

    /// A plain field path "$a.b" (relative to $$CURRENT), if that is all this expression is.
    pub fn field_path(&self) -> Option<&[String]> {
        match &self.node {
            Node::Field(p) => Some(p),
            _ => None,
        }
    }
}

/// Evaluate a parsed expression (`{$op: ...}`, field path, literal) in one go.
pub fn eval_bson(e: &Bson, root: &Document) -> Result<Option<Bson>> {
    Expr::parse(e)?.eval(root)
}

/// Aggregation truthiness (Value::coerceToBool).
pub fn truthy(v: &Value) -> bool {
    match v {
        None | Some(Bson::Null) | Some(Bson::Undefined) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(i)) => *i != 0,
        Some(Bson::Int64(i)) => *i != 0,
        Some(Bson::Double(d)) => *d != 0.0,
        Some(Bson::Decimal128(d)) => !Dec::decode(d).is_zero(),
        Some(_) => true,
    }
}

pub(crate) fn nullish(v: &Value) -> bool {
    matches!(v, None | Some(Bson::Null) | Some(Bson::Undefined))
}

/// Aggregation field path lookup: arrays map the rest of the path over their documents.
pub(crate) fn get_path(v: &Bson, path: &[String]) -> Value {
    if path.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(d) => get_path_doc(d, path),
        Bson::Array(items) => Some(Bson::Array(items.iter().filter(|e| matches!(e, Bson::Document(_))).filter_map(|e| get_path(e, path)).collect())),
        _ => None,
    }
}

pub(crate) fn get_path_doc(d: &Document, path: &[String]) -> Value {
    let Some((first, rest)) = path.split_first() else {
        return Some(Bson::Document(d.clone()));
    };
    let v = d.get(first)?;
    if rest.is_empty() {
        return Some(v.clone());
    }
    match v {
        Bson::Document(_) | Bson::Array(_) => get_path(v, rest),
        _ => None,
    }
}

pub(crate) fn eval(node: &Node, ctx: &mut Ctx) -> Result<Value> {
    match node {
        Node::Lit(b) => Ok(Some(b.clone())),
        Node::Field(path) => Ok(get_path_doc(ctx.root, path)),
        Node::Var(var, path) => {
            let base: Value = match var {
                Var::Root | Var::Current => return Ok(get_path_doc(ctx.root, path)),
                Var::Remove => None,
                Var::Now => Some(Bson::DateTime(*ctx.now.get_or_insert_with(DateTime::now))),
                Var::ClusterTime => {
                    let now = ctx.now.get_or_insert_with(DateTime::now);
                    Some(Bson::Timestamp(bson::Timestamp { time: (now.timestamp_millis() / 1000).clamp(0, u32::MAX as i64) as u32, increment: 1 }))
                }
                Var::User(slot) => ctx.vars.get(*slot).cloned().flatten(),
            };
            Ok(match base {
                Some(b) => get_path(&b, path),
                None => None,
            })
        }
        Node::Object(fields) => {
            let mut out = Document::new();
            for (k, n) in fields {
                if let Some(v) = eval(n, ctx)? {
                    out.insert(k.clone(), v);
                }
            }
            Ok(Some(Bson::Document(out)))
        }
        Node::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for n in items {
                out.push(eval(n, ctx)?.unwrap_or(Bson::Null));
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Op(op, args) => eval_op(*op, args, ctx),
        Node::Cond(c) => {
            let (i, t, e) = &**c;
            if truthy(&eval(i, ctx)?) {
                eval(t, ctx)
            } else {
                eval(e, ctx)
            }
        }
        Node::Switch { branches, default } => {
            for (c, t) in branches {
                if truthy(&eval(c, ctx)?) {
                    return eval(t, ctx);
                }
            }
            match default {
                Some(d) => eval(d, ctx),
                None => Err(err(40066, "$switch could not find a matching branch for an input, and no default was specified.")),
            }
        }
        Node::Let { vars, body } => {
            let mut values = Vec::with_capacity(vars.len());
            for (slot, n) in vars {
                values.push((*slot, eval(n, ctx)?));
            }
            for (slot, v) in values {
                set_var(ctx, slot, v);
            }
            eval(body, ctx)
        }
        Node::Map { input, var, body } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(16883, format!("input to $map must be an array not {}", tn(&v))));
            };
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                set_var(ctx, *var, Some(item));
                out.push(eval(body, ctx)?.unwrap_or(Bson::Null));
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Filter { input, var, cond, limit } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(28651, format!("input to $filter must be an array not {}", tn(&v))));
            };
            let limit = match limit {
                None => None,
                Some(l) => {
                    let lv = eval(l, ctx)?;
                    if nullish(&lv) {
                        None
                    } else {
                        match lv.as_ref().and_then(Num::from_bson).and_then(|n| n.as_exact_i64()) {
                            Some(n) if n > 0 && n <= i32::MAX as i64 => Some(n as usize),
                            Some(n) if n <= 0 => return Err(err(327391, format!("$filter: limit must be greater than 0: {n}"))),
                            _ => return Err(err(327392, format!("$filter: limit must be represented as a 32-bit integral value: {}", show(&lv)))),
                        }
                    }
                }
            };
            let mut out = Vec::new();
            for item in items {
                set_var(ctx, *var, Some(item.clone()));
                if truthy(&eval(cond, ctx)?) {
                    out.push(item);
                    if limit.is_some_and(|l| out.len() >= l) {
                        break;
                    }
                }
            }
            Ok(Some(Bson::Array(out)))
        }
        Node::Reduce { input, initial, value_var, this_var, body } => {
            let v = eval(input, ctx)?;
            if nullish(&v) {
                return Ok(Some(Bson::Null));
            }
            let Some(Bson::Array(items)) = v else {
                return Err(err(40080, format!("$reduce requires that 'input' be an array, found: {}", show(&v))));
            };
            let mut acc = eval(initial, ctx)?;
            for item in items {
                set_var(ctx, *value_var, acc);
                set_var(ctx, *this_var, Some(item));
                acc = eval(body, ctx)?;
            }
            Ok(acc)
        }
        Node::Trim { kind, input, chars } => eval_trim(*kind, input, chars.as_deref(), ctx),
        Node::Regex { kind, input, regex, options, compiled } => eval_regex(*kind, input, regex, options.as_deref(), compiled.as_ref(), ctx),
        Node::Replace { all, input, find, replacement } => {
            let name = if *all { "$replaceAll" } else { "$replaceOne" };
            let i = eval(input, ctx)?;
            let f = eval(find, ctx)?;
            let r = eval(replacement, ctx)?;
            let check = |v: &Value, what: &str, code: i32| -> Result<()> {
                if !nullish(v) && !matches!(v, Some(Bson::String(_))) {
                    return Err(err(code, format!("{name} requires that '{what}' be a string, found: {}", show(v))));
                }
                Ok(())
            };
            check(&i, "input", 51746)?;
            check(&f, "find", 51745)?;
            check(&r, "replacement", 51744)?;
            match (i, f, r) {
                (Some(Bson::String(i)), Some(Bson::String(f)), Some(Bson::String(r))) => Ok(Some(Bson::String(if *all {
                    if f.is_empty() {
                        // MongoDB inserts the replacement between every character.
                        let mut out = r.clone();
                        for c in i.chars() {
                            out.push(c);
                            out.push_str(&r);
                        }
                        out
                    } else {
                        i.replace(&f, &r)
                    }
                } else {
                    i.replacen(&f, &r, 1)
                }))),
                _ => Ok(Some(Bson::Null)),
            }
        }
        Node::DatePart { part, date, timezone } => {
            let d = eval(date, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            if nullish(&d) {
                return Ok(Some(Bson::Null));
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let ms = date_millis(&d)?;
            let c = datetime::civil(ms.saturating_add(tz.offset_minutes as i64 * 60_000));
            let v: i64 = match part {
                DatePart::Year => c.year,
                DatePart::Month => c.month as i64,
                DatePart::DayOfMonth => c.day as i64,
                DatePart::Hour => c.hour as i64,
                DatePart::Minute => c.minute as i64,
                DatePart::Second => c.second as i64,
                DatePart::Millisecond => c.millis as i64,
                DatePart::DayOfWeek => c.weekday as i64 + 1,
                DatePart::DayOfYear => c.yday as i64,
                DatePart::Week => ((c.yday + 6 - c.weekday) / 7) as i64,
                DatePart::IsoWeek => datetime::iso_week(&c).1 as i64,
                DatePart::IsoWeekYear => {
                    return Ok(Some(Bson::Int64(datetime::iso_week(&c).0)));
                }
                DatePart::IsoDayOfWeek => datetime::iso_week(&c).2 as i64,
            };
            Ok(Some(Bson::Int32(v.clamp(i32::MIN as i64, i32::MAX as i64) as i32)))
        }
        Node::DateToString { format, date, timezone, on_null } => {
            let d = eval(date, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            let fmt = match format {
                Some(f) => match eval(f, ctx)? {
                    Some(Bson::String(s)) => Some(s),
                    v if nullish(&v) => return Ok(Some(Bson::Null)),
                    v => return Err(err(18533, format!("$dateToString requires that 'format' be a string, found: {} with value {}", tn(&v), show(&v)))),
                },
                None => None,
            };
            if nullish(&d) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let ms = date_millis(&d)?;
            let fmt = fmt.unwrap_or_else(|| if tz == Tz::UTC { "%Y-%m-%dT%H:%M:%S.%LZ".to_string() } else { "%Y-%m-%dT%H:%M:%S.%L".to_string() });
            Ok(Some(Bson::String(datetime::format_date(&fmt, ms, tz)?)))
        }
        Node::DateFromString { string, timezone, on_error, on_null } => {
            let s = eval(string, ctx)?;
            let tz = eval_tz(timezone.as_deref(), ctx)?;
            if nullish(&s) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            let Some(tz) = tz else { return Ok(Some(Bson::Null)) };
            let res = match &s {
                Some(Bson::String(st)) => datetime::parse_iso(st, tz)
                    .map(|ms| Bson::DateTime(DateTime::from_millis(ms)))
                    .ok_or_else(|| Error::new(Code::ConversionFailure, format!("Error parsing date string '{st}'"))),
                _ => Err(Error::new(
                    Code::ConversionFailure,
                    format!("$dateFromString requires that 'dateString' be a string, found: {} with value {}", tn(&s), show(&s)),
                )),
            };
            match res {
                Ok(v) => Ok(Some(v)),
                Err(e) => match on_error {
                    Some(n) => eval(n, ctx),
                    None => Err(e),
                },
            }
        }
        Node::Convert { input, to, on_error, on_null } => {
            let v = eval(input, ctx)?;
            let to_v = eval(to, ctx)?;
            if nullish(&to_v) {
                return Ok(Some(Bson::Null));
            }
            let target = convert_target(&to_v)?;
            if nullish(&v) {
                return match on_null {
                    Some(n) => eval(n, ctx),
                    None => Ok(Some(Bson::Null)),
                };
            }
            match convert(v.as_ref(), target) {
                Ok(r) => Ok(r),
                Err(e) if e.is(Code::ConversionFailure) => match on_error {
                    Some(n) => eval(n, ctx),
                    None => Err(e),
                },
                Err(e) => Err(e),
            }
        }
        Node::GetField { field, input } => {
            let f = eval(field, ctx)?;
            let Some(Bson::String(f)) = f else {
                return Err(err(5654602, format!("$getField requires 'field' to evaluate to type String, but got {}", tn(&f))));
            };
            let input = match input {
                Some(i) => eval(i, ctx)?,
                None => Some(Bson::Document(ctx.root.clone())),
            };
            match input {
                Some(Bson::Document(d)) => Ok(d.get(&f).cloned()),
                v if nullish(&v) => Ok(if v.is_none() { None } else { Some(Bson::Null) }),
                v => Err(err(3041705, format!("$getField requires 'input' to evaluate to type Object, but got {}", tn(&v)))),
            }
        }
        Node::SetField { field, input, value } => {
            let input = eval(input, ctx)?;
            let mut d = match input {
                Some(Bson::Document(d)) => d,
                v if nullish(&v) => return Ok(Some(Bson::Null)),
                v => return Err(err(4161105, format!("$setField requires 'input' to evaluate to type Object, but got {}", tn(&v)))),
            };
            match value {
                None => {
                    d.remove(field);
                }
                Some(n) => match eval(n, ctx)? {
                    Some(v) => {
                        d.insert(field.clone(), v);
                    }
                    None => {
                        d.remove(field);
                    }
                },
            }
            Ok(Some(Bson::Document(d)))
        }
    }
}

pub(crate) fn set_var(ctx: &mut Ctx, slot: usize, v: Value) {
    if slot >= ctx.vars.len() {
        ctx.vars.resize(slot + 1, None);
    }
    ctx.vars[slot] = v;
}

pub(crate) fn show(v: &Value) -> String {
    match v {
        None => "missing".into(),
        Some(Bson::String(s)) => format!("\"{s}\""),
        Some(b) => b.to_string(),
    }
}

pub(crate) fn eval_tz(tz: Option<&Node>, ctx: &mut Ctx) -> Result<Option<Tz>> {
    match tz {
        None => Ok(Some(Tz::UTC)),
        Some(n) => match eval(n, ctx)? {
            v if nullish(&v) => Ok(None),
            Some(Bson::String(s)) => Tz::parse(&s).map(Some),
            v => Err(err(40517, format!("timezone must evaluate to a string, found {}", tn(&v)))),
        },
    }
}

pub(crate) fn date_millis(v: &Value) -> Result<i64> {
    match v {
        Some(Bson::DateTime(d)) => Ok(d.timestamp_millis()),
        Some(Bson::Timestamp(t)) => Ok(t.time as i64 * 1000),
        Some(Bson::ObjectId(o)) => Ok(o.timestamp().timestamp_millis()),
        _ => Err(err(16006, format!("can't convert from BSON type {} to Date", tn(v)))),
    }
}

pub(crate) fn num_of(v: &Value) -> Option<Num> {
    v.as_ref().and_then(Num::from_bson)
}

pub(crate) fn bool_v(b: bool) -> Result<Value> {
    Ok(Some(Bson::Boolean(b)))
}

pub(crate) fn eval_args(args: &[Node], ctx: &mut Ctx) -> Result<Vec<Value>> {
    args.iter().map(|a| eval(a, ctx)).collect()
}

pub(crate) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Abs => "$abs",
        Op::Ceil => "$ceil",
        Op::Floor => "$floor",
        Op::Sqrt => "$sqrt",
        Op::Exp => "$exp",
        Op::Ln => "$ln",
        Op::Log10 => "$log10",
        Op::Round => "$round",
        Op::Trunc => "$trunc",
        Op::Sum => "$sum",
        Op::Avg => "$avg",
        Op::Min => "$min",
        Op::Max => "$max",
        Op::StdDevPop => "$stdDevPop",
        Op::StdDevSamp => "$stdDevSamp",
        Op::First => "$first",
        Op::Last => "$last",
        Op::ToString => "$toString",
        _ => "$expr",
    }
}

/// Integral i64 from a numeric value (2.0 ok, 2.5 not).
pub(crate) fn as_int(v: &Value) -> Option<i64> {
    num_of(v).and_then(|n| n.as_exact_i64())
}

pub(crate) fn as_i32(v: &Value) -> Option<i32> {
    as_int(v).and_then(|i| i32::try_from(i).ok())
}

pub(crate) fn eval_op(op: Op, args: &[Node], ctx: &mut Ctx) -> Result<Value> {
    match op {
        Op::And => {
            for a in args {
                if !truthy(&eval(a, ctx)?) {
                    return bool_v(false);
                }
            }
            bool_v(true)
        }
        Op::Or => {
            for a in args {
                if truthy(&eval(a, ctx)?) {
                    return bool_v(true);
                }
            }
            bool_v(false)
        }
        Op::IfNull => {
            let (last, init) = args.split_last().ok_or_else(|| Error::internal("$ifNull arity"))?;
            for a in init {
                let v = eval(a, ctx)?;
                if !nullish(&v) {
                    return Ok(v);
                }
            }
            eval(last, ctx)
        }
        _ => {
            let vals = eval_args(args, ctx)?;
            apply_op(op, vals)
        }
    }
}
