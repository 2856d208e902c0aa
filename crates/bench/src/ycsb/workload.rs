//! site.ycsb.workloads.CoreWorkload: property parsing, key/field/value generation and the
//! per-operation logic (doInsert / doTransaction), measured like YCSB's DBWrapper.

use super::generator::{
    build_key_name, AcknowledgedCounter, Counter, Discrete, Exponential, Hotspot, KeyChooser, LengthChooser, ScrambledZipfian, Zipfian, ZIPFIAN_CONSTANT,
};
use super::measure::{LiveStats, Measurements, OpKind, Status};
use super::props::Properties;
use crate::target::{Record, Target};
use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Field count and length limits: a record must stay well below MongoDB's 16 MiB document.
pub const FIELD_COUNT_MAX: i64 = 1000;
pub const FIELD_LENGTH_BYTES_MAX: i64 = 1024 * 1024;
pub const BATCH_SIZE_MAX: i64 = 100_000;
pub const SCAN_LENGTH_MAX: i64 = 1_000_000;

/// Everything YCSB's CoreWorkload.init derives from the properties; shared by all tasks.
#[derive(Debug)]
pub struct CoreWorkload {
    pub table: String,
    pub field_names: Vec<String>,
    pub read_all_fields: bool,
    pub read_all_fields_by_name: bool,
    pub write_all_fields: bool,
    pub record_count: i64,
    pub insert_start: i64,
    pub insert_count: i64,
    pub zero_padding: usize,
    pub ordered_inserts: bool,
    pub batch_size: usize,
    pub insertion_retry_limit: u32,
    pub insertion_retry_interval_s: u64,
    key_sequence: Arc<Counter>,
    transaction_insert_key_sequence: Arc<AcknowledgedCounter>,
    operation_chooser: Discrete<OpKind>,
    key_chooser: KeyChooser,
    field_length: LengthChooser,
    scan_length: LengthChooser,
}

/// Per-task state: RNG, generator clones, the pending insert batch.
pub struct ThreadState {
    rng: StdRng,
    key_chooser: KeyChooser,
    field_length: LengthChooser,
    scan_length: LengthChooser,
    pending: Vec<Record>,
}

fn positive(p: &Properties, key: &str, default: i64, max: i64) -> Result<i64> {
    let v = p.get_i64(key, default)?;
    if v < 1 || v > max {
        bail!("{key}={v} must be between 1 and {max}");
    }
    Ok(v)
}

