//! The subject of a client's X.509 certificate as MongoDB names X.509 users: the RFC 2253
//! string of the subject's distinguished name ("CN=ann,OU=clients,O=shoal"), last RDN
//! first. Only what that needs is parsed from the DER: the certificate's structure down to
//! the subject, and each attribute's type and value. rustls has already verified the
//! certificate against the CA before this reads it.

/// A DER element: its tag, and its contents.
struct Element<'a> {
    tag: u8,
    contents: &'a [u8],
}

/// The first element of `der` and what follows it.
fn element(der: &[u8]) -> Option<(Element<'_>, &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        // Long form: 1 to 4 length bytes (a certificate is far below 4 GiB).
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        (rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize), &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((Element { tag, contents: &rest[..len] }, &rest[len..]))
}

/// Every element inside `contents`.
fn elements(mut contents: &[u8]) -> Option<Vec<Element<'_>>> {
    let mut out = Vec::new();
    while !contents.is_empty() {
        let (e, rest) = element(contents)?;
        out.push(e);
        contents = rest;
    }
    Some(out)
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;

/// The subject of a DER certificate in RFC 2253 form; None if it cannot be read.
pub fn subject_name(cert_der: &[u8]) -> Option<String> {
    let (cert, _) = element(cert_der).filter(|(e, _)| e.tag == SEQUENCE)?;
    let (tbs, _) = element(cert.contents).filter(|(e, _)| e.tag == SEQUENCE)?;
    let mut fields = elements(tbs.contents)?.into_iter().peekable();
    if fields.peek().is_some_and(|f| f.tag == VERSION) {
        fields.next();
    }
    // serialNumber, signature, issuer, validity, subject.
    let subject = fields.nth(4).filter(|e| e.tag == SEQUENCE)?;
    let mut rdns = Vec::new();
    for rdn in elements(subject.contents)? {
        if rdn.tag != SET {
            return None;
        }
        let mut parts = Vec::new();
        for atv in elements(rdn.contents)? {
            let inner = elements(atv.contents).filter(|_| atv.tag == SEQUENCE)?;
            let [oid, value] = inner.as_slice() else { return None };
            if oid.tag != OID {
                return None;
            }
            parts.push(format!("{}={}", attribute_name(oid.contents), attribute_value(value)));
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// RFC 2253's short names for the usual attribute types, else the dotted OID.
fn attribute_name(oid: &[u8]) -> String {
    let known: &[(&[u8], &str)] = &[
        (&[0x55, 0x04, 0x03], "CN"),
        (&[0x55, 0x04, 0x06], "C"),
        (&[0x55, 0x04, 0x07], "L"),
        (&[0x55, 0x04, 0x08], "ST"),
        (&[0x55, 0x04, 0x09], "STREET"),
        (&[0x55, 0x04, 0x0a], "O"),
        (&[0x55, 0x04, 0x0b], "OU"),
        (&[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19], "DC"),
        (&[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01], "UID"),
    ];
    if let Some((_, name)) = known.iter().find(|(o, _)| *o == oid) {
        return name.to_string();
    }
    dotted(oid)
}

fn dotted(oid: &[u8]) -> String {
    let mut parts: Vec<u64> = Vec::new();
    let mut n: u64 = 0;
    for (i, b) in oid.iter().enumerate() {
        n = (n << 7) | (b & 0x7f) as u64;
        if b & 0x80 == 0 {
            if parts.is_empty() && i < 8 {
                let first = (n / 40).min(2);
                parts.push(first);
                parts.push(n - first * 40);
            } else {
                parts.push(n);
            }
            n = 0;
        }
    }
    parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(".")
}

/// A string value, escaped as RFC 2253 says; any other type as '#' and its DER in hex.
fn attribute_value(value: &Element) -> String {
    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const T61: u8 = 0x14;
    const IA5: u8 = 0x16;
    const BMP: u8 = 0x1e;
    let text = match value.tag {
        UTF8 | PRINTABLE | T61 | IA5 => std::str::from_utf8(value.contents).ok().map(str::to_string),
        BMP => {
            let units: Vec<u16> = value.contents.chunks(2).filter(|c| c.len() == 2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    };
    let Some(text) = text else {
        let mut hex = String::from("#");
        hex.push_str(&format!("{:02x}", value.tag));
        hex.push_str(&format!("{:02x}", value.contents.len()));
        for b in value.contents {
            hex.push_str(&format!("{b:02x}"));
        }
        return hex;
    };
    let mut out = String::with_capacity(text.len());
    let last = text.chars().count().saturating_sub(1);
    for (i, c) in text.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || (i == 0 && (c == '#' || c == ' ')) || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DER of `tag` around `contents`.
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if contents.len() < 0x80 {
            out.push(contents.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(contents.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(contents);
        out
    }

    fn rdn(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        der(SET, &der(SEQUENCE, &[der(OID, oid), der(tag, value)].concat()))
    }

    fn certificate(subject_rdns: &[Vec<u8>]) -> Vec<u8> {
        let subject = der(SEQUENCE, &subject_rdns.concat());
        let tbs = [
            der(VERSION, &der(0x02, &[2])),
            der(0x02, &[1, 2, 3]),
            der(SEQUENCE, &der(OID, &[0x2a, 0x86, 0x48])),
            der(SEQUENCE, &rdn(&[0x55, 0x04, 0x03], 0x0c, b"issuer")),
            der(SEQUENCE, &[der(0x17, b"260101000000Z"), der(0x17, b"270101000000Z")].concat()),
            subject,
            der(SEQUENCE, &[0u8; 200]),
        ]
        .concat();
        der(SEQUENCE, &[der(SEQUENCE, &tbs), der(SEQUENCE, &der(OID, &[0x2a])), der(0x03, &[0, 1, 2])].concat())
    }

    #[test]
    fn subjects_print_as_rfc_2253_last_rdn_first() {
        let cert = certificate(&[
            rdn(&[0x55, 0x04, 0x06], 0x13, b"US"),
            rdn(&[0x55, 0x04, 0x0a], 0x0c, b"shoal"),
            rdn(&[0x55, 0x04, 0x0b], 0x0c, b"clients"),
            rdn(&[0x55, 0x04, 0x03], 0x0c, b"ann"),
        ]);
        assert_eq!(subject_name(&cert).as_deref(), Some("CN=ann,OU=clients,O=shoal,C=US"));
        // Special characters are escaped; unknown attribute types print as dotted OIDs.
        let cert = certificate(&[rdn(&[0x55, 0x04, 0x03], 0x0c, b"a,b+c \"d\""), rdn(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01], 0x16, b"x@y")]);
        assert_eq!(subject_name(&cert).as_deref(), Some("1.2.840.113549.1.9.1=x@y,CN=a\\,b\\+c \\\"d\\\""));
    }

    #[test]
    fn broken_certificates_have_no_subject() {
        let good = certificate(&[rdn(&[0x55, 0x04, 0x03], 0x0c, b"ann")]);
        for cut in [0, 1, 5, 30, good.len() / 2] {
            assert_eq!(subject_name(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(subject_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(subject_name(b"not a certificate"), None);
    }
}
