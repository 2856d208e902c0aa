//! Calendar arithmetic for date expressions (proleptic Gregorian, UTC plus fixed offsets).

use common::{Error, Result};

pub(crate) const MS_PER_DAY: i64 = 86_400_000;

/// Broken-down time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Civil {
    pub year: i64,
    pub month: u32, // 1..=12
    pub day: u32,   // 1..=31
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub millis: u32,
    /// 0 = Sunday.
    pub weekday: u32,
    /// 1-based day of year.
    pub yday: u32,
}

/// Days since 1970-01-01 -> (year, month, day). Howard Hinnant's civil_from_days.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(crate) fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

pub(crate) fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ => {
            if is_leap(y) {
                29
            } else {
                28
            }
        }
    }
}

pub(crate) fn civil(ms: i64) -> Civil {
    let days = ms.div_euclid(MS_PER_DAY);
    let rem = ms.rem_euclid(MS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let yday = (days - days_from_civil(year, 1, 1) + 1) as u32;
    Civil {
        year,
        month,
        day,
        hour: (rem / 3_600_000) as u32,
        minute: (rem / 60_000 % 60) as u32,
        second: (rem / 1000 % 60) as u32,
        millis: (rem % 1000) as u32,
        weekday: (days + 4).rem_euclid(7) as u32,
        yday,
    }
}

/// ISO 8601 week-numbering (year, week 1..=53, weekday 1=Monday..7=Sunday).
pub(crate) fn iso_week(c: &Civil) -> (i64, u32, u32) {
    let iso_dow = if c.weekday == 0 { 7 } else { c.weekday };
    let week = (c.yday as i64 - iso_dow as i64 + 10) / 7;
    if week < 1 {
        let prev = c.year - 1;
        // Weeks in the previous year.
        (prev, weeks_in_iso_year(prev), iso_dow)
    } else if week as u32 > weeks_in_iso_year(c.year) {
        (c.year + 1, 1, iso_dow)
    } else {
        (c.year, week as u32, iso_dow)
    }
}

fn weeks_in_iso_year(y: i64) -> u32 {
    let p = |y: i64| (y + y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400)).rem_euclid(7);
    if p(y) == 4 || p(y - 1) == 3 {
        53
    } else {
        52
    }
}

/// A time zone: only UTC and fixed offsets are known to shoal (no Olson database).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tz {
    pub offset_minutes: i32,
}

impl Tz {
    pub const UTC: Tz = Tz { offset_minutes: 0 };

    pub fn parse(s: &str) -> Result<Tz> {
        match s {
            "UTC" | "GMT" | "Z" | "Etc/UTC" | "Etc/GMT" | "Etc/Universal" | "Universal" | "Zulu" => return Ok(Tz::UTC),
            _ => {}
        }
        if let Some(off) = parse_offset(s) {
            return Ok(Tz { offset_minutes: off });
        }
        Err(Error::location(40485, format!("unrecognized time zone identifier: \"{s}\"")))
    }
}

/// "+hh", "+hhmm", "+hh:mm" (also '-') -> minutes east of UTC.
pub(crate) fn parse_offset(s: &str) -> Option<i32> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let (h, m) = match digits.len() {
        2 => (digits.parse::<i32>().ok()?, 0),
        4 => (digits[..2].parse::<i32>().ok()?, digits[2..].parse::<i32>().ok()?),
        _ => return None,
    };
    if rest.contains(':') && rest.len() != 5 {
        return None;
    }
    if h > 99 || m > 59 {
        return None;
    }
    Some(sign * (h * 60 + m))
}

/// Format like strftime with MongoDB's $dateToString specifiers.
pub(crate) fn format_date(fmt: &str, ms: i64, tz: Tz) -> Result<String> {
    let local = ms.saturating_add(tz.offset_minutes as i64 * 60_000);
    let c = civil(local);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    let need_year_range = fmt.contains("%Y") || fmt.contains("%G");
    if need_year_range && !(0..=9999).contains(&c.year) {
        return Err(Error::location(18537, format!("$dateToString is only defined on year 0-9999, tried to use year {}", c.year)));
    }
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(spec) = chars.next() else {
            return Err(Error::location(18535, "Unmatched '%' at end of format string"));
        };
        match spec {
            'Y' => out.push_str(&format!("{:04}", c.year)),
            'm' => out.push_str(&format!("{:02}", c.month)),
            'd' => out.push_str(&format!("{:02}", c.day)),
            'H' => out.push_str(&format!("{:02}", c.hour)),
            'M' => out.push_str(&format!("{:02}", c.minute)),
            'S' => out.push_str(&format!("{:02}", c.second)),
            'L' => out.push_str(&format!("{:03}", c.millis)),
            'j' => out.push_str(&format!("{:03}", c.yday)),
            'w' => out.push_str(&format!("{}", c.weekday + 1)),
            'u' => out.push_str(&format!("{}", iso_week(&c).2)),
            'U' => out.push_str(&format!("{:02}", (c.yday + 6 - c.weekday) / 7)),
            'V' => out.push_str(&format!("{:02}", iso_week(&c).1)),
            'G' => out.push_str(&format!("{:04}", iso_week(&c).0)),
            'z' => {
                let o = tz.offset_minutes;
                let sign = if o < 0 { '-' } else { '+' };
                out.push_str(&format!("{sign}{:02}{:02}", o.abs() / 60, o.abs() % 60));
            }
            'Z' => {
                let o = tz.offset_minutes;
                out.push_str(&format!("{}{}", if o < 0 { '-' } else { '+' }, o.abs()));
            }
            'b' => out.push_str(MONTHS_ABBR[(c.month - 1) as usize]),
            'B' => out.push_str(MONTHS_FULL[(c.month - 1) as usize]),
            '%' => out.push('%'),
            other => return Err(Error::location(18536, format!("Invalid format character '%{other}' in format string"))),
        }
    }
    Ok(out)
}