impl CoreWorkload {
    pub fn init(p: &Properties) -> Result<CoreWorkload> {
        let table = p.get_or("table", "usertable").to_string();
        let field_count = positive(p, "fieldcount", 10, FIELD_COUNT_MAX)?;
        let prefix = p.get_or("fieldnameprefix", "field");
        let field_names: Vec<String> = (0..field_count).map(|i| format!("{prefix}{i}")).collect();

        let field_length_max = positive(p, "fieldlength", 100, FIELD_LENGTH_BYTES_MAX)?;
        let field_length_min = positive(p, "minfieldlength", 1, FIELD_LENGTH_BYTES_MAX)?;
        let field_length = match p.get_or("fieldlengthdistribution", "constant") {
            "constant" => LengthChooser::Constant(field_length_max),
            "uniform" => LengthChooser::Uniform { lb: field_length_min, interval: field_length_max - field_length_min + 1 },
            "zipfian" => LengthChooser::Zipfian(Zipfian::new(field_length_min, field_length_max, ZIPFIAN_CONSTANT)),
            other => bail!("Unknown field length distribution \"{other}\" (histogram files are not supported)"),
        };

        let mut record_count = p.get_i64("recordcount", 0)?;
        if record_count == 0 {
            record_count = i32::MAX as i64;
        }
        if record_count < 0 {
            bail!("recordcount={record_count} must not be negative");
        }
        let insert_start = p.get_i64("insertstart", 0)?;
        let insert_count = p.get_i64("insertcount", record_count - insert_start)?;
        if record_count < insert_start + insert_count || insert_start < 0 || insert_count < 0 {
            bail!("Invalid combination of insertstart, insertcount and recordcount: recordcount must be at least insertstart + insertcount");
        }
        let zero_padding = p.get_i64("zeropadding", 1)?.clamp(0, 64) as usize;
        let ordered_inserts = p.get_or("insertorder", "hashed") != "hashed";

        let operation_count = p.get_i64("operationcount", 0)?;
        let insert_proportion = p.get_f64("insertproportion", 0.0)?;
        let mut operation_chooser = Discrete::default();
        for (key, default, kind) in [
            ("readproportion", 0.95, OpKind::Read),
            ("updateproportion", 0.05, OpKind::Update),
            ("insertproportion", 0.0, OpKind::Insert),
            ("scanproportion", 0.0, OpKind::Scan),
            ("readmodifywriteproportion", 0.0, OpKind::ReadModifyWrite),
        ] {
            let w = p.get_f64(key, default)?;
            if w > 0.0 {
                operation_chooser.add_value(w, kind);
            }
        }

        let transaction_insert_key_sequence = AcknowledgedCounter::new(record_count);
        let last = insert_start + insert_count - 1;
        let key_chooser = match p.get_or("requestdistribution", "uniform") {
            "uniform" => KeyChooser::uniform(insert_start, last),
            "sequential" => KeyChooser::sequential(insert_start, last),
            "zipfian" => {
                // Sized for the inserts the run will make (x2 fudge factor, as YCSB), so the hot
                // set does not move while records are added.
                let expected_new_keys = (operation_count as f64 * insert_proportion * 2.0) as i64;
                KeyChooser::Zipfian(ScrambledZipfian::new(insert_start, insert_start + insert_count + expected_new_keys))
            }
            "latest" => KeyChooser::latest(transaction_insert_key_sequence.clone()),
            "hotspot" => KeyChooser::Hotspot(Hotspot::new(insert_start, last, p.get_f64("hotspotdatafraction", 0.2)?, p.get_f64("hotspotopnfraction", 0.8)?)),
            "exponential" => {
                let percentile = p.get_f64("exponential.percentile", 95.0)?;
                let frac = p.get_f64("exponential.frac", 0.8571428571)?;
                KeyChooser::Exponential(Exponential::new(percentile, record_count as f64 * frac))
            }
            other => bail!("Unknown request distribution \"{other}\""),
        };

        let min_scan = positive(p, "minscanlength", 1, SCAN_LENGTH_MAX)?;
        let max_scan = positive(p, "maxscanlength", 1000, SCAN_LENGTH_MAX)?;
        let scan_length = match p.get_or("scanlengthdistribution", "uniform") {
            "uniform" => LengthChooser::Uniform { lb: min_scan, interval: max_scan - min_scan + 1 },
            "zipfian" => LengthChooser::Zipfian(Zipfian::new(min_scan, max_scan, ZIPFIAN_CONSTANT)),
            other => bail!("Distribution \"{other}\" not allowed for scan length"),
        };

        Ok(CoreWorkload {
            table,
            field_names,
            read_all_fields: p.get_bool("readallfields", true),
            read_all_fields_by_name: p.get_bool("readallfieldsbyname", false),
            write_all_fields: p.get_bool("writeallfields", false),
            record_count,
            insert_start,
            insert_count,
            zero_padding,
            ordered_inserts,
            batch_size: positive(p, "batchsize", 1, BATCH_SIZE_MAX)? as usize,
            insertion_retry_limit: p.get_i64("core_workload_insertion_retry_limit", 0)?.clamp(0, 1000) as u32,
            insertion_retry_interval_s: p.get_i64("core_workload_insertion_retry_interval", 3)?.clamp(0, 3600) as u64,
            key_sequence: Counter::new(insert_start),
            transaction_insert_key_sequence,
            operation_chooser,
            key_chooser,
            field_length,
            scan_length,
        })
    }

    /// The key the run's next insert takes.
    pub fn next_insert_key(&self) -> i64 {
        self.transaction_insert_key_sequence.last_value() + 1
    }

    pub fn has_operations(&self) -> bool {
        !self.operation_chooser.is_empty()
    }

    pub fn init_thread(&self) -> ThreadState {
        ThreadState {
            rng: StdRng::from_entropy(),
            key_chooser: self.key_chooser.clone(),
            field_length: self.field_length.clone(),
            scan_length: self.scan_length.clone(),
            pending: Vec::new(),
        }
    }

    pub fn key_name(&self, keynum: i64) -> String {
        build_key_name(keynum, self.zero_padding, self.ordered_inserts)
    }

    fn field_index(&self, rng: &mut StdRng) -> usize {
        rng.gen_range(0..self.field_names.len())
    }

    fn build_values(&self, st: &mut ThreadState) -> Vec<(String, Vec<u8>)> {
        let mut values = Vec::with_capacity(self.field_names.len());
        for name in &self.field_names {
            let len = st.field_length.next_value(&mut st.rng).max(0) as usize;
            values.push((name.clone(), random_bytes(&mut st.rng, len)));
        }
        values
    }

