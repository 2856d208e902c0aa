//! Replica-set protocol logic as pure functions and state, without I/O: the set's
//! configuration document and its validation (`config`), and the member's view of the set
//! (`topology`). The server drives it with the network, clocks and storage; tests and
//! simulations drive it directly.

pub mod config;
pub mod topology;

pub use config::{MemberConfig, ReplSetConfig, Settings, MEMBERS_MAX, VOTERS_MAX};
pub use topology::{election_id, MemberState};
