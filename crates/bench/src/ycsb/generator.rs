//! YCSB's number generators (site.ycsb.generator), ported with their exact arithmetic so key
//! choice and skew match YCSB runs: same zeta sums, same eta/alpha formulas, same FNV hash.
//!
//! Each client task owns its generator instances (cloned from one prototype, so the O(n) zeta
//! sum is computed once); counters that YCSB shares between threads are shared through `Arc`.

use parking_lot::Mutex;
use rand::Rng;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

pub const FNV_OFFSET_BASIS_64: i64 = 0xCBF2_9CE4_8422_2325_u64 as i64;
pub const FNV_PRIME_64: i64 = 1_099_511_628_211;

/// YCSB's Utils.fnvhash64: FNV-1a over the 8 little-end bytes of `val`, Java long semantics
/// (arithmetic shift, wrapping multiply, `Math.abs` that leaves Long.MIN_VALUE negative).
pub fn fnvhash64(mut val: i64) -> i64 {
    let mut hashval = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = val & 0xff;
        val >>= 8;
        hashval ^= octet;
        hashval = hashval.wrapping_mul(FNV_PRIME_64);
    }
    hashval.wrapping_abs()
}

/// CoreWorkload.buildKeyName: "user" + (hashed) key number, left-padded with zeros to
/// `zeropadding` digits (the padding counts the digits of the number only, not "user").
pub fn build_key_name(keynum: i64, zeropadding: usize, ordered_inserts: bool) -> String {
    let keynum = if ordered_inserts { keynum } else { fnvhash64(keynum) };
    let value = keynum.to_string();
    let fill = zeropadding.saturating_sub(value.len());
    let mut key = String::with_capacity(4 + fill + value.len());
    key.push_str("user");
    for _ in 0..fill {
        key.push('0');
    }
    key.push_str(&value);
    key
}

/// java.util.Random#nextDouble equivalent: 53 random bits in [0, 1).
fn next_double<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    rng.gen::<f64>()
}

/// `Math.abs(random.nextLong()) % interval` without Java's Long.MIN_VALUE corner (which would
/// make the result negative once in 2^64 draws).
fn next_below<R: Rng + ?Sized>(rng: &mut R, interval: i64) -> i64 {
    if interval <= 0 {
        return 0;
    }
    (rng.gen::<u64>() >> 1) as i64 % interval
}

/// A monotonically increasing counter shared by all client tasks (CounterGenerator).
#[derive(Debug)]
pub struct Counter {
    next: AtomicI64,
}

impl Counter {
    pub fn new(count_start: i64) -> Arc<Counter> {
        Arc::new(Counter { next: AtomicI64::new(count_start) })
    }
    pub fn next_value(&self) -> i64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    pub fn last_value(&self) -> i64 {
        self.next.load(Ordering::Relaxed) - 1
    }
}

/// AcknowledgedCounterGenerator: `last_value` is the highest value below which every generated
/// value has been acknowledged, so readers never pick a key whose insert is still in flight.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: AtomicI64,
    limit: AtomicI64,
    window: Mutex<Vec<bool>>,
}

/// YCSB's window of pending acknowledgements: 2^20 slots.
pub const ACK_WINDOW_SIZE: usize = 1 << 20;
const ACK_WINDOW_MASK: i64 = (ACK_WINDOW_SIZE as i64) - 1;

impl AcknowledgedCounter {
    pub fn new(count_start: i64) -> Arc<AcknowledgedCounter> {
        Arc::new(AcknowledgedCounter {
            next: AtomicI64::new(count_start),
            limit: AtomicI64::new(count_start - 1),
            window: Mutex::new(vec![false; ACK_WINDOW_SIZE]),
        })
    }
    pub fn next_value(&self) -> i64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
    pub fn last_value(&self) -> i64 {
        self.limit.load(Ordering::Acquire)
    }
    /// Marks `value` as inserted; advances the limit over the contiguous acknowledged prefix.
    /// Errors when more than the window's worth of values are outstanding (YCSB throws too).
    pub fn acknowledge(&self, value: i64) -> anyhow::Result<()> {
        let mut window = self.window.lock();
        let slot = (value & ACK_WINDOW_MASK) as usize;
        if window[slot] {
            anyhow::bail!("Too many unacknowledged insertion keys.");
        }
        window[slot] = true;
        let limit = self.limit.load(Ordering::Acquire);
        let before_first_slot = limit & ACK_WINDOW_MASK;
        let mut index = limit + 1;
        while index != before_first_slot {
            let s = (index & ACK_WINDOW_MASK) as usize;
            if !window[s] {
                break;
            }
            window[s] = false;
            index += 1;
        }
        self.limit.store(index - 1, Ordering::Release);
        Ok(())
    }
}

