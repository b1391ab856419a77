//! What a Sparkplug B message's metrics become: each metric's value as a
//! field ([`value`], by the specification's datatypes), the samples they
//! form by time ([`ByTime`]), the alias map a BIRTH teaches ([`learn`]),
//! and the bounded look at a payload before it is decoded
//! ([`count_metrics`]). Sans-IO, no state.

use std::collections::BTreeMap;

use super::proto::{self, metric::Value};
use super::{Aliases, Def, HISTORICAL};
use crate::decode::{field_name, truncate, DecodeError, FieldValue, Limits, Reading};

/// Sparkplug B data types (the numbers of the specification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum DataType {
    Int8 = 1,
    Int16 = 2,
    Int32 = 3,
    Int64 = 4,
    UInt8 = 5,
    UInt16 = 6,
    UInt32 = 7,
    UInt64 = 8,
    Float = 9,
    Double = 10,
    Boolean = 11,
    String = 12,
    DateTime = 13,
    Text = 14,
    Uuid = 15,
}

/// The name of a datatype palletd does not store, for the skipped metric.
fn unsupported_name(datatype: u32) -> &'static str {
    match datatype {
        16 => "DataSet",
        17 => "Bytes",
        18 => "File",
        19 => "Template",
        20 => "PropertySet",
        21 => "PropertySetList",
        22..=34 => "Array",
        _ => "Unknown",
    }
}

/// The samples of one message being built: fields by (time, historical).
#[derive(Default)]
pub(super) struct ByTime {
    by_time: BTreeMap<(i64, bool), Vec<(String, FieldValue)>>,
}

impl ByTime {
    pub(super) fn push(&mut self, ts_ms: i64, historical: bool, name: String, value: FieldValue) {
        self.by_time
            .entry((ts_ms, historical))
            .or_default()
            .push((name, value));
    }

    pub(super) fn readings(self, sensor: &str, max_fields: usize) -> Vec<Reading> {
        let mut out = Vec::with_capacity(self.by_time.len());
        for ((ts_ms, historical), fields) in self.by_time {
            // Leave room for the flag in each part.
            let room = max_fields.saturating_sub(usize::from(historical)).max(1);
            let mut fields = fields.into_iter().peekable();
            while fields.peek().is_some() {
                let mut part: Vec<(String, FieldValue)> = fields.by_ref().take(room).collect();
                if historical {
                    part.push((HISTORICAL.into(), FieldValue::Bool(true)));
                }
                let index = out.len();
                out.push(Reading {
                    sensor: sensor.to_string(),
                    ts_ms,
                    fields: part,
                    index,
                    units: Vec::new(),
                });
            }
        }
        out
    }
}

/// A message's metrics as fields of [`ByTime`]: a metric without a name
/// takes it from `aliases` (the BIRTH's map); its time is its own, else
/// `payload_ts`. Returns the aliases no BIRTH named and the first metric
/// refused (the rest are stored); datatypes palletd does not store go to
/// `skipped`.
pub(super) fn convert(
    metrics: &[proto::Metric],
    aliases: Option<&Aliases>,
    payload_ts: i64,
    limits: &Limits,
    samples: &mut ByTime,
    skipped: &mut Vec<&'static str>,
) -> (Vec<u64>, Option<DecodeError>) {
    let mut unknown: Vec<u64> = Vec::new();
    let mut bad: Option<DecodeError> = None;
    for m in metrics {
        let def = m.alias.and_then(|a| aliases.and_then(|map| map.get(&a)));
        let (name, datatype) = match (&m.name, def) {
            (Some(n), _) => (n.as_str(), m.datatype.or(def.map(|d| d.datatype))),
            (None, Some(d)) => (d.name.as_str(), m.datatype.or(Some(d.datatype))),
            (None, None) => {
                unknown.push(m.alias.unwrap_or(u64::MAX));
                continue;
            }
        };
        if m.is_null == Some(true) || m.value.is_none() {
            continue;
        }
        let datatype = datatype.unwrap_or(0);
        let value = match value(m, datatype) {
            Ok(Some(v)) => v,
            Ok(None) => {
                skipped.push(unsupported_name(datatype));
                continue;
            }
            Err(why) => {
                bad.get_or_insert(DecodeError::BadField {
                    index: 0,
                    message: format!("metric {:?}: {why}", truncate(name, 64)),
                });
                continue;
            }
        };
        if name.is_empty() {
            bad.get_or_insert(DecodeError::BadField {
                index: 0,
                message: "a metric with an empty name".into(),
            });
            continue;
        }
        let field = field_name(name).into_owned();
        if field.len() > limits.max_field_name_length {
            bad.get_or_insert(DecodeError::OverLimit {
                cause: "field_name_too_long",
                message: format!(
                    "metric {:?}: its field name of {} bytes exceeds limits.max_field_name_length ({})",
                    truncate(name, 64),
                    field.len(),
                    limits.max_field_name_length
                ),
            });
            continue;
        }
        if let FieldValue::Str(s) = &value {
            if s.len() > limits.max_string_length {
                bad.get_or_insert(DecodeError::OverLimit {
                    cause: "string_too_long",
                    message: format!(
                        "metric {:?} has {} bytes, over limits.max_string_length ({})",
                        truncate(name, 64),
                        s.len(),
                        limits.max_string_length
                    ),
                });
                continue;
            }
        }
        let ts = match m.timestamp {
            Some(ts) => match ms(ts, "metric") {
                Ok(ts) => ts,
                Err(e) => {
                    bad.get_or_insert(e);
                    continue;
                }
            },
            None => payload_ts,
        };
        samples.push(ts, m.is_historical == Some(true), field, value);
    }
    (unknown, bad)
}

