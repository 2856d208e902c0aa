//! Sharding logic without I/O, as pure functions and types the router (the `router` crate)
//! drives: shard key patterns and the keys documents have under them (`key`), a sharded
//! collection's chunks and routing table, and the chunks it starts with (`chunks`), and
//! which shards a query filter targets (`target`). Never touches the network, a clock or
//! storage (it uses `storage`'s hash function only, so hashed keys equal mongod's).

pub mod chunks;
pub mod key;
pub mod target;

pub use chunks::{Chunk, ChunkVersion, RoutingTable};
pub use key::{Key, ShardKeyPattern};
pub use target::{exact_key, shards_for_filter};
