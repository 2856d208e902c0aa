//! SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802, RFC 7677) as mongod runs them: the stored
//! credentials of a user and the server side of one authentication conversation.
//!
//! MongoDB's variations on the RFC: SCRAM-SHA-1 hashes the password first (the hex MD5 of
//! "user:mongo:password"), SCRAM-SHA-256 SASLprep's it; user names are not SASLprep'd; with
//! `skipEmptyExchange` the server's final message ends the conversation, without it the
//! client sends one more, empty, message.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bson::{doc, Document};
use common::{Code, Error, Result};
use hmac::{KeyInit, Mac};
use sha1::Digest;

/// Fewest PBKDF2 iterations accepted (mongod: `scramIterationCount` and
/// `scramSHA256IterationCount` take at least 5000).
pub const ITERATIONS_MIN: u32 = 5_000;
/// Bytes of random nonce the server adds to the client's (mongod: 24).
const SERVER_NONCE_BYTES: usize = 24;
/// A client-first or client-final message longer than this is refused (they are a few
/// hundred bytes; the bound keeps a hostile peer from making us parse megabytes).
const MESSAGE_BYTES_MAX: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Sha1,
    Sha256,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha1, Mechanism::Sha256];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha1 => "SCRAM-SHA-1",
            Mechanism::Sha256 => "SCRAM-SHA-256",
        }
    }

    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// mongod's defaults: `scramIterationCount` 10000, `scramSHA256IterationCount` 15000.
    pub fn iterations_default(self) -> u32 {
        match self {
            Mechanism::Sha1 => 10_000,
            Mechanism::Sha256 => 15_000,
        }
    }

    /// The hash's length less 4, as mongod salts.
    fn salt_bytes(self) -> usize {
        match self {
            Mechanism::Sha1 => 16,
            Mechanism::Sha256 => 28,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => sha1::Sha1::digest(data).to_vec(),
            Mechanism::Sha256 => sha2::Sha256::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
            // HMAC takes keys of any length.
            let mut m = <M as KeyInit>::new_from_slice(key).expect("HMAC accepts any key length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Mechanism::Sha1 => run::<hmac::Hmac<sha1::Sha1>>(key, data),
            Mechanism::Sha256 => run::<hmac::Hmac<sha2::Sha256>>(key, data),
        }
    }

    /// Hi() of RFC 5802: PBKDF2 with this hash's HMAC.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => {
                let mut out = vec![0; 20];
                pbkdf2::pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, &mut out);
                out
            }
            Mechanism::Sha256 => {
                let mut out = vec![0; 32];
                pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, &mut out);
                out
            }
        }
    }

    /// What the mechanism feeds to Hi() for `password`.
    fn password_input(self, user: &str, password: &str) -> Result<String> {
        match self {
            Mechanism::Sha1 => {
                let digest = md5::Md5::digest(format!("{user}:mongo:{password}").as_bytes());
                Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
            }
            Mechanism::Sha256 => {
                stringprep::saslprep(password).map(|p| p.into_owned()).map_err(|_| Error::new(Code::BadValue, "the password cannot be prepared with SASLprep"))
            }
        }
    }
}

/// A user's stored secret for one mechanism: never the password, only what verifies a proof
/// of it (StoredKey) and what proves the server knows it (ServerKey).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub iteration_count: u32,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl Credentials {
    /// New credentials with a fresh random salt.
    pub fn new(mechanism: Mechanism, user: &str, password: &str) -> Result<Credentials> {
        let salt: Vec<u8> = (0..mechanism.salt_bytes()).map(|_| rand::random::<u8>()).collect();
        Credentials::derive(mechanism, user, password, mechanism.iterations_default(), &salt)
    }

    pub fn derive(mechanism: Mechanism, user: &str, password: &str, iterations: u32, salt: &[u8]) -> Result<Credentials> {
        let input = mechanism.password_input(user, password)?;
        let salted = mechanism.salted_password(input.as_bytes(), salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        Ok(Credentials {
            iteration_count: iterations,
            salt: salt.to_vec(),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        })
    }

    /// As admin.system.users keeps them: base64 strings and an int32 count.
    pub fn to_document(&self) -> Document {
        doc! {
            "iterationCount": self.iteration_count as i32,
            "salt": B64.encode(&self.salt),
            "storedKey": B64.encode(&self.stored_key),
            "serverKey": B64.encode(&self.server_key),
        }
    }

    pub fn from_document(d: &Document) -> Option<Credentials> {
        let field = |k: &str| d.get_str(k).ok().and_then(|s| B64.decode(s).ok());
        Some(Credentials {
            iteration_count: u32::try_from(d.get_i32("iterationCount").ok()?).ok()?,
            salt: field("salt")?,
            stored_key: field("storedKey")?,
            server_key: field("serverKey")?,
        })
    }
}

