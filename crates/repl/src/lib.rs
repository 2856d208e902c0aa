//! Replica-set protocol logic as pure functions and state, without I/O: the set's
//! configuration document and its validation (`config`), the member's view of the set
//! (`topology`), write-concern and commit-point arithmetic (`progress`), sync-source
//! choice (`sync_source`) and votes (`election`). The server drives it with the network,
//! clocks and storage; tests and simulations drive it directly.

pub mod config;
pub mod election;
pub mod progress;
pub mod sync_source;
pub mod topology;

pub use common::optime::OpTime;
pub use config::{Chaining, MemberConfig, ReplSetConfig, Settings, MEMBERS_MAX, VOTERS_MAX};
pub use topology::{election_id, MemberState};