    fn build_single_value(&self, st: &mut ThreadState) -> Vec<(String, Vec<u8>)> {
        let i = self.field_index(&mut st.rng);
        let len = st.field_length.next_value(&mut st.rng).max(0) as usize;
        vec![(self.field_names[i].clone(), random_bytes(&mut st.rng, len))]
    }

    /// The field list for a read: None means "all fields" (YCSB passes null).
    fn read_fields(&self, st: &mut ThreadState, for_read: bool) -> Option<Vec<String>> {
        if !self.read_all_fields {
            let i = self.field_index(&mut st.rng);
            Some(vec![self.field_names[i].clone()])
        } else if for_read && self.read_all_fields_by_name {
            Some(self.field_names.clone())
        } else {
            None
        }
    }

    /// CoreWorkload.nextKeynum: never a key beyond the acknowledged inserts.
    fn next_keynum(&self, st: &mut ThreadState) -> i64 {
        let last = self.transaction_insert_key_sequence.last_value();
        if st.key_chooser.is_exponential() {
            loop {
                let k = last - st.key_chooser.next_value(&mut st.rng);
                if k >= 0 {
                    return k;
                }
            }
        }
        // Bounded: a chooser that keeps drawing beyond the acknowledged range means the run
        // inserted nothing yet; fall back to the last acknowledged key.
        for _ in 0..KEY_DRAWS_MAX {
            let k = st.key_chooser.next_value(&mut st.rng);
            if k <= self.transaction_insert_key_sequence.last_value() {
                return k;
            }
        }
        last.max(0)
    }

    /// doInsert (load phase): the next sequential key, all fields, batched when batchsize > 1.
    pub async fn do_insert(&self, db: &dyn Target, st: &mut ThreadState, m: &mut Measurements, live: &LiveStats) -> bool {
        let keynum = self.key_sequence.next_value();
        let key = self.key_name(keynum);
        let values = self.build_values(st);
        let mut retries = 0;
        loop {
            let status = self.insert_measured(db, st, m, live, Record { key: key.clone(), fields: values.clone() }).await;
            if status.is_ok() {
                break;
            }
            retries += 1;
            if retries <= self.insertion_retry_limit {
                eprintln!("Retrying insertion, retry count: {retries}");
                let jitter = 0.8 + 0.4 * st.rng.gen::<f64>();
                tokio::time::sleep(Duration::from_secs_f64(self.insertion_retry_interval_s as f64 * jitter)).await;
            } else {
                eprintln!("Error inserting, not retrying any more. number of attempts: {retries}. Insertion Retry Limit: {}", self.insertion_retry_limit);
                break;
            }
        }
        live.op_done();
        true
    }

    /// The MongoDB binding's batching: buffer until `batchsize` records, then insert them all;
    /// buffered calls report BATCHED_OK.
    async fn insert_measured(&self, db: &dyn Target, st: &mut ThreadState, m: &mut Measurements, live: &LiveStats, record: Record) -> Status {
        let start = Instant::now();
        let status = if self.batch_size <= 1 {
            db.ycsb_insert(&self.table, std::slice::from_ref(&record)).await
        } else {
            st.pending.push(record);
            if st.pending.len() >= self.batch_size {
                let batch = std::mem::take(&mut st.pending);
                db.ycsb_insert(&self.table, &batch).await
            } else {
                Status::BatchedOk
            }
        };
        let us = elapsed_us(start);
        m.record("INSERT", status, us);
        live.record(OpKind::Insert, us);
        status
    }

