//! The shard side's fail points (`configureFailPoint`, with `enableTestCommands`); a
//! member's are `replication::fail_points`', the faults on links to other members
//! `net::fault`'s.

use net::fail_point::FailPoint;
use net::fault::Hang;

/// `migrateHangInFinalTransfer`: a recipient holds a chunk migration's last transfer (the
/// one that asks for w:majority, inside the donor's critical section), so a test can crash
/// the donor there.
pub static FINAL_TRANSFER_HANG: Hang = Hang::new();

/// `onPrimaryTransactionalWrite`: a retryable write on a primary drops its connection
/// after it is written (`closeConnection`, default true), or fails before it is written with
/// `failBeforeCommitExceptionCode`, so a test sees each outcome a driver's retry must handle.
pub static ON_PRIMARY_TRANSACTIONAL_WRITE: FailPoint = FailPoint::new("onPrimaryTransactionalWrite");
