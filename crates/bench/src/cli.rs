//! `shoal bench ...` command line: `ycsb load|run` (YCSB's own flag syntax), `insert`
//! (bench02's options) and `scenario NAME`.

use crate::insert::{self, InsertOptions};
use crate::scenario;
use crate::ycsb::{self, props::Properties, Phase, YcsbOptions};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// YCSB CoreWorkload: `load` inserts the records, `run` runs the operation mix.
    ///
    /// Takes YCSB's flags: -P <workload file or bundled name workloada..f>, -p key=value,
    /// -threads N, -target OPS, -s; plus --url URL (mongodb://... or postgresql://...),
    /// --json FILE (YCSB JSON array export) and --drop (drop the table before load).
    Ycsb(YcsbArgs),
    /// bench02 insert benchmark: batches of order documents with 0-3 secondary indexes.
    Insert(InsertArgs),
    /// Scripted benchmark scenarios that start their own servers and write a report.
    Scenario(ScenarioArgs),
    /// Transactions that move money between accounts (two documents each), against shoal,
    /// MongoDB or PostgreSQL.
    Transfer(TransferArgs),
    /// YCSB workload A on a replica set's primary with change streams open on its collection:
    /// event latency from a write's acknowledgement, and what the streams cost.
    Watch(WatchArgs),
}

