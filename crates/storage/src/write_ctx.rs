//! How a handle's writes are logged. A `Store` or `Collection` handle carries a `WriteCtx`
//! and every write through it follows it: an ordinary one is logged when the store keeps an
//! oplog; a replicated one (a secondary applying its source's entries, initial sync's copy,
//! rollback) is not, as those entries are written as they came; a retryable write's entries
//! carry its session's fields and its batches write the session's record. A handle may also
//! collect the collections its writes create (the audit log's records). The context is a
//! value the caller holds, never state of the thread that happens to run the write.

use super::*;

/// How writes through a handle are logged (see the module's doc): `None` is the ordinary
/// context, which costs nothing to carry.
#[derive(Clone, Default)]
pub struct WriteCtx(Option<Arc<Mode>>);

#[derive(Default)]
pub(crate) struct Mode {
    replicated: bool,
    session: Option<Mutex<oplog::SessionWrite>>,
    /// The transaction the handle reads and writes in.
    transaction: Option<Arc<Transaction>>,
    /// The past point a snapshot read's handle reads at (`Store::reading_at`).
    read_at: Option<Arc<dyn EngineSnapshot>>,
    /// The collections created through the handle, when it collects them.
    created: Option<Arc<Mutex<Vec<Created>>>>,
}

/// A collection created through a handle that collects creations
/// (`Store::collecting_creations`): the audit log's createCollection and createDatabase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    pub db: String,
    pub coll: String,
    /// The database is new with it.
    pub new_db: bool,
}

impl WriteCtx {
    /// Writes that are not logged: they apply entries logged elsewhere.
    pub fn replicated() -> WriteCtx {
        WriteCtx(Some(Arc::new(Mode { replicated: true, ..Default::default() })))
    }

    /// A retryable write's context within this one (it collects creations where this does).
    pub(crate) fn session(&self, s: oplog::SessionWrite) -> WriteCtx {
        let parent = self.0.as_deref();
        WriteCtx(Some(Arc::new(Mode {
            replicated: parent.is_some_and(|m| m.replicated),
            session: Some(Mutex::new(s)),
            transaction: None,
            read_at: None,
            created: parent.and_then(|m| m.created.clone()),
        })))
    }

    /// This context, reading and writing in `txn` (it collects creations where this does).
    pub(crate) fn transaction_ctx(&self, txn: Arc<Transaction>) -> WriteCtx {
        let parent = self.0.as_deref();
        WriteCtx(Some(Arc::new(Mode {
            replicated: parent.is_some_and(|m| m.replicated),
            session: None,
            transaction: Some(txn),
            read_at: None,
            created: parent.and_then(|m| m.created.clone()),
        })))
    }

    /// This context, reading at `view` (a snapshot read's past point).
    pub(crate) fn read_at(&self, view: Arc<dyn EngineSnapshot>) -> WriteCtx {
        let parent = self.0.as_deref();
        WriteCtx(Some(Arc::new(Mode {
            replicated: parent.is_some_and(|m| m.replicated),
            session: None,
            transaction: None,
            read_at: Some(view),
            created: parent.and_then(|m| m.created.clone()),
        })))
    }

    /// The past point this handle reads at, if any.
    pub(crate) fn read_view(&self) -> Option<&Arc<dyn EngineSnapshot>> {
        self.0.as_deref().and_then(|m| m.read_at.as_ref())
    }

    /// The transaction this handle works in, if any.
    pub(crate) fn transaction(&self) -> Option<&Arc<Transaction>> {
        self.0.as_deref().and_then(|m| m.transaction.as_ref())
    }

    /// Whether writes through this handle belong to a transaction.
    pub fn in_transaction(&self) -> bool {
        self.transaction().is_some()
    }

    pub fn is_replicated(&self) -> bool {
        self.0.as_deref().is_some_and(|m| m.replicated)
    }

    /// Note a creation, when this context collects them.
    pub(crate) fn note_created(&self, db: &str, coll: &str, new_db: bool) {
        // Unbounded here: one command creates at most what its message (48 MB) names.
        if let Some(created) = self.0.as_deref().and_then(|m| m.created.as_ref()) {
            created.lock().push(Created { db: db.to_string(), coll: coll.to_string(), new_db });
        }
    }

    /// The retryable write in progress, if this is one.
    pub(crate) fn with_session<R>(&self, f: impl FnOnce(Option<&mut oplog::SessionWrite>) -> R) -> R {
        match self.0.as_deref().and_then(|m| m.session.as_ref()) {
            Some(s) => f(Some(&mut s.lock())),
            None => f(None),
        }
    }

    /// The statement of the entry being prepared (0 outside a retryable write, where it is
    /// not used).
    pub(crate) fn current_stmt(&self) -> i32 {
        self.with_session(|s| s.map_or(0, |s| s.stmt))
    }

    pub(crate) fn retry_image(&self) -> Option<oplog::RetryImage> {
        self.with_session(|s| s.and_then(|s| s.image))
    }

    /// `insert_many` is preparing its `i`th document: its entry belongs to that document's
    /// statement, when statements were given per document.
    pub(crate) fn select_document_statement(&self, i: usize) {
        self.with_session(|s| {
            if let Some(s) = s {
                if let Some(stmt) = s.stmt_per_document.as_ref().and_then(|ids| ids.get(i)) {
                    s.stmt = *stmt;
                }
            }
        })
    }
}

impl Store {
    /// This store, for writes that are not logged (see `WriteCtx::replicated`).
    pub fn replicated(&self) -> Store {
        Store { inner: self.inner.clone(), ctx: WriteCtx::replicated() }
    }

    /// How this handle's writes are logged.
    pub fn write_ctx(&self) -> &WriteCtx {
        &self.ctx
    }

    /// This store, noting the collections (and databases) its writes create, implicitly or
    /// not, for `take_created`.
    pub fn collecting_creations(&self) -> Store {
        let mode = Mode {
            replicated: self.ctx.is_replicated(),
            session: None,
            transaction: self.ctx.transaction().cloned(),
            read_at: self.ctx.read_view().cloned(),
            created: Some(Arc::default()),
        };
        Store { inner: self.inner.clone(), ctx: WriteCtx(Some(Arc::new(mode))) }
    }

    /// The creations noted so far (see `collecting_creations`), taken.
    pub fn take_created(&self) -> Vec<Created> {
        self.ctx.0.as_deref().and_then(|m| m.created.as_ref()).map(|c| std::mem::take(&mut *c.lock())).unwrap_or_default()
    }
}
