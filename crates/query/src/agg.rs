//! Aggregation pipeline.
use crate::compare::cmp_bson;
use crate::num::{ArithOp, DecPrecision, Num};
use bson::{Bson, Document};
use common::Result;
use std::cmp::Ordering;

#[derive(Clone, Debug)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
}

#[derive(Clone, Debug)]
pub enum Stage {
    External(String, Document),
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub allow_disk_use: bool,
    pub mem_limit_bytes: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { allow_disk_use: false, mem_limit_bytes: 100 * 1024 * 1024 }
    }
}

impl Pipeline {
    pub fn parse(_stages: &[Document]) -> common::Result<Pipeline> {
        Err(common::Error::new(common::Code::NotImplemented, "aggregation not implemented yet"))
    }
    pub fn run(
        &self,
        _input: &mut dyn Iterator<Item = common::Result<Document>>,
        _opts: &RunOptions,
    ) -> common::Result<Vec<Document>> {
        Ok(Vec::new())
    }
    pub fn leading_match(&self) -> Option<Document> {
        None
    }
}

/// Accumulator kinds shared by $group and the array forms of $sum/$avg/... expressions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum AccKind {
    Sum,
    Avg,
    Min,
    Max,
    StdDevPop,
    StdDevSamp,
}

/// Running state of a numeric/ordering accumulator.
#[derive(Clone, Debug)]
pub(crate) struct Accum {
    kind: AccKind,
    sum: Num,
    count: u64,
    best: Option<Bson>,
    // Welford's online variance.
    mean: f64,
    m2: f64,
}

impl Accum {
    pub fn new(kind: AccKind) -> Accum {
        Accum { kind, sum: Num::I32(0), count: 0, best: None, mean: 0.0, m2: 0.0 }
    }

    pub fn add(&mut self, v: Option<Bson>) -> Result<()> {
        match self.kind {
            AccKind::Sum | AccKind::Avg => {
                if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                    self.sum = self.sum.arith(n, ArithOp::Add, DecPrecision::Digits34, true).unwrap_or(Num::F64(f64::NAN));
                    self.count += 1;
                }
            }
            AccKind::Min | AccKind::Max => {
                let Some(v) = v else { return Ok(()) };
                if matches!(v, Bson::Null | Bson::Undefined) {
                    return Ok(());
                }
                let replace = match &self.best {
                    None => true,
                    Some(b) => {
                        let o = cmp_bson(&v, b);
                        (self.kind == AccKind::Min && o == Ordering::Less) || (self.kind == AccKind::Max && o == Ordering::Greater)
                    }
                };
                if replace {
                    self.best = Some(v);
                }
            }
            AccKind::StdDevPop | AccKind::StdDevSamp => {
                if let Some(n) = v.as_ref().and_then(Num::from_bson) {
                    let x = n.to_f64();
                    self.count += 1;
                    let delta = x - self.mean;
                    self.mean += delta / self.count as f64;
                    self.m2 += delta * (x - self.mean);
                }
            }
        }
        Ok(())
    }

    pub fn finish(&self) -> Option<Bson> {
        Some(match self.kind {
            AccKind::Sum => self.sum.to_bson(),
            AccKind::Avg => {
                if self.count == 0 {
                    Bson::Null
                } else {
                    match self.sum {
                        Num::Dec(d) => {
                            Bson::Decimal128(d.div(crate::decimal::Dec::from_i64(self.count as i64)).encode())
                        }
                        s => Bson::Double(s.to_f64() / self.count as f64),
                    }
                }
            }
            AccKind::Min | AccKind::Max => self.best.clone().unwrap_or(Bson::Null),
            AccKind::StdDevPop => {
                if self.count == 0 {
                    Bson::Null
                } else {
                    Bson::Double((self.m2 / self.count as f64).sqrt())
                }
            }
            AccKind::StdDevSamp => {
                if self.count < 2 {
                    Bson::Null
                } else {
                    Bson::Double((self.m2 / (self.count - 1) as f64).sqrt())
                }
            }
        })
    }
}