pub(super) fn ms(t: u64, what: &str) -> Result<i64, DecodeError> {
    i64::try_from(t).map_err(|_| DecodeError::BadTimestamp {
        index: 0,
        message: format!("{what} timestamp {t} is out of range"),
    })
}

/// The alias map a BIRTH's metrics define; a name whose field name would
/// be longer than `max_name` is not kept (its values are refused as
/// `field_name_too_long`, its DATA by alias as `unknown_alias`).
pub(super) fn learn(metrics: &[proto::Metric], max_name: usize) -> Aliases {
    metrics
        .iter()
        .filter(|m| {
            m.name
                .as_deref()
                .is_some_and(|n| field_name(n).len() <= max_name)
        })
        .filter_map(|m| {
            Some((
                m.alias?,
                Def {
                    name: m.name.clone()?,
                    datatype: m.datatype.unwrap_or(0),
                },
            ))
        })
        .collect()
}

/// How many metrics (field 2) a Sparkplug payload holds, up to `max` + 1,
/// by walking its top-level fields without decoding them.
pub(super) fn count_metrics(payload: &[u8], max: usize) -> Result<usize, prost::DecodeError> {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut buf = payload;
    let mut n = 0;
    while !buf.is_empty() && n <= max {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag == 2 {
            n += 1;
        }
        skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
    }
    Ok(n)
}

/// A Float metric as the double of the shortest decimal that reads back
/// as the same f32: a device that sent 18.85 meant 18.85, not the f32's
/// exact value widened (18.850000381469727). Rust prints an f32 as exactly
/// that shortest decimal.
pub(super) fn float_as_written(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// The value of the `bdSeq` metric of an NBIRTH or NDEATH.
pub(super) fn bd_seq_of(metrics: &[proto::Metric]) -> Option<u64> {
    let m = metrics
        .iter()
        .find(|m| m.name.as_deref() == Some("bdSeq"))?;
    match m.value {
        Some(Value::IntValue(v)) => Some(u64::from(v)),
        Some(Value::LongValue(v)) => Some(v),
        _ => None,
    }
}

/// A metric's value as a field: `Ok(None)` for a datatype palletd skips.
fn value(m: &proto::Metric, datatype: u32) -> Result<Option<FieldValue>, String> {
    let int = || match m.value {
        Some(Value::IntValue(v)) => Some(u64::from(v)),
        Some(Value::LongValue(v)) => Some(v),
        _ => None,
    };
    let mismatch = || format!("datatype {datatype} with a value of another type");
    let num = |x: f64| {
        if x.is_finite() {
            Ok(Some(FieldValue::Num(x)))
        } else {
            Err(format!("{x} is not a finite number"))
        }
    };
    match datatype {
        // Signed integers travel as two's complement of their width.
        1 => int().map_or_else(|| Err(mismatch()), |v| num(f64::from(v as u8 as i8))),
        2 => int().map_or_else(|| Err(mismatch()), |v| num(f64::from(v as u16 as i16))),
        3 => int().map_or_else(|| Err(mismatch()), |v| num(f64::from(v as u32 as i32))),
        4 => int().map_or_else(|| Err(mismatch()), |v| num(v as i64 as f64)),
        5..=8 => int().map_or_else(|| Err(mismatch()), |v| num(v as f64)),
        9 | 10 => match m.value {
            Some(Value::FloatValue(x)) => num(float_as_written(x)),
            Some(Value::DoubleValue(x)) => num(x),
            _ => Err(mismatch()),
        },
        11 => match m.value {
            Some(Value::BooleanValue(b)) => Ok(Some(FieldValue::Bool(b))),
            _ => Err(mismatch()),
        },
        12 | 14 | 15 => match &m.value {
            Some(Value::StringValue(s)) => Ok(Some(FieldValue::Str(s.clone()))),
            _ => Err(mismatch()),
        },
        13 => match int() {
            Some(t) => i64::try_from(t)
                .map(|t| Some(FieldValue::Date(t)))
                .map_err(|_| format!("DateTime {t} is out of range")),
            None => Err(mismatch()),
        },
        _ => Ok(None),
    }
}