const MONTHS_ABBR: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const MONTHS_FULL: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

pub(crate) fn iso_string(ms: i64) -> String {
    let c = civil(ms);
    if (0..=9999).contains(&c.year) {
        format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", c.year, c.month, c.day, c.hour, c.minute, c.second, c.millis)
    } else {
        format!("{}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", c.year, c.month, c.day, c.hour, c.minute, c.second, c.millis)
    }
}

/// Parse an ISO-8601-like date string ("2019-03-01", "2019-03-01T10:00:00.123Z",
/// "2019-03-01 10:00:00+02:00"). Returns UTC milliseconds.
pub(crate) fn parse_iso(s: &str, default_tz: Tz) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = s.get(from..from + len)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let year = num(0, 4)?;
    if b.get(4) != Some(&b'-') {
        return None;
    }
    let month = num(5, 2)? as u32;
    if b.get(7) != Some(&b'-') {
        return None;
    }
    let day = num(8, 2)? as u32;
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let mut i = 10;
    let (mut h, mut mi, mut sec, mut ms) = (0i64, 0i64, 0i64, 0i64);
    let mut tz = default_tz;
    if i < b.len() {
        if b[i] != b'T' && b[i] != b' ' {
            return None;
        }
        i += 1;
        h = num(i, 2)?;
        i += 2;
        if b.get(i) == Some(&b':') {
            mi = num(i + 1, 2)?;
            i += 3;
            if b.get(i) == Some(&b':') {
                sec = num(i + 1, 2)?;
                i += 3;
                if b.get(i) == Some(&b'.') {
                    let start = i + 1;
                    let mut end = start;
                    while end < b.len() && b[end].is_ascii_digit() {
                        end += 1;
                    }
                    if end == start {
                        return None;
                    }
                    let frac = &s[start..end];
                    let frac3: String = frac.chars().chain("000".chars()).take(3).collect();
                    ms = frac3.parse().ok()?;
                    i = end;
                }
            }
        }
        if h > 23 || mi > 59 || sec > 60 {
            return None;
        }
        let rest = &s[i..];
        if rest == "Z" {
            tz = Tz::UTC;
        } else if !rest.is_empty() {
            tz = Tz { offset_minutes: parse_offset(rest)? };
        }
    }
    let days = days_from_civil(year, month, day);
    let local = days * MS_PER_DAY + h * 3_600_000 + mi * 60_000 + sec * 1000 + ms;
    Some(local - tz.offset_minutes as i64 * 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_roundtrip() {
        for days in [-800_000i64, -1, 0, 1, 59, 365, 10_957, 19_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        // 2014-01-01T08:15:39.736Z
        let c = civil(1_388_564_139_736);
        assert_eq!((c.year, c.month, c.day, c.hour, c.minute, c.second, c.millis), (2014, 1, 1, 8, 15, 39, 736));
        assert_eq!(c.weekday, 3); // Wednesday
        assert_eq!(c.yday, 1);
        assert_eq!(iso_week(&c), (2014, 1, 3));
    }

    #[test]
    fn formatting_and_parsing() {
        let ms = 1_388_564_139_736;
        assert_eq!(format_date("%Y-%m-%d %H:%M:%S.%L %j %w %U", ms, Tz::UTC).unwrap(), "2014-01-01 08:15:39.736 001 4 00");
        assert_eq!(iso_string(ms), "2014-01-01T08:15:39.736Z");
        assert_eq!(parse_iso("2014-01-01T08:15:39.736Z", Tz::UTC), Some(ms));
        assert_eq!(parse_iso("2014-01-01T10:15:39.736+02:00", Tz::UTC), Some(ms));
        assert_eq!(parse_iso("2014-01-01", Tz::UTC), Some(1_388_534_400_000));
        assert_eq!(parse_iso("2014-02-30", Tz::UTC), None);
        assert_eq!(Tz::parse("+05:30").unwrap().offset_minutes, 330);
        assert!(Tz::parse("America/New_York").is_err());
    }
}