/// Where a conversation stands.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The server-first message went out; the client's proof comes next.
    SentChallenge,
    /// The proof was right and the server's signature went out; the client's empty message
    /// comes next (no `skipEmptyExchange`).
    SentSignature,
    Done,
}

/// The server side of one conversation, from saslStart to the last saslContinue.
#[derive(Debug)]
pub struct Conversation {
    pub mechanism: Mechanism,
    /// The user, as named in the client-first message (unescaped).
    pub user: String,
    credentials: Credentials,
    nonce: String,
    /// client-first-bare "," server-first: the start of the AuthMessage.
    auth_message_start: String,
    skip_empty_exchange: bool,
    step: Step,
}

/// Why a step failed. Every failure goes to the client as AuthenticationFailed, whatever
/// it was (mongod does not say whether the user exists); this says it in the server's log.
pub type StepError = String;

/// The user a client-first message names (for the credential lookup before `start`).
pub fn client_first_user(payload: &[u8]) -> std::result::Result<String, StepError> {
    Ok(parse_client_first(payload)?.0)
}

/// (user, client nonce, client-first-bare) of a client-first message.
fn parse_client_first(payload: &[u8]) -> std::result::Result<(String, String, String), StepError> {
    if payload.len() > MESSAGE_BYTES_MAX {
        return Err("client-first message too long".into());
    }
    let text = std::str::from_utf8(payload).map_err(|_| "client-first message is not UTF-8")?;
    // gs2 header: a channel-binding flag, an optional authzid, then the bare message.
    let mut parts = text.splitn(3, ',');
    let (cb, authzid, bare) = (parts.next().unwrap_or(""), parts.next().ok_or("no gs2 header")?, parts.next().ok_or("no gs2 header")?);
    match cb {
        "n" | "y" => {}
        c if c.starts_with("p=") => return Err("Server does not support channel binding".into()),
        _ => return Err("invalid gs2 header".into()),
    }
    let mut user = None;
    let mut nonce = None;
    for attr in bare.split(',') {
        match attr.split_once('=') {
            Some(("n", v)) if user.is_none() => user = Some(unescape_user(v)?),
            Some(("r", v)) if nonce.is_none() => nonce = Some(v.to_string()),
            Some(("m", _)) => return Err("SCRAM mandatory extensions are not supported".into()),
            _ => return Err(format!("invalid client-first attribute {attr:?}")),
        }
    }
    let (user, nonce) = (user.ok_or("no user name")?, nonce.ok_or("no client nonce")?);
    if user.is_empty() || nonce.len() < 4 || !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',') {
        return Err("invalid user name or client nonce".into());
    }
    if let Some(a) = authzid.strip_prefix("a=") {
        if unescape_user(a)? != user {
            return Err("the authorization identity must be the user".into());
        }
    } else if !authzid.is_empty() {
        return Err("invalid gs2 header".into());
    }
    Ok((user, nonce, bare.to_string()))
}