#[derive(Args, Debug, Clone)]
pub struct YcsbArgs {
    /// load or run.
    pub phase: String,
    /// YCSB options: -P FILE, -p KEY=VALUE, -threads N, -target N, -s, --url URL, --json FILE, --drop.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct InsertArgs {
    /// mongodb://... (shoal or MongoDB) or postgresql://...
    #[arg(long, default_value = "mongodb://localhost:27017/")]
    pub url: String,
    #[arg(long, default_value = "bench02")]
    pub database: String,
    #[arg(long, default_value = "orders")]
    pub collection: String,
    /// Concurrent inserters (bench02's processes).
    #[arg(long, alias = "processes", default_value_t = 4)]
    pub workers: usize,
    /// Documents per insert batch (one insertMany, or one multi-row INSERT).
    #[arg(long, default_value_t = 100)]
    pub batch_size: usize,
    /// Run time in seconds [default: 60, or no limit when --num-operations is given].
    #[arg(long)]
    pub run_seconds: Option<u64>,
    /// Documents to insert in total (0: until --run-seconds).
    #[arg(long, default_value_t = 0)]
    pub num_operations: u64,
    /// Secondary indexes: 1 {customerId,orderDate}, 2 +{customerId,productId}, 3 +{productId,orderDate}.
    #[arg(long, default_value_t = 3)]
    pub indexes: usize,
    /// textField size in bytes.
    #[arg(long, default_value_t = 1000)]
    pub text_size: usize,
    /// Fraction of textField that is a repeated character (0 random .. 1 constant).
    #[arg(long, default_value_t = 0.25)]
    pub compressibility: f64,
    /// Keep the existing collection instead of dropping it first.
    #[arg(long)]
    pub no_drop: bool,
    /// Ordered batches (stop at the first error); default unordered.
    #[arg(long)]
    pub ordered: bool,
    /// Shard the collection on {customerId: "hashed"} first (sharded MongoDB clusters).
    #[arg(long)]
    pub shard: bool,
    #[arg(long, default_value_t = 100_000)]
    pub customers: i32,
    #[arg(long, default_value_t = 10_000)]
    pub products: i32,
    /// Also write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct TransferArgs {
    /// mongodb://... (a replica set: transactions need one) or postgresql://...
    #[arg(long, default_value = "mongodb://localhost:27017/?replicaSet=rs0")]
    pub url: String,
    #[arg(long, default_value = "bank")]
    pub database: String,
    #[arg(long, default_value = "accounts")]
    pub table: String,
    #[arg(long, default_value_t = 100_000)]
    pub accounts: u32,
    /// Concurrent clients, each running one transaction at a time.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    #[arg(long, default_value_t = 30)]
    pub run_seconds: u64,
    /// Use the accounts already loaded instead of reloading them.
    #[arg(long)]
    pub no_load: bool,
    /// A server process (name=pid) whose CPU per transaction to report; repeatable.
    #[arg(long = "watch-pid")]
    pub watch_pids: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct WatchArgs {
    /// The primary of a replica set, one host: mongodb://HOST:PORT/?directConnection=true&w=majority
    #[arg(long, default_value = "mongodb://127.0.0.1:27017/?directConnection=true")]
    pub url: String,
    #[arg(long, default_value = "ycsb")]
    pub database: String,
    #[arg(long, default_value = "usertable")]
    pub collection: String,
    /// The streams open in each phase, phases in this order.
    #[arg(long, value_delimiter = ',', default_value = "0,1,10,100")]
    pub streams: Vec<usize>,
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// YCSB client threads.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    #[arg(long, default_value_t = 20)]
    pub seconds_per_phase: u64,
    /// Probe updates per second, whose events are timed.
    #[arg(long, default_value_t = 50)]
    pub probes_per_second: u32,
    /// Use the records already loaded instead of loading them.
    #[arg(long)]
    pub no_load: bool,
    /// A server process (name=pid) whose CPU per update to report; repeatable.
    #[arg(long = "watch-pid")]
    pub watch_pids: Vec<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Scenario name (see `--list`): instance.
    pub name: Option<String>,
    /// Small sizes that finish in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Output directory for report.md, chart and raw results.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// List the scenarios.
    #[arg(long)]
    pub list: bool,
    /// Override the scenario's record count.
    #[arg(long)]
    pub records: Option<u64>,
    /// Override the seconds each measured phase runs.
    #[arg(long)]
    pub seconds_per_phase: Option<u64>,
    /// Override the sizes a scenario runs (chaining: members per set, 3,7,15; elastic: shards
    /// per run, 1,2,4,8,16).
    #[arg(long, value_delimiter = ',')]
    pub members: Option<Vec<usize>>,
    /// Override the chaining modes a scenario runs (chaining: on,off,auto).
    #[arg(long, value_delimiter = ',')]
    pub chaining: Option<Vec<String>>,
    /// The shoal binary whose servers the scenario starts (default: this one), to compare
    /// two builds under the same client.
    #[arg(long)]
    pub server: Option<PathBuf>,
}

/// Runs a bench subcommand; returns the process exit code.
pub fn run(args: BenchArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(crate::sys::cpu_count().clamp(1, 8)).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal bench: cannot start runtime: {e}");
            return 1;
        }
    };
    let result = rt.block_on(async move {
        match args.command {
            BenchCommand::Ycsb(a) => run_ycsb(a).await,
            BenchCommand::Insert(a) => run_insert(a).await,
            BenchCommand::Scenario(a) => run_scenario(a).await,
            BenchCommand::Transfer(a) => run_transfer(a).await,
            BenchCommand::Watch(a) => run_watch(a).await,
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shoal bench: {e:#}");
            1
        }
    }
}

/// Parsed YCSB command line.
#[derive(Debug, Clone, Default)]
pub struct YcsbCommandLine {
    pub props: Properties,
    pub json: Option<PathBuf>,
    pub drop_first: bool,
}

/// YCSB's Client argument rules: -P files are read in order, then -p overrides win.
pub fn parse_ycsb_args(args: &[String]) -> Result<YcsbCommandLine> {
    let mut files = Properties::new();
    let mut overrides = Properties::new();
    let mut out = YcsbCommandLine::default();
    let mut i = 0;
    let value = |i: usize, flag: &str| -> Result<String> { args.get(i + 1).cloned().with_context(|| format!("{flag} needs a value")) };
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-P" => {
                let path = value(i, a)?;
                files.extend(&Properties::load_file(&path)?);
                i += 2;
            }
            "-p" => {
                let (k, v) = Properties::parse_assignment(&value(i, a)?)?;
                overrides.set(k, v);
                i += 2;
            }
            "-threads" | "--threads" => {
                overrides.set("threadcount", value(i, a)?);
                i += 2;
            }
            "-target" | "--target" => {
                overrides.set("target", value(i, a)?);
                i += 2;
            }
            "-db" | "--db" => {
                // The binding is chosen by the URL scheme; accept YCSB's flag for compatibility.
                overrides.set("db", value(i, a)?);
                i += 2;
            }
            "-s" | "--status" => {
                // Status is always reported (bar on a terminal, lines otherwise).
                i += 1;
            }
            "--url" => {
                let url = value(i, a)?;
                let key = if url.starts_with("postgres") { "postgresql.url" } else { "mongodb.url" };
                overrides.set(key, url);
                i += 2;
            }
            "--json" => {
                out.json = Some(PathBuf::from(value(i, a)?));
                i += 2;
            }
            "--drop" => {
                out.drop_first = true;
                i += 1;
            }
            other if other.starts_with("-p") && other.len() > 2 && other.contains('=') => {
                let (k, v) = Properties::parse_assignment(&other[2..])?;
                overrides.set(k, v);
                i += 1;
            }
            other => bail!("unknown ycsb option {other:?} (use -P FILE, -p KEY=VALUE, -threads N, -target N, -s, --url URL, --json FILE, --drop)"),
        }
    }
    files.extend(&overrides);
    out.props = files;
    Ok(out)
}

