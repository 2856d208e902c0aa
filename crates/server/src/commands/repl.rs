//! Replica-set commands: replSetInitiate, replSetGetConfig, replSetGetStatus. They need
//! `--replSet` (NoReplicationEnabled otherwise) and the admin database, as with mongod.

use super::Ctx;
use bson::{Bson, Document};
use common::{Code, Error, Result};
use replication::ReplCoord;

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

/// replSetReconfig: {replSetReconfig: <config>, force}.
pub fn repl_set_reconfig(ctx: &mut Ctx) -> Result<Document> {
    let coord = coord(ctx, "not running with --replSet")?;
    common::value::check_fields("replSetReconfig", ctx.cmd, &["replSetReconfig", "force"])?;
    let Some(Bson::Document(arg)) = ctx.cmd.get("replSetReconfig") else {
        return Err(Error::type_mismatch("BSON field 'replSetReconfig' is the wrong type, expected type 'object'"));
    };
    let force = ctx.bool_arg("force")?.unwrap_or(false);
    coord.reconfig(&ctx.shared.store, arg, force)
}

pub fn repl_set_get_config(ctx: &mut Ctx) -> Result<Document> {
    coord(ctx, "not running with --replSet")?.get_config()
}

pub fn repl_set_get_status(ctx: &mut Ctx) -> Result<Document> {
    let uptime = ctx.shared.started.elapsed().as_secs() as i64;
    let initial_sync = ctx.bool_arg("initialSync")?.unwrap_or(false);
    coord(ctx, "not running with --replSet")?.status(&ctx.shared.store, uptime, initial_sync)
}

/// applyOps: apply oplog entries in order, idempotently (`apply::apply_entry`). Not atomic:
/// on a failure the entries before it stay applied, and the error says how many were.
pub fn apply_ops(ctx: &mut Ctx) -> Result<Document> {
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "applyOps may only be run against the admin database."));
    }
    common::value::check_fields("applyOps", ctx.cmd, &["applyOps", "bypassDocumentValidation", "alwaysUpsert", "oplogApplicationMode", "preCondition"])?;
    if ctx.cmd.contains_key("preCondition") {
        return Err(Error::new(Code::CommandNotSupported, "applyOps preCondition is not supported by shoal"));
    }
    let Some(Bson::Array(ops)) = ctx.cmd.get("applyOps") else {
        return Err(Error::type_mismatch("BSON field 'applyOps.applyOps' is the wrong type, expected type 'array'"));
    };
    let mut applied = 0i32;
    for op in ops {
        let Bson::Document(entry) = op else {
            return Err(Error::type_mismatch("applyOps entries must be objects"));
        };
        ctx.op.check()?;
        if let Err(e) = replication::apply::apply_entry(ctx.store(), entry) {
            ctx.commit_write()?;
            let mut results: Vec<Bson> = (0..applied).map(|_| Bson::Boolean(true)).collect();
            results.push(Bson::Boolean(false));
            return Err(e.with_extra(bson::doc! {"applied": applied + 1, "results": results}));
        }
        applied += 1;
    }
    ctx.commit_write()?;
    Ok(bson::doc! {"applied": applied, "results": (0..applied).map(|_| Bson::Boolean(true)).collect::<Vec<_>>()})
}

fn member_cmd<'a>(ctx: &'a Ctx) -> Result<&'a ReplCoord> {
    coord(ctx, "not running with --replSet")
}

/// replSetHeartbeat (member to member).
pub fn repl_set_heartbeat(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    replication::member_commands::heartbeat(ctx.shared, ctx.cmd)
}

/// replSetRequestVotes (a candidate to the voters).
pub fn repl_set_request_votes(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    replication::member_commands::request_votes(ctx.shared, ctx.cmd)
}

/// appendOplogNote: log a no-op entry whose `o` is `data`. With `maxClusterTime`, only when
/// the oplog has no entry at or after that time, and then after it: a secondary asks this
/// of its primary for a read after a cluster time the set has not logged yet
/// (`replication::reach`).
pub fn append_oplog_note(ctx: &mut Ctx) -> Result<Document> {
    let coord = coord(ctx, "Must have replication set up to run \"appendOplogNote\"")?;
    common::value::check_fields("appendOplogNote", ctx.cmd, &["appendOplogNote", "data", "maxClusterTime"])?;
    let data = match ctx.cmd.get("data") {
        Some(Bson::Document(d)) => d,
        None => return Err(Error::new(Code::NoSuchKey, "Missing expected field \"data\"")),
        Some(v) => return Err(Error::type_mismatch(format!("\"data\" had the wrong type. Expected object, found {}", common::value::type_name(v)))),
    };
    if let Some(t) = ctx.cmd.get("maxClusterTime") {
        let Bson::Timestamp(t) = t else {
            return Err(Error::type_mismatch(format!("\"maxClusterTime\" had the wrong type. Expected timestamp, found {}", common::value::type_name(t))));
        };
        // A time more than the allowed drift ahead is refused, as a gossiped one is.
        let t = common::optime::within_drift(*t)?;
        let ts = common::optime::ts_value(t);
        if ctx.shared.store.oplog_last().unwrap_or_default().ts >= ts {
            return Ok(Document::new());
        }
        coord.gossip_cluster_time(&ctx.shared.store, t);
    }
    ctx.shared.store.log_note(data)?;
    ctx.commit_write()?;
    Ok(Document::new())
}

