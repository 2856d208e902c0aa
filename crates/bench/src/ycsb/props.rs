//! YCSB workload properties: java.util.Properties file syntax (`-P file`) plus `-p key=value`
//! overrides, later ones winning, exactly as YCSB's Client merges them.

use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Bundled CoreWorkload files (YCSB's workloads/workloada..f), usable by name with `-P`.
pub const BUNDLED_WORKLOADS: [(&str, &str); 6] = [
    ("workloada", include_str!("../../workloads/workloada")),
    ("workloadb", include_str!("../../workloads/workloadb")),
    ("workloadc", include_str!("../../workloads/workloadc")),
    ("workloadd", include_str!("../../workloads/workloadd")),
    ("workloade", include_str!("../../workloads/workloade")),
    ("workloadf", include_str!("../../workloads/workloadf")),
];

/// Properties files larger than this are not workload files; refuse rather than read them.
pub const PROPERTIES_FILE_SIZE_BYTES_MAX: u64 = 1024 * 1024;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    map: BTreeMap<String, String>,
}

impl Properties {
    pub fn new() -> Properties {
        Properties::default()
    }

    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.map.insert(key.into(), value.into());
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(|s| s.as_str())
    }

    pub fn get_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.get(key).unwrap_or(default)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.map.iter()
    }

    /// Merges `other` over `self`.
    pub fn extend(&mut self, other: &Properties) {
        for (k, v) in &other.map {
            self.map.insert(k.clone(), v.clone());
        }
    }

    pub fn get_i64(&self, key: &str, default: i64) -> Result<i64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.trim().parse::<i64>().map_err(|e| anyhow!("property {key}={v:?} is not an integer: {e}")),
        }
    }

    pub fn get_f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.trim().parse::<f64>().map_err(|e| anyhow!("property {key}={v:?} is not a number: {e}")),
        }
    }

    /// Java's Boolean.parseBoolean: "true" (any case) is true, anything else false.
    pub fn get_bool(&self, key: &str, default: bool) -> bool {
        match self.get(key) {
            None => default,
            Some(v) => v.trim().eq_ignore_ascii_case("true"),
        }
    }

    /// Parses java.util.Properties text: `#`/`!` comments, `=`, `:` or whitespace separators,
    /// backslash line continuations and escapes (`\t`, `\n`, `\uXXXX`, ...).
    pub fn parse(text: &str) -> Result<Properties> {
        let mut props = Properties::new();
        let mut lines = text.lines().peekable();
        let mut line_number = 0usize;
        while let Some(raw) = lines.next() {
            line_number += 1;
            let mut logical = raw.trim_start().to_string();
            if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
                continue;
            }
            // An odd number of trailing backslashes continues the line.
            while ends_with_odd_backslashes(&logical) {
                logical.pop();
                match lines.next() {
                    Some(next) => {
                        line_number += 1;
                        logical.push_str(next.trim_start());
                    }
                    None => break,
                }
            }
            let (key, value) = split_key_value(&logical);
            let key = unescape(key).with_context(|| format!("line {line_number}"))?;
            let value = unescape(value).with_context(|| format!("line {line_number}"))?;
            props.map.insert(key, value);
        }
        Ok(props)
    }

    /// Loads `-P path`: a file on disk, or one of the bundled workloads by name
    /// (`workloada` or `workloads/workloada`).
    pub fn load_file(path: &str) -> Result<Properties> {
        let p = Path::new(path);
        if p.exists() {
            let len = std::fs::metadata(p).with_context(|| format!("stat {path}"))?.len();
            if len > PROPERTIES_FILE_SIZE_BYTES_MAX {
                bail!("{path} is {len} bytes; a workload file is at most {PROPERTIES_FILE_SIZE_BYTES_MAX}");
            }
            let text = std::fs::read_to_string(p).with_context(|| format!("read workload file {path}"))?;
            return Properties::parse(&text).with_context(|| format!("parse {path}"));
        }
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(path);
        match BUNDLED_WORKLOADS.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => Properties::parse(text),
            None => bail!("workload file {path} not found (bundled: workloada..workloadf)"),
        }
    }

    /// Parses a `-p key=value` argument.
    pub fn parse_assignment(arg: &str) -> Result<(String, String)> {
        match arg.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("-p expects key=value, got {arg:?}"),
        }
    }
}