/// ZipfianGenerator: Gray et al., "Quickly Generating Billion-Record Synthetic Databases".
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: i64,
    base: i64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: i64,
}

pub const ZIPFIAN_CONSTANT: f64 = 0.99;

impl Zipfian {
    /// Items `min..=max` with constant `theta`; computes zeta(n) (O(n)).
    pub fn new(min: i64, max: i64, theta: f64) -> Zipfian {
        let zetan = zeta_static(0, max - min + 1, theta, 0.0);
        Zipfian::with_zetan(min, max, theta, zetan)
    }

    pub fn with_zetan(min: i64, max: i64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta_static(0, 2, theta, 0.0);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian { items, base: min, theta, zeta2theta, alpha, zetan, eta, count_for_zeta: items }
    }

    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// nextLong(itemcount): grows zeta incrementally when the item count grows (never shrinks,
    /// like YCSB's default allowitemcountdecrease=false).
    pub fn next_long<R: Rng + ?Sized>(&mut self, rng: &mut R, item_count: i64) -> i64 {
        if item_count > self.count_for_zeta {
            self.zetan = zeta_static(self.count_for_zeta, item_count, self.theta, self.zetan);
            self.count_for_zeta = item_count;
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan);
        }
        let u = next_double(rng);
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5_f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (item_count as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }

    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        let items = self.items;
        self.next_long(rng, items)
    }
}

/// zetastatic(st, n, theta, initialsum): sum over i in st..n of 1/(i+1)^theta.
pub fn zeta_static(st: i64, n: i64, theta: f64, initial_sum: f64) -> f64 {
    let mut sum = initial_sum;
    let mut i = st;
    while i < n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
        i += 1;
    }
    sum
}

/// ScrambledZipfianGenerator constants (YCSB 0.17): a zipfian over 10 billion items whose zeta
/// is precomputed, hashed into the requested range so popular items are spread out.
pub const SCRAMBLED_ZETAN: f64 = 26.46902820178302;
pub const SCRAMBLED_ITEM_COUNT: i64 = 10_000_000_000;

#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    gen: Zipfian,
    min: i64,
    item_count: i64,
}

impl ScrambledZipfian {
    /// Items `min..=max`, constant 0.99 (the only constant YCSB precomputed zeta for).
    pub fn new(min: i64, max: i64) -> ScrambledZipfian {
        ScrambledZipfian { gen: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN), min, item_count: max - min + 1 }
    }
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        let ret = self.gen.next_value(rng);
        self.min + fnvhash64(ret) % self.item_count
    }
}

/// HotspotIntegerGenerator: `hot_opn_fraction` of draws hit the first `hotset_fraction` of items.
#[derive(Debug, Clone)]
pub struct Hotspot {
    lower_bound: i64,
    hot_interval: i64,
    cold_interval: i64,
    hot_opn_fraction: f64,
}

