//! The router's administration commands, in mongos's shapes: its parameters and command
//! line, the operations running on the shards (currentOp, killOp with "<shard>:<opid>"),
//! validate on every shard that holds the collection, renameCollection of an unsharded
//! collection, and its routing caches (flushRouterConfig, getShardMap).

use crate::catalog::CONFIG_SHARD;
use crate::commands::{collection_of, forwarded, timeout_of};
use crate::Router;
use bson::{doc, Bson, Document};
use common::server::LOGICAL_SESSION_TIMEOUT_MINUTES;
use common::{Code, Error, Result};
use net::pool::reply_result;
use wire::Request;

/// The router's parameters, each with the value it runs with.
fn parameters(router: &Router) -> Document {
    let compressors: Vec<&str> = router.config.compressors.iter().map(|c| c.name()).collect();
    doc! {
        "featureCompatibilityVersion": { "version": "7.0" },
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256", "MONGODB-X509"],
        "enableTestCommands": router.config.enable_test_commands,
        "auditAuthorizationSuccess": router.config.audit_authorization_success,
        "logicalSessionTimeoutMinutes": LOGICAL_SESSION_TIMEOUT_MINUTES,
        "maxIncomingConnections": router.config.connections_max as i64,
        "networkMessageCompressors": compressors.join(","),
        "userCacheInvalidationIntervalSecs": crate::users::USER_CACHE_SECONDS as i64,
        "quiet": false,
    }
}

pub fn get_parameter(router: &Router, req: &Request) -> Result<Document> {
    common::server::select_parameters(parameters(router), &req.body)
}

/// Test commands exist only with `enableTestCommands`, as on mongos.
fn test_command(router: &Router, name: &str) -> Result<()> {
    if router.config.enable_test_commands {
        return Ok(());
    }
    Err(Error::new(Code::CommandNotFound, format!("no such command: '{name}'")))
}

/// configureFailPoint: the fail points every role has (`net::fail_point`).
pub fn configure_fail_point(router: &Router, req: &Request) -> Result<Document> {
    test_command(router, "configureFailPoint")?;
    common::value::check_fields("configureFailPoint", &req.body, &["configureFailPoint", "mode", "data"])?;
    let name = req.body.get_str("configureFailPoint").map_err(|_| Error::type_mismatch("configureFailPoint must name a fail point"))?;
    net::fail_point::configure_command(name, &req.body).unwrap_or_else(|| Err(Error::bad_value(format!("Cannot find failpoint: {name}"))))
}

/// testVersion2 and testVersion1AndVersion2: commands that exist to exercise the stable API's
/// checks (`common::api`), as mongos's do; they do nothing else.
pub fn test_api_command(router: &Router, req: &Request) -> Result<Document> {
    test_command(router, &req.name)?;
    Ok(Document::new())
}

pub async fn wait_for_fail_point(router: &Router, req: &Request) -> Result<Document> {
    test_command(router, "waitForFailPoint")?;
    net::fail_point::wait_command(&req.body, |_| None).await
}

/// getCmdLineOpts: the arguments the router was started with, and what they set.
pub fn get_cmd_line_opts(router: &Router) -> Document {
    let c = &router.config;
    let mut net = doc! {"port": c.port as i32, "bindIp": c.bind_ip.join(","), "maxIncomingConnections": c.connections_max as i64};
    let mut tls = doc! {"mode": c.tls.mode.name()};
    if let Some(f) = &c.tls.certificate_key_file {
        tls.insert("certificateKeyFile", f.display().to_string());
    }
    if let Some(f) = &c.tls.ca_file {
        tls.insert("CAFile", f.display().to_string());
    }
    net.insert("tls", tls);
    let compressors: Vec<&str> = c.compressors.iter().map(|x| x.name()).collect();
    net.insert("compression", doc! {"compressors": if compressors.is_empty() { "disabled".to_string() } else { compressors.join(",") }});
    let mut parsed = doc! {"net": net, "sharding": {"configDB": &c.config_db}};
    if !c.set_parameters.is_empty() {
        parsed.insert("setParameter", c.set_parameters.clone());
    }
    if c.auth {
        let mut security = doc! {"authorization": "enabled"};
        if let Some(k) = &c.key_file {
            security.insert("keyFile", k.display().to_string());
        }
        parsed.insert("security", security);
    }
    doc! {"argv": c.argv.clone(), "parsed": parsed}
}

/// currentOp: every shard's operations, each with its `shard` and an opid
/// "<shard>:<opid>" that killOp takes.
pub async fn current_op(router: &Router, req: &Request) -> Result<Document> {
    let body = forwarded(req);
    let mut inprog = Vec::new();
    for id in router.shard_ids().await? {
        let set = router.shard(&id).await?;
        let reply = reply_result(router.pool.run(&set, "admin", body.clone(), None, timeout_of(req)).await?.1)?;
        for op in reply.get_array("inprog").map(|a| a.to_vec()).unwrap_or_default() {
            let Bson::Document(mut op) = op else { continue };
            if let Some(opid) = op.get("opid").and_then(common::value::as_i64) {
                op.insert("opid", format!("{id}:{opid}"));
            }
            op.insert("shard", id.as_str());
            inprog.push(Bson::Document(op));
        }
    }
    Ok(doc! {"inprog": inprog})
}