fn ends_with_odd_backslashes(s: &str) -> bool {
    s.bytes().rev().take_while(|b| *b == b'\\').count() % 2 == 1
}

/// Splits at the first unescaped `=`, `:` or whitespace; separators around it are skipped.
fn split_key_value(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'=' | b':' | b' ' | b'\t' | b'\x0c' => break,
            _ => i += 1,
        }
    }
    let i = i.min(bytes.len());
    let key = &line[..i];
    let mut rest = &line[i..];
    rest = rest.trim_start_matches([' ', '\t', '\x0c']);
    if let Some(r) = rest.strip_prefix(['=', ':']) {
        rest = r.trim_start_matches([' ', '\t', '\x0c']);
    }
    (key, rest)
}

fn unescape(s: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16).map_err(|_| anyhow!("malformed \\u{hex} escape"))?;
                out.push(char::from_u32(code).ok_or_else(|| anyhow!("\\u{hex} is not a character"))?);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_properties_syntax() {
        let text = "# comment\n! also comment\n\nrecordcount=1000\noperationcount : 500\n  workload   site.ycsb.workloads.CoreWorkload\nkey\\ with\\ spaces = v\nmulti = a,\\\n    b,\\\n    c\nunicode=\\u0041b\\tc\nempty=\ntrailing\\\\\n";
        let p = Properties::parse(text).expect("parse");
        assert_eq!(p.get("recordcount"), Some("1000"));
        assert_eq!(p.get("operationcount"), Some("500"));
        assert_eq!(p.get("workload"), Some("site.ycsb.workloads.CoreWorkload"));
        assert_eq!(p.get("key with spaces"), Some("v"));
        assert_eq!(p.get("multi"), Some("a,b,c"));
        assert_eq!(p.get("unicode"), Some("Ab\tc"));
        assert_eq!(p.get("empty"), Some(""));
        // An even number of trailing backslashes is an escaped backslash, not a continuation.
        assert_eq!(p.get("trailing\\"), Some(""));
        assert_eq!(p.get("# comment"), None);
        assert!(Properties::parse("bad=\\uZZZZ").is_err());
    }

    #[test]
    fn typed_getters_and_overrides() {
        let mut p = Properties::parse("readallfields=TRUE\nfieldcount=10\nreadproportion=0.5\n").expect("parse");
        assert!(p.get_bool("readallfields", false));
        assert!(!p.get_bool("writeallfields", false));
        assert_eq!(p.get_i64("fieldcount", 1).expect("int"), 10);
        assert_eq!(p.get_i64("missing", 7).expect("default"), 7);
        assert_eq!(p.get_f64("readproportion", 0.0).expect("f64"), 0.5);
        let (k, v) = Properties::parse_assignment("fieldcount=3").expect("assign");
        p.set(k, v);
        assert_eq!(p.get_i64("fieldcount", 1).expect("int"), 3);
        assert!(p.get_i64("readproportion", 0).is_err());
        assert!(Properties::parse_assignment("novalue").is_err());
        assert_eq!(Properties::parse_assignment("url=mongodb://h/?w=1").expect("assign").1, "mongodb://h/?w=1");
    }

    #[test]
    fn bundled_workloads_match_ycsb() {
        let a = Properties::load_file("workloads/workloada").expect("a");
        assert_eq!(a.get("readproportion"), Some("0.5"));
        assert_eq!(a.get("updateproportion"), Some("0.5"));
        assert_eq!(a.get("requestdistribution"), Some("zipfian"));
        let b = Properties::load_file("workloadb").expect("b");
        assert_eq!(b.get("readproportion"), Some("0.95"));
        let d = Properties::load_file("workloadd").expect("d");
        assert_eq!(d.get("requestdistribution"), Some("latest"));
        let e = Properties::load_file("workloade").expect("e");
        assert_eq!(e.get("scanproportion"), Some("0.95"));
        assert_eq!(e.get("maxscanlength"), Some("100"));
        let f = Properties::load_file("workloadf").expect("f");
        assert_eq!(f.get("readmodifywriteproportion"), Some("0.5"));
        assert!(Properties::load_file("workloadz").is_err());
    }
}
