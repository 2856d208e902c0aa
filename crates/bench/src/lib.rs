//! shoal-bench: YCSB-compatible and bench02-compatible load generators.
//! Same client code path for every target (MongoDB wire or PostgreSQL), so results compare.

pub mod cli;
pub mod insert;
pub mod progress;
pub mod scenario;
pub mod sys;
pub mod target;
pub mod transfer;
pub mod watch;
pub mod ycsb;
