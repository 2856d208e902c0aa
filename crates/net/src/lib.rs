//! The one way in and out of a shoal process, for mongod's role and the router's alike:
//! the connection loop both serve clients with (`service`) and its translation of the
//! legacy opcodes into commands (`legacy`), whole messages off a stream (`frame`), TLS
//! (`tls`), the certificate subjects X.509 login reads (`x509`), SCRAM on both sides
//! (`scram`), the keyFile members and routers authenticate to each other with (`key_file`),
//! connections to other members and shards (`peer`), a replica set's primary and a pool of
//! connections per host (`pool`), the faults tests put on those links (`fault`), the fail
//! points tests configure (`fail_point`), and what a process reads of its host (`process`).
//! It knows no command beyond those the legacy opcodes stand for: what a message means is
//! the caller's.

pub mod fail_point;
pub mod fault;
pub mod frame;
pub mod key_file;
pub mod legacy;
pub mod peer;
pub mod pool;
pub mod process;
pub mod scram;
pub mod service;
pub mod tls;
pub mod x509;