    /// Flushes a partial batch at the end of the run (YCSB's binding drops it; we insert it so
    /// a load really holds recordcount records).
    pub async fn flush(&self, db: &dyn Target, st: &mut ThreadState, m: &mut Measurements, live: &LiveStats) {
        if st.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut st.pending);
        let start = Instant::now();
        let status = db.ycsb_insert(&self.table, &batch).await;
        let us = elapsed_us(start);
        m.record("INSERT", status, us);
        live.record(OpKind::Insert, us);
    }

    /// doTransaction (run phase): one operation chosen by the proportions.
    pub async fn do_transaction(&self, db: &dyn Target, st: &mut ThreadState, m: &mut Measurements, live: &LiveStats) -> bool {
        let Some(op) = self.operation_chooser.next_value(&mut st.rng) else { return false };
        match op {
            OpKind::Read => {
                let keynum = self.next_keynum(st);
                let key = self.key_name(keynum);
                let fields = self.read_fields(st, true);
                timed(m, live, OpKind::Read, db.ycsb_read(&self.table, &key, fields.as_deref())).await;
            }
            OpKind::Update => {
                let keynum = self.next_keynum(st);
                let key = self.key_name(keynum);
                let values = if self.write_all_fields { self.build_values(st) } else { self.build_single_value(st) };
                timed(m, live, OpKind::Update, db.ycsb_update(&self.table, &key, &values)).await;
            }
            OpKind::Insert => {
                let keynum = self.transaction_insert_key_sequence.next_value();
                let key = self.key_name(keynum);
                let values = self.build_values(st);
                self.insert_measured(db, st, m, live, Record { key, fields: values }).await;
                if let Err(e) = self.transaction_insert_key_sequence.acknowledge(keynum) {
                    eprintln!("{e}");
                    return false;
                }
            }
            OpKind::Scan => {
                let keynum = self.next_keynum(st);
                let key = self.key_name(keynum);
                let len = st.scan_length.next_value(&mut st.rng).max(1) as usize;
                let fields = self.read_fields(st, false);
                timed(m, live, OpKind::Scan, db.ycsb_scan(&self.table, &key, len, fields.as_deref())).await;
            }
            OpKind::ReadModifyWrite => {
                let keynum = self.next_keynum(st);
                let key = self.key_name(keynum);
                let fields = self.read_fields(st, false);
                let values = if self.write_all_fields { self.build_values(st) } else { self.build_single_value(st) };
                let start = Instant::now();
                let mut status = timed(m, live, OpKind::Read, db.ycsb_read(&self.table, &key, fields.as_deref())).await;
                if status.is_ok() {
                    status = timed(m, live, OpKind::Update, db.ycsb_update(&self.table, &key, &values)).await;
                }
                let us = elapsed_us(start);
                m.measure("READ-MODIFY-WRITE", us);
                m.report_status("READ-MODIFY-WRITE", status);
                live.record(OpKind::ReadModifyWrite, us);
            }
        }
        live.op_done();
        true
    }
}

/// Draws before `next_keynum` gives up waiting for inserts to be acknowledged.
pub const KEY_DRAWS_MAX: u32 = 10_000;

/// Measures one DB call as DBWrapper does.
async fn timed(m: &mut Measurements, live: &LiveStats, kind: OpKind, fut: impl std::future::Future<Output = Status>) -> Status {
    let start = Instant::now();
    let status = fut.await;
    let us = elapsed_us(start);
    m.record(kind.name(), status, us);
    live.record(kind, us);
    status
}

pub fn elapsed_us(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// RandomByteIterator: 6 printable bytes per 32-bit random number, in YCSB's bit layout.
pub fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut base = 0;
    while base < len {
        let bytes: i32 = rng.gen();
        let n = (len - base).min(6);
        let b = |shift: u32, mask: i32| (((bytes >> shift) & mask) + b' ' as i32) as u8;
        let chunk = [b(0, 31), b(5, 63), b(10, 95), b(15, 31), b(20, 63), b(25, 95)];
        buf[base..base + n].copy_from_slice(&chunk[..n]);
        base += 6;
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(text: &str) -> Properties {
        Properties::parse(text).expect("props")
    }

    #[test]
    fn init_defaults_match_ycsb() {
        let w = CoreWorkload::init(&props("recordcount=1000\noperationcount=1000\n")).expect("init");
        assert_eq!(w.table, "usertable");
        assert_eq!(w.field_names.len(), 10);
        assert_eq!(w.field_names[9], "field9");
        assert!(w.read_all_fields);
        assert!(!w.write_all_fields);
        assert_eq!(w.insert_count, 1000);
        assert!(!w.ordered_inserts);
        assert_eq!(w.batch_size, 1);
        assert_eq!(w.key_name(0), "user6284781860667377211");
        assert!(CoreWorkload::init(&props("requestdistribution=bogus")).is_err());
        assert!(CoreWorkload::init(&props("recordcount=10\ninsertstart=5\ninsertcount=10")).is_err());
        assert!(CoreWorkload::init(&props("fieldcount=0")).is_err());
    }

    #[test]
    fn random_bytes_are_printable_and_sized() {
        let mut rng = StdRng::seed_from_u64(1);
        for len in [0usize, 1, 5, 6, 7, 100] {
            let b = random_bytes(&mut rng, len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|c| (32..=127).contains(c)), "{b:?}");
        }
    }

    #[test]
    fn keys_stay_within_loaded_records() {
        for dist in ["uniform", "zipfian", "latest", "hotspot", "sequential", "exponential"] {
            let w = CoreWorkload::init(&props(&format!("recordcount=500\noperationcount=100\nrequestdistribution={dist}\n"))).expect(dist);
            let mut st = w.init_thread();
            for _ in 0..5000 {
                let k = w.next_keynum(&mut st);
                assert!((0..500).contains(&k), "{dist}: {k}");
            }
        }
    }
}
