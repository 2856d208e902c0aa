//! Retryable writes' session fields: `Store::begin_retryable_write` and its guard, and the
//! `config.transactions` record a write or an applied entry keeps.

use super::*;

/// A session's `config.transactions` record, as a member applying a retryable write's
/// entry derives it: `{_id: {id: lsid}, txnNum, lastWriteOpTime, lastWriteDate}`.
pub fn session_record(lsid: &[u8], txn: i64, last: OpTime, wall_ms: i64) -> bson::RawDocumentBuf {
    bson::RawDocumentBuf::from_bytes(oplog::session_record(lsid, txn, last, wall_ms)).expect("session_record encodes a valid document")
}

/// A session's record once its transaction `txn` reached `state` (with the entry logged at
/// `last`): `session_record`'s fields and `state`.
pub fn transaction_session_record(lsid: &[u8], txn: i64, state: TxnRecordState, last: OpTime, wall_ms: i64) -> bson::RawDocumentBuf {
    let mut record = oplog::transaction_record(lsid, txn, state, OpTime::default(), wall_ms);
    oplog::stamp_session_record(&mut record, last);
    bson::RawDocumentBuf::from_bytes(record).expect("transaction_record encodes a valid document")
}

/// `config.transactions`.
pub const SESSION_RECORDS_DB: &str = "config";
pub const SESSION_RECORDS_COLLECTION: &str = "transactions";

/// A retryable write in progress (`Store::begin_retryable_write`): its store handle, whose
/// writes carry the session's fields, and the statement they belong to.
pub struct RetryableWrite {
    store: Store,
}

impl RetryableWrite {
    /// The store to write through: its writes are this retryable write's.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The statement (`stmtId`) the next writes belong to.
    pub fn set_statement(&self, stmt: i32) {
        self.store.ctx.with_session(|s| {
            if let Some(s) = s {
                s.stmt = stmt;
                s.stmt_per_document = None;
            }
        });
    }

    /// The statement of each document of the next `Collection::insert_many`.
    pub fn set_statement_per_document(&self, stmts: Vec<i32>) {
        self.store.ctx.with_session(|s| {
            if let Some(s) = s {
                s.stmt_per_document = Some(stmts);
            }
        });
    }

    /// The optime of the transaction's newest entry (what its session record says now).
    pub fn last_write(&self) -> OpTime {
        self.store.ctx.with_session(|s| s.map_or(OpTime::NULL, |s| s.prev))
    }

    /// Log the documents the next updates and deletes change, as they were or as they
    /// become, before their changes (a findAndModify's retry returns them).
    pub fn set_retry_image(&self, image: Option<RetryImage>) {
        self.store.ctx.with_session(|s| {
            if let Some(s) = s {
                s.image = image;
            }
        });
    }
}

impl Store {
    /// Session `lsid`'s `config.transactions` record, if it has one.
    pub fn session_record_of(&self, lsid: &[u8]) -> Result<Option<Document>> {
        let Some(records) = self.collection(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION) else { return Ok(None) };
        let id = bson::doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: lsid.to_vec() }};
        Ok(records.snapshot().find_by_id(&Bson::Document(id))?.map(|(_, d)| d))
    }

    /// Begin retryable write `txn` of session `lsid`, as mongod runs one: each oplog entry
    /// written through the returned handle's store carries `lsid`, `txnNumber`, the
    /// statement it belongs to (`RetryableWrite::set_statement`) and `prevOpTime` (the
    /// transaction's previous entry; `prev` for the first, `OpTime::NULL` when it has none),
    /// and each engine write that logs entries also writes the session's record in
    /// `config.transactions` (`lastWriteOpTime`: its newest entry). A retry finds what the
    /// transaction already did by walking the entries back from that record. A replica-set
    /// member only (no oplog: an error).
    pub fn begin_retryable_write(&self, lsid: &[u8], txn: i64, prev: OpTime) -> Result<RetryableWrite> {
        if self.inner.shared.oplog.read().is_none() {
            return Err(Error::new(Code::IllegalOperation, "Transaction numbers are only allowed on a replica set member or mongos"));
        }
        if self.ctx.with_session(|s| s.is_some()) {
            return Err(Error::internal("a retryable write began inside another"));
        }
        let records = self.collection_or_create(SESSION_RECORDS_DB, SESSION_RECORDS_COLLECTION)?;
        let ctx =
            self.ctx.session(oplog::SessionWrite { lsid: lsid.to_vec(), txn, records: records.state, prev, stmt: 0, stmt_per_document: None, image: None });
        Ok(RetryableWrite { store: Store { inner: self.inner.clone(), ctx } })
    }
}
