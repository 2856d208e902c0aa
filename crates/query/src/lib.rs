//! shoal's query language: pure functions over BSON (no I/O, no storage).
//! Comparison order, filters, projections, sorts, aggregation expressions,
//! update operators and the aggregation pipeline, all following MongoDB 7.0.

pub mod agg;
pub mod compare;
pub mod decimal;
mod datetime;
pub mod expr;
pub mod filter;
mod num;
pub mod projection;
pub mod sort;
pub mod update;