/// A SCRAM user name: "=2C" is ',', "=3D" is '='; any other '=' is an error.
fn unescape_user(s: &str) -> std::result::Result<String, StepError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err("invalid escape in the user name".into()),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Conversation {
    /// Answer a client-first message (`payload`) for a user with `credentials`; returns the
    /// conversation and the server-first message.
    pub fn start(
        mechanism: Mechanism,
        payload: &[u8],
        credentials: Credentials,
        skip_empty_exchange: bool,
    ) -> std::result::Result<(Conversation, Vec<u8>), StepError> {
        let (user, client_nonce, bare) = parse_client_first(payload)?;
        let server_nonce: Vec<u8> = (0..SERVER_NONCE_BYTES).map(|_| rand::random::<u8>()).collect();
        let nonce = format!("{client_nonce}{}", B64.encode(server_nonce));
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&credentials.salt), credentials.iteration_count);
        let conversation = Conversation {
            mechanism,
            user,
            credentials,
            nonce,
            auth_message_start: format!("{bare},{server_first}"),
            skip_empty_exchange,
            step: Step::SentChallenge,
        };
        Ok((conversation, server_first.into_bytes()))
    }

    /// Take the client's next message; returns the reply and whether the conversation is
    /// done (the user is authenticated).
    pub fn step(&mut self, payload: &[u8]) -> std::result::Result<(Vec<u8>, bool), StepError> {
        match self.step {
            Step::SentChallenge => {
                let signature = self.verify_proof(payload)?;
                self.step = if self.skip_empty_exchange { Step::Done } else { Step::SentSignature };
                Ok((format!("v={}", B64.encode(signature)).into_bytes(), self.step == Step::Done))
            }
            Step::SentSignature if payload.is_empty() => {
                self.step = Step::Done;
                Ok((Vec::new(), true))
            }
            Step::SentSignature => Err("the client's last SCRAM message must be empty".into()),
            Step::Done => Err("Invalid SCRAM authentication step: the conversation is over".into()),
        }
    }

    /// Check a client-final message; the server signature when its proof is right.
    fn verify_proof(&self, payload: &[u8]) -> std::result::Result<Vec<u8>, StepError> {
        if payload.len() > MESSAGE_BYTES_MAX {
            return Err("client-final message too long".into());
        }
        let text = std::str::from_utf8(payload).map_err(|_| "client-final message is not UTF-8")?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or("no proof in the client-final message")?;
        let mut channel = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            match attr.split_once('=') {
                Some(("c", v)) if channel.is_none() => channel = Some(v),
                Some(("r", v)) if nonce.is_none() => nonce = Some(v),
                _ => return Err(format!("invalid client-final attribute {attr:?}")),
            }
        }
        if channel.is_none_or(|c| c.is_empty()) {
            return Err("no channel binding in the client-final message".into());
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err("the client-final nonce is not the conversation's".into());
        }
        let proof = B64.decode(proof).map_err(|_| "the proof is not base64")?;
        let m = self.mechanism;
        let auth_message = format!("{},{without_proof}", self.auth_message_start);
        let client_signature = m.hmac(&self.credentials.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err("SCRAM authentication failed, storedKey mismatch".into());
        }
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        // Compared in constant time: how much of a guess matched must not show in the timing.
        let stored = m.hash(&client_key);
        let differs = stored.iter().zip(&self.credentials.stored_key).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs != 0 || stored.len() != self.credentials.stored_key.len() {
            return Err("SCRAM authentication failed, storedKey mismatch".into());
        }
        Ok(m.hmac(&self.credentials.server_key, auth_message.as_bytes()))
    }
}

/// The client side of a conversation (a member authenticating to another with the keyFile).
pub struct ClientConversation {
    mechanism: Mechanism,
    user: String,
    /// The user as the messages carry it ("=2C" for ',', "=3D" for '=').
    escaped_user: String,
    password: String,
    client_nonce: String,
    /// The server signature the last message must carry, once the proof went out.
    expected_signature: Option<Vec<u8>>,
}

impl ClientConversation {
    /// The conversation and its client-first message.
    pub fn start(mechanism: Mechanism, user: &str, password: &str) -> (ClientConversation, Vec<u8>) {
        let nonce: Vec<u8> = (0..SERVER_NONCE_BYTES).map(|_| rand::random::<u8>()).collect();
        let client_nonce = B64.encode(nonce);
        let escaped = user.replace('=', "=3D").replace(',', "=2C");
        let first = format!("n,,n={escaped},r={client_nonce}");
        (
            ClientConversation {
                mechanism,
                user: user.to_string(),
                escaped_user: escaped,
                password: password.to_string(),
                client_nonce,
                expected_signature: None,
            },
            first.into_bytes(),
        )
    }