impl Hotspot {
    pub fn new(lower_bound: i64, upper_bound: i64, hotset_fraction: f64, hot_opn_fraction: f64) -> Hotspot {
        let hotset_fraction = if (0.0..=1.0).contains(&hotset_fraction) { hotset_fraction } else { 0.0 };
        let hot_opn_fraction = if (0.0..=1.0).contains(&hot_opn_fraction) { hot_opn_fraction } else { 0.0 };
        let (lo, hi) = if lower_bound > upper_bound { (upper_bound, lower_bound) } else { (lower_bound, upper_bound) };
        let interval = hi - lo + 1;
        // YCSB truncates the hot interval through an int cast.
        let hot_interval = (interval as f64 * hotset_fraction) as i32 as i64;
        Hotspot { lower_bound: lo, hot_interval, cold_interval: interval - hot_interval, hot_opn_fraction }
    }
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        if next_double(rng) < self.hot_opn_fraction {
            self.lower_bound + next_below(rng, self.hot_interval)
        } else {
            self.lower_bound + self.hot_interval + next_below(rng, self.cold_interval)
        }
    }
}

/// ExponentialGenerator: `percentile`% of draws fall within `range` of the most recent item.
#[derive(Debug, Clone)]
pub struct Exponential {
    gamma: f64,
}

impl Exponential {
    pub fn new(percentile: f64, range: f64) -> Exponential {
        Exponential { gamma: -(1.0 - percentile / 100.0).ln() / range }
    }
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        (-next_double(rng).ln() / self.gamma) as i64
    }
}

/// Key chooser for transactions: one of YCSB's requestdistribution values.
#[derive(Debug, Clone)]
pub enum KeyChooser {
    Uniform {
        lb: i64,
        interval: i64,
    },
    Zipfian(ScrambledZipfian),
    /// SkewedLatestGenerator over the acknowledged insert counter.
    Latest {
        zipfian: Zipfian,
        basis: Arc<AcknowledgedCounter>,
    },
    Hotspot(Hotspot),
    /// SequentialGenerator: a shared counter wrapping within `first..=last`.
    Sequential {
        first: i64,
        interval: i64,
        counter: Arc<Counter>,
    },
    Exponential(Exponential),
}

impl KeyChooser {
    pub fn uniform(lb: i64, ub: i64) -> KeyChooser {
        KeyChooser::Uniform { lb, interval: ub - lb + 1 }
    }

    /// SkewedLatestGenerator's constructor: a zipfian over `basis.last_value()` items.
    pub fn latest(basis: Arc<AcknowledgedCounter>) -> KeyChooser {
        let items = basis.last_value().max(1);
        KeyChooser::Latest { zipfian: Zipfian::new(0, items - 1, ZIPFIAN_CONSTANT), basis }
    }

    pub fn sequential(first: i64, last: i64) -> KeyChooser {
        KeyChooser::Sequential { first, interval: last - first + 1, counter: Counter::new(first) }
    }

    pub fn is_exponential(&self) -> bool {
        matches!(self, KeyChooser::Exponential(_))
    }

    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        match self {
            KeyChooser::Uniform { lb, interval } => next_below(rng, *interval) + *lb,
            KeyChooser::Zipfian(z) => z.next_value(rng),
            KeyChooser::Latest { zipfian, basis } => {
                let max = basis.last_value();
                max - zipfian.next_long(rng, max)
            }
            KeyChooser::Hotspot(h) => h.next_value(rng),
            KeyChooser::Sequential { first, interval, counter } => {
                let n = counter.next_value() - *first;
                *first + n.rem_euclid((*interval).max(1))
            }
            KeyChooser::Exponential(e) => e.next_value(rng),
        }
    }
}

/// Scan length and field length choosers (uniform, zipfian or constant).
#[derive(Debug, Clone)]
pub enum LengthChooser {
    Constant(i64),
    Uniform { lb: i64, interval: i64 },
    Zipfian(Zipfian),
}

impl LengthChooser {
    pub fn next_value<R: Rng + ?Sized>(&mut self, rng: &mut R) -> i64 {
        match self {
            LengthChooser::Constant(v) => *v,
            LengthChooser::Uniform { lb, interval } => next_below(rng, *interval) + *lb,
            LengthChooser::Zipfian(z) => z.next_value(rng),
        }
    }
}

/// DiscreteGenerator: picks a value with probability weight/sum(weights).
#[derive(Debug, Clone)]
pub struct Discrete<T: Copy> {
    values: Vec<(f64, T)>,
}