async fn run_ycsb(a: YcsbArgs) -> Result<()> {
    let phase = Phase::parse(&a.phase)?;
    let cl = parse_ycsb_args(&a.args)?;
    eprintln!("shoal bench ycsb (YCSB 0.17 CoreWorkload semantics)");
    eprintln!("Command line: {} {}", a.phase, a.args.join(" "));
    let mut opts = YcsbOptions::new(phase, cl.props.clone());
    opts.drop_first = cl.drop_first;
    eprintln!("Loading workload...\nStarting test.");
    let result = ycsb::run(&opts).await?;
    let json_export = cl.props.get("exporter").is_some_and(|e| e.contains("JSON"));
    let report = if json_export { result.json() } else { result.text() };
    match cl.props.get("exportfile") {
        Some(path) => std::fs::write(path, &report).with_context(|| format!("write {path}"))?,
        None => print!("{report}"),
    }
    if let Some(path) = cl.json {
        std::fs::write(&path, result.json()).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

async fn run_insert(a: InsertArgs) -> Result<()> {
    let o = InsertOptions {
        url: a.url,
        database: a.database,
        collection: a.collection,
        workers: a.workers,
        batch_size: a.batch_size,
        run_seconds: a.run_seconds.unwrap_or(if a.num_operations > 0 { 0 } else { 60 }),
        num_operations: a.num_operations,
        indexes: a.indexes,
        text_size_bytes: a.text_size,
        compressibility: a.compressibility,
        drop_collection: !a.no_drop,
        ordered: a.ordered,
        shard: a.shard,
        customers: a.customers,
        products: a.products,
        watch_pids: Vec::new(),
        quiet: false,
    };
    let r = insert::run(&o).await?;
    print!("{}", r.text());
    if let Some(path) = a.json {
        std::fs::write(&path, r.json()).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

/// `--watch-pid name=pid` arguments.
fn parse_watch_pids(args: &[String]) -> Result<Vec<(String, u32)>> {
    let mut watch_pids = Vec::new();
    for w in args {
        let (name, pid) = w.split_once('=').ok_or_else(|| anyhow::anyhow!("--watch-pid takes name=pid, got {w:?}"))?;
        watch_pids.push((name.to_string(), pid.parse().with_context(|| format!("--watch-pid {w:?}: not a process id"))?));
    }
    Ok(watch_pids)
}

async fn run_watch(a: WatchArgs) -> Result<()> {
    let o = crate::watch::WatchOptions {
        url: a.url,
        database: a.database,
        collection: a.collection,
        streams: a.streams,
        records: a.records,
        threads: a.threads,
        seconds_per_phase: a.seconds_per_phase,
        probes_per_second: a.probes_per_second,
        load: !a.no_load,
        watch_pids: parse_watch_pids(&a.watch_pids)?,
    };
    for r in crate::watch::run(&o).await? {
        print!("{}", r.text());
    }
    Ok(())
}

async fn run_transfer(a: TransferArgs) -> Result<()> {
    let watch_pids = parse_watch_pids(&a.watch_pids)?;
    let o = crate::transfer::TransferOptions {
        url: a.url,
        database: a.database,
        table: a.table,
        accounts: a.accounts,
        workers: a.workers,
        run_seconds: a.run_seconds,
        load: !a.no_load,
        watch_pids,
    };
    print!("{}", crate::transfer::run(&o).await?.text());
    Ok(())
}

async fn run_scenario(a: ScenarioArgs) -> Result<()> {
    let registry = scenario::registry();
    if a.list || a.name.is_none() {
        for s in &registry {
            println!("{:<12} {}", s.name(), s.description());
        }
        return Ok(());
    }
    let name = a.name.unwrap_or_default();
    let Some(s) = registry.iter().find(|s| s.name() == name) else {
        bail!("unknown scenario {name:?}; known: {}", registry.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "));
    };
    let sizes = scenario::SizeOverrides {
        records: a.records,
        seconds_per_phase: a.seconds_per_phase,
        members: a.members.clone(),
        chaining: a.chaining.clone(),
        server: a.server.clone(),
    };
    let report = scenario::run_scenario(s.as_ref(), a.quick, sizes, &a.out).await?;
    println!("{}", report.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn ycsb_flags() {
        let cl =
            parse_ycsb_args(&args("-P workloada -p recordcount=50 -threads 4 -target 100 -s --url postgresql://u@h/db --json out.json --drop")).expect("parse");
        assert_eq!(cl.props.get("readproportion"), Some("0.5"));
        assert_eq!(cl.props.get("recordcount"), Some("50"));
        assert_eq!(cl.props.get("threadcount"), Some("4"));
        assert_eq!(cl.props.get("target"), Some("100"));
        assert_eq!(cl.props.get("postgresql.url"), Some("postgresql://u@h/db"));
        assert_eq!(cl.json, Some(PathBuf::from("out.json")));
        assert!(cl.drop_first);
        // -p overrides win over -P regardless of order.
        let cl = parse_ycsb_args(&args("-p recordcount=7 -P workloadb")).expect("parse");
        assert_eq!(cl.props.get("recordcount"), Some("7"));
        assert!(parse_ycsb_args(&args("-threads")).is_err());
        assert!(parse_ycsb_args(&args("--bogus")).is_err());
        let cl = parse_ycsb_args(&args("--url mongodb://h:1/")).expect("parse");
        assert_eq!(cl.props.get("mongodb.url"), Some("mongodb://h:1/"));
    }
}
