//! Replica-set commands: replSetInitiate, replSetGetConfig, replSetGetStatus. They need
//! `--replSet` (NoReplicationEnabled otherwise) and the admin database, as with mongod.

use super::Ctx;
use crate::repl::ReplCoord;
use bson::{Bson, Document};
use common::{Code, Error, Result};

fn coord<'a>(ctx: &'a Ctx, not_enabled: &str) -> Result<&'a ReplCoord> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, format!("{} may only be run against the admin database.", ctx.name)));
    }
    ctx.shared.repl.as_ref().ok_or_else(|| Error::new(Code::NoReplicationEnabled, not_enabled))
}

pub fn repl_set_initiate(ctx: &mut Ctx) -> Result<Document> {
    let coord = coord(ctx, "This node was not started with replication enabled.")?;
    let arg = match ctx.cmd.get("replSetInitiate") {
        Some(Bson::Document(d)) => Some(d),
        // `rs.initiate()` sends an empty object; a null or a number asks for the default too.
        None | Some(Bson::Null) | Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)) => None,
        Some(_) => return Err(Error::type_mismatch("no configuration specified")),
    };
    let arg = arg.filter(|d| !d.is_empty());
    coord.initiate(&ctx.shared.store, arg)
}

pub fn repl_set_get_config(ctx: &mut Ctx) -> Result<Document> {
    coord(ctx, "not running with --replSet")?.get_config()
}

pub fn repl_set_get_status(ctx: &mut Ctx) -> Result<Document> {
    let uptime = ctx.shared.started.elapsed().as_secs() as i64;
    coord(ctx, "not running with --replSet")?.status(&ctx.shared.store, uptime)
}
