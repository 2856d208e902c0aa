//! A member's state in the set, as replSetGetStatus and hello report it.

use bson::oid::ObjectId;

/// mongod's MemberState numbers and names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Startup,
    Primary,
    Secondary,
    Recovering,
    Startup2,
    Unknown,
    Arbiter,
    Down,
    Rollback,
    Removed,
}

impl MemberState {
    pub fn code(self) -> i32 {
        match self {
            MemberState::Startup => 0,
            MemberState::Primary => 1,
            MemberState::Secondary => 2,
            MemberState::Recovering => 3,
            MemberState::Startup2 => 5,
            MemberState::Unknown => 6,
            MemberState::Arbiter => 7,
            MemberState::Down => 8,
            MemberState::Rollback => 9,
            MemberState::Removed => 10,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemberState::Startup => "STARTUP",
            MemberState::Primary => "PRIMARY",
            MemberState::Secondary => "SECONDARY",
            MemberState::Recovering => "RECOVERING",
            MemberState::Startup2 => "STARTUP2",
            MemberState::Unknown => "UNKNOWN",
            MemberState::Arbiter => "ARBITER",
            // mongod's name for a member that does not answer heartbeats.
            MemberState::Down => "(not reachable/healthy)",
            MemberState::Rollback => "ROLLBACK",
            MemberState::Removed => "REMOVED",
        }
    }
}

/// The electionId of a primary elected in `term` under protocol version 1 (mongod's
/// `OID::fromTerm`): 0x7fffffff, then the term as 8 big-endian bytes, so ids order by term.
pub fn election_id(term: i64) -> ObjectId {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    b[4..].copy_from_slice(&term.to_be_bytes());
    ObjectId::from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn election_ids_encode_the_term_as_mongod_does() {
        assert_eq!(election_id(1).to_hex(), "7fffffff0000000000000001");
        assert!(election_id(2) > election_id(1));
        assert_eq!((MemberState::Primary.code(), MemberState::Primary.name()), (1, "PRIMARY"));
    }
}
