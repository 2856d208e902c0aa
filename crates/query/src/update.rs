//! Update operators and replacement/pipeline updates.
use crate::filter::MatchDetails;
use bson::{Bson, Document};

#[derive(Clone, Debug)]
pub struct Update {}

impl Update {
    pub fn parse(_u: &Bson, _array_filters: Option<&[Document]>) -> common::Result<Update> {
        Err(common::Error::new(common::Code::NotImplemented, "update not implemented yet"))
    }
    pub fn is_replacement(&self) -> bool {
        false
    }
    pub fn apply(&self, doc: &Document, _details: &MatchDetails, _is_insert: bool) -> common::Result<Document> {
        Ok(doc.clone())
    }
}

pub fn upsert_seed(_filter: &Document) -> common::Result<Document> {
    Ok(Document::new())
}
