//! The server side of saslStart and saslContinue (SCRAM-SHA-1 and SCRAM-SHA-256, whose
//! messages are `net::scram`'s): parse the command, start a conversation against the
//! user's credentials, step it, and say who logged in. The caller finds the credentials
//! (mongod in its own store, the router on the config servers), records the login and
//! audits it.

use crate::ConnAuth;
use bson::{doc, spec::BinarySubtype, Binary, Bson, Document};
use common::{Code, Error, Result};
use net::scram;

/// The one error a failed login gets, whatever the cause: the client learns no more.
pub fn auth_failed() -> Error {
    Error::new(Code::AuthenticationFailed, "Authentication failed.")
}

fn payload_of(cmd: &Document) -> Result<Vec<u8>> {
    match cmd.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| Error::bad_value("payload is not valid base64"))
        }
        _ => Err(Error::bad_value("saslStart and saslContinue need a payload (BinData or a base64 string)")),
    }
}

fn sasl_reply(payload: Vec<u8>, done: bool) -> Document {
    doc! {"conversationId": 1, "done": done, "payload": Binary { subtype: BinarySubtype::Generic, bytes: payload }}
}

/// A parsed saslStart: the mechanism, the client's first message and the user it names.
pub struct Start {
    pub mechanism: scram::Mechanism,
    pub user: String,
    payload: Vec<u8>,
    skip_empty: bool,
}

/// Parse saslStart on `db` (also hello's speculativeAuthenticate). A new saslStart
/// abandons a conversation under way.
pub fn parse_start(auth: &mut ConnAuth, db: &str, cmd: &Document) -> Result<Start> {
    let name = cmd.get_str("mechanism").map_err(|_| Error::bad_value("saslStart needs a mechanism string"))?;
    let Some(mechanism) = scram::Mechanism::parse(name) else {
        return Err(Error::new(Code::MechanismUnavailable, format!("Unsupported mechanism '{name}' on authentication database '{db}'")));
    };
    let skip_empty = match cmd.get_document("options").ok().and_then(|o| o.get("skipEmptyExchange")) {
        None => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => return Err(Error::bad_value("skipEmptyExchange must be boolean")),
    };
    let payload = payload_of(cmd)?;
    auth.conversation = None;
    let user = scram::client_first_user(&payload).map_err(|why| {
        tracing::info!("authentication failed: {why}");
        auth_failed()
    })?;
    Ok(Start { mechanism, user, payload, skip_empty })
}

/// Begin the conversation of `start` against the user's `credentials` (None: no such user
/// with that mechanism); the reply carries the server's first message.
pub fn begin(auth: &mut ConnAuth, db: &str, start: Start, credentials: Option<scram::Credentials>) -> Result<Document> {
    let Some(credentials) = credentials else {
        tracing::info!("authentication failed: no user {}@{db} with {}", start.user, start.mechanism.name());
        return Err(auth_failed());
    };
    let (conversation, server_first) = scram::Conversation::start(start.mechanism, &start.payload, credentials, start.skip_empty).map_err(|why| {
        tracing::info!("authentication failed: {why}");
        auth_failed()
    })?;
    auth.conversation = Some((conversation, db.to_string()));
    Ok(sasl_reply(server_first, false))
}

/// Who finished a conversation, for the caller to log in (and audit).
pub struct Login {
    pub user: String,
    pub db: String,
    pub mechanism: &'static str,
}

/// What one saslContinue did.
pub enum Step {
    /// The conversation goes on with this reply.
    Continue(Document),
    /// The client proved it holds the password: log it in, then send the reply.
    Done(Document, Login),
    /// The proof failed; the conversation is over and the reply is `auth_failed`.
    Failed(Login),
}

/// saslContinue.
pub fn step(auth: &mut ConnAuth, cmd: &Document) -> Result<Step> {
    match cmd.get("conversationId") {
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) => {}
        Some(Bson::Double(v)) if *v == 1.0 => {}
        _ => return Err(Error::new(Code::ProtocolError, "sasl: Mismatched conversation id")),
    }
    let payload = payload_of(cmd)?;
    let Some((conversation, db)) = auth.conversation.as_mut() else {
        return Err(Error::new(Code::ProtocolError, "No SASL session state found"));
    };
    let login = Login { user: conversation.user.clone(), db: db.clone(), mechanism: conversation.mechanism.name() };
    match conversation.step(&payload) {
        Ok((reply, done)) => {
            if !done {
                return Ok(Step::Continue(sasl_reply(reply, false)));
            }
            auth.conversation = None;
            Ok(Step::Done(sasl_reply(reply, true), login))
        }
        Err(why) => {
            tracing::info!("authentication of {}@{} failed: {why}", login.user, login.db);
            auth.conversation = None;
            Ok(Step::Failed(login))
        }
    }
}