/// replSetGetAcknowledged (shoal's, member to member): where the primary's acknowledged
/// writes reach, for a secondary's strict-consistency reads (`repl::strict`).
pub fn repl_set_get_acknowledged(ctx: &mut Ctx) -> Result<Document> {
    let coord = member_cmd(ctx)?;
    let mut reply = bson::doc! {"isWritablePrimary": coord.is_writable_primary(), "acknowledgedOpTime": coord.acknowledged(&ctx.shared.store).to_doc()};
    if let Some(page) = &coord.position_page {
        // A member on this host reads the same from shared memory from now on.
        reply.insert("positionPage", bson::doc! {"path": page.path().map(|p| p.display().to_string()).unwrap_or_default(), "nonce": page.nonce() as i64});
    }
    Ok(reply)
}

/// replSetGetRBID (member to member): this member's rollback id, which an initial sync
/// compares before and after it copies.
pub fn repl_set_get_rbid(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    Ok(bson::doc! {"rbid": replication::ReplCoord::rollback_id(&ctx.shared.store)?})
}

/// replSetUpdatePosition (a member to its sync source).
pub fn repl_set_update_position(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    replication::member_commands::update_position(ctx.shared, ctx.cmd)
}

fn secs_arg(ctx: &Ctx, field: &str, default: i64) -> Result<i64> {
    match ctx.cmd.get(field) {
        None | Some(Bson::Null) => Ok(default),
        Some(v) => common::value::as_i64(v).filter(|n| *n >= 0).ok_or_else(|| Error::bad_value(format!("{field} must be a non-negative number"))),
    }
}

/// replSetStepDown: {replSetStepDown: secs (60), secondaryCatchUpPeriodSecs (10), force}.
pub fn repl_set_step_down(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    common::value::check_fields("replSetStepDown", ctx.cmd, &["replSetStepDown", "secondaryCatchUpPeriodSecs", "force"])?;
    let step_down = secs_arg(ctx, "replSetStepDown", 60)?;
    let catch_up = secs_arg(ctx, "secondaryCatchUpPeriodSecs", 10)?;
    let force = ctx.bool_arg("force")?.unwrap_or(false);
    if catch_up > step_down {
        return Err(Error::bad_value("stepdown period must be longer than secondaryCatchUpPeriodSecs"));
    }
    let handle = tokio::runtime::Handle::current();
    handle.block_on(replication::member_commands::step_down_command(ctx.shared, step_down as u64, catch_up as u64, force))?;
    Ok(Document::new())
}

/// replSetFreeze: {replSetFreeze: secs}.
pub fn repl_set_freeze(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    let secs = secs_arg(ctx, "replSetFreeze", 0)?;
    replication::member_commands::freeze(ctx.shared, secs as u64)
}