/// killOp with op "<shard>:<opid>": sent to that shard.
pub async fn kill_op(router: &Router, req: &Request) -> Result<Document> {
    let op = match req.body.get("op") {
        Some(Bson::String(s)) => s.clone(),
        Some(_) => return Err(Error::type_mismatch("killOp through a router takes op as \"<shard>:<opid>\"")),
        None => return Err(Error::location(40414, "BSON field 'killOp.op' is missing but a required field")),
    };
    let Some((shard, opid)) = op.rsplit_once(':') else {
        return Err(Error::new(Code::FailedToParse, format!("killOp through a router takes op as \"<shard>:<opid>\", not '{op}'")));
    };
    let opid: i64 = opid.parse().map_err(|_| Error::new(Code::FailedToParse, format!("the opid in '{op}' is not a number")))?;
    let set = router.shard(shard).await?;
    reply_result(router.pool.run(&set, "admin", doc! {"killOp": 1, "op": opid}, None, timeout_of(req)).await?.1)?;
    Ok(doc! {"shard": shard, "shardid": opid})
}

/// validate: on every shard that holds the collection; valid when every one is, each
/// shard's reply under `raw`.
pub async fn validate(router: &Router, req: &Request) -> Result<Document> {
    let coll = collection_of(req)?;
    let ns = format!("{}.{coll}", req.db);
    let mut holders = std::collections::BTreeSet::new();
    match router.db_primary(&req.db, false).await? {
        Some(p) => {
            holders.insert(p);
        }
        None => return Err(Error::new(Code::NamespaceNotFound, format!("Collection '{ns}' does not exist to validate."))),
    }
    if let Some(sc) = router.sharded(&ns).await? {
        holders.extend(sc.table.shards());
    }
    let mut raw = Document::new();
    let (mut valid, mut errors, mut warnings) = (true, Vec::<Bson>::new(), Vec::<Bson>::new());
    for id in holders {
        let set = router.shard(&id).await?;
        let reply = reply_result(router.pool.run(&set, &req.db, forwarded(req), None, timeout_of(req)).await?.1)?;
        valid &= reply.get_bool("valid").unwrap_or(false);
        errors.extend(reply.get_array("errors").map(|a| a.to_vec()).unwrap_or_default());
        warnings.extend(reply.get_array("warnings").map(|a| a.to_vec()).unwrap_or_default());
        raw.insert(set.conn_string.clone(), reply);
    }
    Ok(doc! {"ns": ns, "valid": valid, "errors": errors, "warnings": warnings, "raw": raw})
}

/// renameCollection of an unsharded collection within its database: run by the
/// database's primary shard. Renaming a sharded collection, or across databases, is
/// refused.
pub async fn rename_collection(router: &Router, req: &Request) -> Result<Document> {
    let split = |k: &str| -> Result<(String, String)> {
        let v = req.body.get_str(k).map_err(|_| Error::type_mismatch(format!("'{k}' must be of type String")))?;
        v.split_once('.')
            .map(|(d, c)| (d.to_string(), c.to_string()))
            .ok_or_else(|| Error::new(Code::InvalidNamespace, format!("Invalid namespace specified '{v}'")))
    };
    let ((from_db, from_coll), (to_db, _)) = (split("renameCollection")?, split("to")?);
    if from_db != to_db {
        return Err(Error::new(Code::CommandNotSupported, "renameCollection across databases is not supported through shoal's router"));
    }
    let from = format!("{from_db}.{from_coll}");
    if router.sharded(&from).await?.is_some() {
        return Err(Error::new(Code::IllegalOperation, format!("cannot rename sharded collection '{from}' through shoal's router")));
    }
    let Some(primary) = router.db_primary(&from_db, false).await? else {
        return Err(Error::new(Code::NamespaceNotFound, format!("Source collection {from} does not exist")));
    };
    let set = router.shard(&primary).await?;
    let reply = reply_result(router.pool.run(&set, "admin", forwarded(req), None, timeout_of(req)).await?.1)?;
    router.forget_database(&from_db);
    Ok(reply)
}

/// flushRouterConfig: forget the cached routing of one namespace, one database, or all.
pub async fn flush_router_config(router: &Router, req: &Request) -> Result<Document> {
    match req.body.get(&req.name) {
        Some(Bson::String(ns)) if ns.contains('.') => router.forget_collection(ns),
        Some(Bson::String(db)) => router.forget_database(db),
        _ => router.forget_all(),
    }
    router.reload_shards().await?;
    Ok(doc! {"flushed": true})
}

/// getShardMap: each shard's (and the config servers') connection string.
pub async fn get_shard_map(router: &Router) -> Result<Document> {
    let mut map = Document::new();
    for id in router.shard_ids().await? {
        map.insert(id.clone(), router.shard(&id).await?.conn_string.clone());
    }
    map.insert(CONFIG_SHARD, router.catalog.config.conn_string.clone());
    Ok(doc! {"map": map})
}
