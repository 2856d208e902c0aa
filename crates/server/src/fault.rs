//! The shard side's fail points (`configureFailPoint`, with `enableTestCommands`); a
//! member's are `replication::fail_points`', the faults on links to other members
//! `net::fault`'s.

use net::fault::Hang;

/// `migrateHangInFinalTransfer`: a recipient holds a chunk migration's last transfer (the
/// one that asks for w:majority, inside the donor's critical section), so a test can crash
/// the donor there.
pub static FINAL_TRANSFER_HANG: Hang = Hang::new();