impl<T: Copy> Default for Discrete<T> {
    fn default() -> Self {
        Discrete { values: Vec::new() }
    }
}

impl<T: Copy> Discrete<T> {
    pub fn add_value(&mut self, weight: f64, value: T) {
        self.values.push((weight, value));
    }
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
    pub fn next_value<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<T> {
        let sum: f64 = self.values.iter().map(|(w, _)| w).sum();
        let mut val = next_double(rng);
        for (w, v) in &self.values {
            let pw = w / sum;
            if val < pw {
                return Some(*v);
            }
            val -= pw;
        }
        // Rounding can leave val just above the last bucket; YCSB asserts, we take the last.
        self.values.last().map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn fnvhash64_matches_ycsb_values() {
        // Computed independently (Python, Java long semantics) from Utils.fnvhash64.
        assert_eq!(fnvhash64(0), 6284781860667377211);
        assert_eq!(fnvhash64(1), 8517097267634966620);
        assert_eq!(fnvhash64(2), 1820151046732198393);
        assert_eq!(fnvhash64(42), 55488592825689361);
        assert_eq!(fnvhash64(1000), 5952875239596136740);
        // Negative input: Java's >> sign-extends, so the high octets are 0xff.
        assert_eq!(fnvhash64(-1), 8289690350564177859);
    }

    #[test]
    fn key_names_hashed_ordered_and_padded() {
        assert_eq!(build_key_name(0, 1, false), "user6284781860667377211");
        assert_eq!(build_key_name(1, 1, false), "user8517097267634966620");
        assert_eq!(build_key_name(42, 1, false), "user55488592825689361");
        // Padding counts the number's digits: 17 digits padded to 20 gets three zeros.
        assert_eq!(build_key_name(42, 20, false), "user00055488592825689361");
        assert_eq!(build_key_name(5, 1, true), "user5");
        assert_eq!(build_key_name(5, 8, true), "user00000005");
        assert_eq!(build_key_name(123456789, 3, true), "user123456789");
    }

    #[test]
    fn zeta_sums() {
        assert_eq!(zeta_static(0, 1, 0.99, 0.0), 1.0);
        let z2 = 1.0 + 1.0 / 2f64.powf(0.99);
        assert!((zeta_static(0, 2, 0.99, 0.0) - z2).abs() < 1e-15);
        // Incremental equals from-scratch.
        let part = zeta_static(0, 500, 0.99, 0.0);
        assert!((zeta_static(500, 1000, 0.99, part) - zeta_static(0, 1000, 0.99, 0.0)).abs() < 1e-9);
    }

    #[test]
    fn zipfian_head_frequency_follows_zeta() {
        // With n items and theta, P(item 0) = 1/zeta(n, theta) and P(item 1) = 2^-theta/zeta.
        let n = 1000;
        let theta = 0.99;
        let zetan = zeta_static(0, n, theta, 0.0);
        let p0 = 1.0 / zetan;
        let p1 = 0.5_f64.powf(theta) / zetan;
        let mut z = Zipfian::new(0, n - 1, theta);
        let mut rng = StdRng::seed_from_u64(7);
        let draws = 200_000;
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let v = z.next_value(&mut rng);
            assert!((0..n).contains(&v), "out of range: {v}");
            counts[v as usize] += 1;
        }
        let f0 = counts[0] as f64 / draws as f64;
        let f1 = counts[1] as f64 / draws as f64;
        // 5 sigma of a binomial with p ~ 0.13 over 200k draws is ~0.0038.
        assert!((f0 - p0).abs() < 0.004, "item 0 frequency {f0}, expected {p0}");
        assert!((f1 - p1).abs() < 0.004, "item 1 frequency {f1}, expected {p1}");
        // Skew: the first 10% of items get well over half of the draws.
        let head: u64 = counts[..100].iter().sum();
        let expected_head = zeta_static(0, 100, theta, 0.0) / zetan;
        assert!((head as f64 / draws as f64 - expected_head).abs() < 0.03, "head share {head}, expected {expected_head}");
        assert!(counts[0] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn scrambled_zipfian_in_range_and_skewed() {
        let mut rng = StdRng::seed_from_u64(11);
        for (min, max) in [(0, 999), (100, 199), (0, 0), (5, 6)] {
            let mut g = ScrambledZipfian::new(min, max);
            for _ in 0..20_000 {
                let v = g.next_value(&mut rng);
                assert!(v >= min && v <= max, "{v} not in {min}..={max}");
            }
        }
        // The most popular underlying item (0) maps to fnvhash64(0) % n, and is hottest.
        let n = 1000;
        let mut g = ScrambledZipfian::new(0, n - 1);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..100_000 {
            counts[g.next_value(&mut rng) as usize] += 1;
        }
        let hottest = counts.iter().enumerate().max_by_key(|(_, c)| **c).map(|(i, _)| i as i64);
        assert_eq!(hottest, Some(fnvhash64(0) % n));
        // P(item 0 of 10^10) = 1/26.469; its bucket also collects a few other items.
        let f = counts[(fnvhash64(0) % n) as usize] as f64 / 100_000.0;
        assert!(f > 1.0 / SCRAMBLED_ZETAN - 0.01, "hottest frequency {f}");
    }

    #[test]
    fn precomputed_zetan_is_consistent_with_its_item_count() {
        // zeta(10^10, 0.99) can't be summed in a test; check it brackets the integral bounds
        // 1 + ∫_1^n x^-θ dx < ζ(n) < 1 + ∫_1^n ... + 1 (a monotone series).
        let theta = 0.99;
        let n = SCRAMBLED_ITEM_COUNT as f64;
        let integral = (n.powf(1.0 - theta) - 1.0) / (1.0 - theta);
        assert!(SCRAMBLED_ZETAN > integral && SCRAMBLED_ZETAN < integral + 1.0);
    }

    #[test]
    fn latest_prefers_newest_and_tracks_acknowledged_inserts() {
        let basis = AcknowledgedCounter::new(1000);
        let mut g = KeyChooser::latest(basis.clone());
        let mut rng = StdRng::seed_from_u64(3);
        let mut newest = 0;
        for _ in 0..10_000 {
            let v = g.next_value(&mut rng);
            assert!((0..=999).contains(&v), "{v}");
            if v == 999 {
                newest += 1;
            }
        }
        assert!(newest > 1000, "newest item drawn {newest} times");
        let k = basis.next_value();
        assert_eq!(k, 1000);
        assert_eq!(basis.last_value(), 999);
        basis.acknowledge(k).expect("ack");
        assert_eq!(basis.last_value(), 1000);
        // Out-of-order acknowledgements advance the limit only over the contiguous prefix.
        let (a, b) = (basis.next_value(), basis.next_value());
        basis.acknowledge(b).expect("ack b");
        assert_eq!(basis.last_value(), 1000);
        basis.acknowledge(a).expect("ack a");
        assert_eq!(basis.last_value(), 1002);
    }

    #[test]
    fn hotspot_and_uniform_bounds() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut h = Hotspot::new(0, 999, 0.2, 0.8);
        let mut hot = 0;
        for _ in 0..10_000 {
            let v = h.next_value(&mut rng);
            assert!((0..1000).contains(&v));
            if v < 200 {
                hot += 1;
            }
        }
        assert!((7600..8400).contains(&hot), "hot draws {hot}");
        let mut u = KeyChooser::uniform(10, 12);
        let mut seen = [false; 3];
        for _ in 0..1000 {
            let v = u.next_value(&mut rng);
            assert!((10..=12).contains(&v));
            seen[(v - 10) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn discrete_proportions() {
        let mut d = Discrete::default();
        d.add_value(0.95, 'r');
        d.add_value(0.05, 'u');
        let mut rng = StdRng::seed_from_u64(9);
        let reads = (0..20_000).filter(|_| d.next_value(&mut rng) == Some('r')).count();
        assert!((18_700..19_300).contains(&reads), "reads {reads}");
        assert_eq!(Discrete::<char>::default().next_value(&mut rng), None);
    }
}
