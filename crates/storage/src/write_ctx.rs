//! How a handle's writes are logged. A `Store` or `Collection` handle carries a `WriteCtx`
//! and every write through it follows it: an ordinary one is logged when the store keeps an
//! oplog; a replicated one (a secondary applying its source's entries, initial sync's copy,
//! rollback) is not, as those entries are written as they came; a retryable write's entries
//! carry its session's fields and its batches write the session's record. The context is a
//! value the caller holds, never state of the thread that happens to run the write.

use super::*;

#[derive(Clone, Default)]
pub struct WriteCtx(Option<Arc<Mode>>);

pub(crate) enum Mode {
    Replicated,
    Session(Mutex<oplog::SessionWrite>),
}

impl WriteCtx {
    /// Writes that are not logged: they apply entries logged elsewhere.
    pub fn replicated() -> WriteCtx {
        WriteCtx(Some(Arc::new(Mode::Replicated)))
    }

    pub(crate) fn session(s: oplog::SessionWrite) -> WriteCtx {
        WriteCtx(Some(Arc::new(Mode::Session(Mutex::new(s)))))
    }

    pub fn is_replicated(&self) -> bool {
        matches!(self.0.as_deref(), Some(Mode::Replicated))
    }

    /// The retryable write in progress, if this is one.
    pub(crate) fn with_session<R>(&self, f: impl FnOnce(Option<&mut oplog::SessionWrite>) -> R) -> R {
        match self.0.as_deref() {
            Some(Mode::Session(s)) => f(Some(&mut s.lock())),
            _ => f(None),
        }
    }

    /// The statement of the entry being prepared (0 outside a retryable write, where it is
    /// not used).
    pub(crate) fn current_stmt(&self) -> i32 {
        self.with_session(|s| s.map_or(0, |s| s.stmt))
    }

    pub(crate) fn wants_pre_image(&self) -> bool {
        self.with_session(|s| s.is_some_and(|s| s.pre_image))
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
}