    /// The client-final message (with the proof) for the server-first message.
    pub fn respond(&mut self, server_first: &[u8]) -> std::result::Result<Vec<u8>, StepError> {
        let text = std::str::from_utf8(server_first).map_err(|_| "server-first message is not UTF-8")?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attr in text.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = B64.decode(v).ok(),
                Some(("i", v)) => iterations = v.parse::<u32>().ok(),
                _ => return Err(format!("invalid server-first attribute {attr:?}")),
            }
        }
        let (nonce, salt, iterations) = (nonce.ok_or("no nonce")?, salt.ok_or("no salt")?, iterations.ok_or("no iteration count")?);
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err("the server's nonce does not extend ours".into());
        }
        // A server asking for few iterations would make a stolen exchange cheap to crack.
        if iterations < ITERATIONS_MIN {
            return Err(format!("the server asks for {iterations} iterations, fewer than {ITERATIONS_MIN}"));
        }
        let m = self.mechanism;
        let input = m.password_input(&self.user, &self.password).map_err(|e| e.message)?;
        let salted = m.salted_password(input.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("n={},r={},{text},{without_proof}", self.escaped_user, self.client_nonce);
        let signature = m.hmac(&m.hash(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.expected_signature = Some(m.hmac(&m.hmac(&salted, b"Server Key"), auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Check the server-final message: the server knew the password too.
    pub fn verify(&self, server_final: &[u8]) -> std::result::Result<(), StepError> {
        let expected = self.expected_signature.as_ref().ok_or("no proof was sent")?;
        let text = std::str::from_utf8(server_final).map_err(|_| "server-final message is not UTF-8")?;
        let got = text.strip_prefix("v=").and_then(|v| B64.decode(v).ok()).ok_or("no server signature")?;
        if &got != expected {
            return Err("the server's signature is wrong: it does not know the key".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's side of the exchange, written from RFC 5802, to drive the server.
    fn client_final(m: Mechanism, user: &str, password: &str, client_first_bare: &str, server_first: &str) -> (String, Vec<u8>) {
        let attrs: Vec<(&str, &str)> = server_first.split(',').map(|a| a.split_once('=').unwrap()).collect();
        let nonce = attrs[0].1;
        let salt = B64.decode(attrs[1].1).unwrap();
        let iterations: u32 = attrs[2].1.parse().unwrap();
        let input = m.password_input(user, password).unwrap();
        let salted = m.salted_password(input.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = m.hmac(&stored, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let server_signature = m.hmac(&m.hmac(&salted, b"Server Key"), auth_message.as_bytes());
        (format!("{without_proof},p={}", B64.encode(proof)), server_signature)
    }

    #[test]
    fn the_right_password_authenticates_and_the_server_proves_it_knows_it() {
        for m in Mechanism::ALL {
            for skip in [true, false] {
                let creds = Credentials::new(m, "ann", "s3cret").unwrap();
                let first = b"n,,n=ann,r=fyko+d2lbbFgONRv9qkxdawL";
                let (mut conv, server_first) = Conversation::start(m, first, creds.clone(), skip).unwrap();
                let server_first = String::from_utf8(server_first).unwrap();
                assert!(server_first.starts_with("r=fyko+d2lbbFgONRv9qkxdawL") && server_first.len() > 40, "{server_first}");
                let (final_msg, expected) = client_final(m, "ann", "s3cret", "n=ann,r=fyko+d2lbbFgONRv9qkxdawL", &server_first);
                let (reply, done) = conv.step(final_msg.as_bytes()).unwrap();
                assert_eq!(reply, format!("v={}", B64.encode(expected)).into_bytes());
                assert_eq!(done, skip);
                if !skip {
                    // Without skipEmptyExchange one empty message ends it.
                    assert!(conv.step(b"x").is_err());
                    assert_eq!(conv.step(b"").unwrap(), (Vec::new(), true));
                }
                // A proof made for another conversation (another server nonce) fails.
                let (mut other, other_first) = Conversation::start(m, first, creds, skip).unwrap();
                assert_ne!(other_first, server_first.as_bytes());
                assert!(other.step(final_msg.as_bytes()).is_err());
                assert!(conv.step(b"").is_err(), "a finished conversation takes nothing more");
            }
        }
    }

    #[test]
    fn a_wrong_password_or_a_changed_message_fails() {
        for m in Mechanism::ALL {
            let creds = Credentials::new(m, "ann", "s3cret").unwrap();
            let first = b"n,,n=ann,r=abcdefgh";
            let (mut conv, sf) = Conversation::start(m, first, creds.clone(), true).unwrap();
            let sf = String::from_utf8(sf).unwrap();
            let (bad, _) = client_final(m, "ann", "wrong", "n=ann,r=abcdefgh", &sf);
            assert!(conv.step(bad.as_bytes()).unwrap_err().contains("storedKey mismatch"));
            let (mut conv, sf) = Conversation::start(m, first, creds, true).unwrap();
            let sf = String::from_utf8(sf).unwrap();
            let (good, _) = client_final(m, "ann", "s3cret", "n=ann,r=abcdefgh", &sf);
            for tampered in
                [good.replace("c=biws", "c=eSws"), good.replace("r=abcdefgh", "r=abcdefgX"), good.replace(",p=", ",p=AAAA"), good.replace("c=biws,", "")]
            {
                assert!(conv.step(tampered.as_bytes()).is_err(), "{tampered}");
            }
        }
    }

    #[test]
    fn the_client_side_talks_to_the_server_side() {
        for m in Mechanism::ALL {
            // A name that needs escaping: SCRAM-SHA-1 hashes the name itself, unescaped.
            let creds = Credentials::new(m, "a,b=c", "keyfilecontents").unwrap();
            let (mut client, first) = ClientConversation::start(m, "a,b=c", "keyfilecontents");
            let (mut server, server_first) = Conversation::start(m, &first, creds.clone(), true).unwrap();
            let proof = client.respond(&server_first).unwrap();
            let (server_final, done) = server.step(&proof).unwrap();
            assert!(done);
            client.verify(&server_final).unwrap();
            assert!(client.verify(b"v=AAAA").is_err());
            // The wrong key fails on the server.
            let (mut client, first) = ClientConversation::start(m, "a,b=c", "otherkey");
            let (mut server, server_first) = Conversation::start(m, &first, creds, true).unwrap();
            assert!(server.step(&client.respond(&server_first).unwrap()).is_err());
        }
    }

    #[test]
    fn client_first_messages_are_parsed_strictly() {
        assert_eq!(client_first_user(b"n,,n=a=2Cb=3Dc,r=abcd").unwrap(), "a,b=c");
        assert_eq!(client_first_user(b"n,a=ann,n=ann,r=abcd").unwrap(), "ann");
        for bad in [
            &b"p=tls-unique,,n=ann,r=abcd"[..],
            b"n,,n=ann",
            b"n,,r=abcd",
            b"x,,n=ann,r=abcd",
            b"n,,n=a=2Xb,r=abcd",
            b"n,,n=ann,r=abc",
            b"n,a=bob,n=ann,r=abcd",
            b"n,,n=ann,r=abcd,m=ext",
            b"",
            b"\xff,,",
            &[b'n'; 5000][..],
        ] {
            assert!(client_first_user(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn credentials_match_mongods_derivation_and_round_trip() {
        // SCRAM-SHA-1 hashes "user:mongo:password" first: the RFC 5802 example vector does
        // not apply, so check the derivation against its definition instead.
        let salt = B64.decode("QSXCR+Q6sek8bf92").unwrap();
        let c = Credentials::derive(Mechanism::Sha1, "user", "pencil", 4096, &salt).unwrap();
        let input: String = md5::Md5::digest(b"user:mongo:pencil").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(input.len(), 32);
        let salted = Mechanism::Sha1.salted_password(input.as_bytes(), &salt, 4096);
        assert_eq!(c.stored_key, Mechanism::Sha1.hash(&Mechanism::Sha1.hmac(&salted, b"Client Key")));
        // RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil".
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let c = Credentials::derive(Mechanism::Sha256, "user", "pencil", 4096, &salt).unwrap();
        let salted = Mechanism::Sha256.salted_password(b"pencil", &salt, 4096);
        let server_key = Mechanism::Sha256.hmac(&salted, b"Server Key");
        assert_eq!(c.server_key, server_key);
        assert_eq!(Credentials::from_document(&c.to_document()), Some(c));
        assert_eq!(Credentials::new(Mechanism::Sha256, "u", "p").unwrap().salt.len(), 28);
        assert_eq!(Credentials::new(Mechanism::Sha1, "u", "p").unwrap().iteration_count, 10_000);
    }

    #[test]
    fn rfc7677_example_conversation_verifies() {
        // The exchange printed in RFC 7677 section 3, replayed against the server side with
        // the RFC's server nonce and salt.
        let m = Mechanism::Sha256;
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let creds = Credentials::derive(m, "user", "pencil", 4096, &salt).unwrap();
        let conv = Conversation {
            mechanism: m,
            user: "user".into(),
            credentials: creds,
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            auth_message_start: "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".into(),
            skip_empty_exchange: true,
            step: Step::SentChallenge,
        };
        let signature =
            conv.verify_proof(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        assert_eq!(B64.encode(signature), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }
}