/// configureFailPoint, for shoal's fail points: `replLink`, faults on this member's
/// links to other members (crate::fault). `{configureFailPoint: "replLink", mode: "alwaysOn"
/// | "off", data: {host: "h:p" | "*", delayMs, lossPercent, partition}}`; and
/// `journalFlushDelay` (`data: {delayMs}`), a wait before each sync of the journal
/// flusher; `migrateHangInFinalTransfer`, a recipient holding a migration's last transfer,
/// `initialSyncHangAfterDataCloning`, an initial sync holding after its clone, and
/// `rsSyncApplyStop`, a secondary applying nothing it fetches (crate::fault; the reply's
/// `count`: operations held so far). Only with
/// `--setParameter enableTestCommands=1`; otherwise the command does not exist, as in mongod.
pub fn configure_fail_point(ctx: &mut Ctx) -> Result<Document> {
    if !ctx.shared.config.enable_test_commands {
        return Err(Error::new(Code::CommandNotFound, "no such command: 'configureFailPoint'"));
    }
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "configureFailPoint may only be run against the admin database."));
    }
    common::value::check_fields("configureFailPoint", ctx.cmd, &["configureFailPoint", "mode", "data"])?;
    let name = ctx.cmd.get_str("configureFailPoint").map_err(|_| Error::type_mismatch("configureFailPoint must name a fail point"))?;
    if let Some(answer) = net::fail_point::configure_command(name, ctx.cmd) {
        return answer;
    }
    if name == crate::fault::ON_PRIMARY_TRANSACTIONAL_WRITE.name {
        let mode = net::fail_point::Mode::parse(ctx.cmd.get("mode"))?;
        let data = ctx.cmd.get_document("data").cloned().unwrap_or_default();
        return Ok(bson::doc! {"count": crate::fault::ON_PRIMARY_TRANSACTIONAL_WRITE.configure(mode, data) as i64});
    }
    if !matches!(name, "replLink" | "journalFlushDelay" | "migrateHangInFinalTransfer" | "initialSyncHangAfterDataCloning" | "rsSyncApplyStop") {
        return Err(Error::bad_value(format!("Cannot find failpoint: {name}")));
    }
    let on = match ctx.cmd.get("mode") {
        Some(Bson::String(m)) if m == "alwaysOn" => true,
        Some(Bson::String(m)) if m == "off" => false,
        _ => return Err(Error::bad_value(format!("{name} supports mode \"alwaysOn\" or \"off\""))),
    };
    let data = ctx.cmd.get_document("data").cloned().unwrap_or_default();
    let hang = match name {
        "migrateHangInFinalTransfer" => Some(&crate::fault::FINAL_TRANSFER_HANG),
        "initialSyncHangAfterDataCloning" => Some(&replication::fail_points::INITIAL_SYNC_CLONED_HANG),
        "rsSyncApplyStop" => Some(&replication::fail_points::APPLY_STOP),
        _ => None,
    };
    if let Some(hang) = hang {
        return Ok(bson::doc! {"count": hang.set(on) as i64});
    }
    if name == "journalFlushDelay" {
        // {data: {delayMs}}: the journal flusher waits this long before each sync.
        let ms = data.get("delayMs").and_then(common::value::as_i64).unwrap_or(0).max(0) as u64;
        replication::fail_points::set_journal_flush_delay(if on { ms } else { 0 });
        return Ok(bson::doc! {"count": 0});
    }
    let host = data.get_str("host").unwrap_or("*").to_string();
    let num = |k: &str| data.get(k).and_then(common::value::as_i64).unwrap_or(0).max(0) as u64;
    let fault = net::fault::LinkFault {
        delay_ms: num("delayMs"),
        loss_percent: num("lossPercent").min(100) as u32,
        partitioned: data.get_bool("partition").unwrap_or(false),
    };
    net::fault::set(&host, on.then_some(fault));
    Ok(bson::doc! {"count": 0})
}

/// waitForFailPoint: {waitForFailPoint: name, timesEntered, maxTimeMS}, with
/// `enableTestCommands` only.
pub fn wait_for_fail_point(ctx: &mut Ctx) -> Result<Document> {
    if !ctx.shared.config.enable_test_commands {
        return Err(Error::new(Code::CommandNotFound, "no such command: 'waitForFailPoint'"));
    }
    if ctx.db != "admin" {
        return Err(Error::new(Code::Unauthorized, "waitForFailPoint may only be run against the admin database."));
    }
    let hang_count = |name: &str| match name {
        "migrateHangInFinalTransfer" => Some(crate::fault::FINAL_TRANSFER_HANG.set_count()),
        "initialSyncHangAfterDataCloning" => Some(replication::fail_points::INITIAL_SYNC_CLONED_HANG.set_count()),
        "rsSyncApplyStop" => Some(replication::fail_points::APPLY_STOP.set_count()),
        "onPrimaryTransactionalWrite" => Some(crate::fault::ON_PRIMARY_TRANSACTIONAL_WRITE.times_entered()),
        _ => None,
    };
    tokio::runtime::Handle::current().block_on(net::fail_point::wait_command(ctx.cmd, hang_count))
}

/// testVersion2 and testVersion1AndVersion2, with `enableTestCommands`: commands that exist
/// to exercise the stable API's checks (`common::api`), as mongod's do; they do nothing else.
pub fn test_api_command(ctx: &mut Ctx) -> Result<Document> {
    if !ctx.shared.config.enable_test_commands {
        return Err(Error::new(Code::CommandNotFound, format!("no such command: '{}'", ctx.name)));
    }
    Ok(Document::new())
}

/// replSetSyncFrom: {replSetSyncFrom: "host:port"}.
pub fn repl_set_sync_from(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    let host =
        ctx.cmd.get_str("replSetSyncFrom").map_err(|_| Error::type_mismatch("BSON field 'replSetSyncFrom' is the wrong type, expected type 'string'"))?;
    replication::member_commands::sync_from(ctx.shared, host)
}

/// replSetStepUp: {replSetStepUp: 1}.
pub fn repl_set_step_up(ctx: &mut Ctx) -> Result<Document> {
    member_cmd(ctx)?;
    let handle = tokio::runtime::Handle::current();
    handle.block_on(replication::member_commands::step_up(ctx.shared))?;
    Ok(Document::new())
}
