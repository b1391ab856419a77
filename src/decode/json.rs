//! `format = "json"`: an object `{"ts": ..., "temp": 21.7, ...}` or an array
//! of such objects (several samples, one acknowledgement).

use super::{check_field_name, check_sensor, truncate, DecodeError, FieldValue, Limits, Reading};
use super::{Subscription, TopicMatch};

pub(super) fn decode(
    sub: &Subscription,
    m: TopicMatch<'_>,
    payload: &[u8],
    now_ms: i64,
    limits: &Limits,
    errors: &mut Vec<DecodeError>,
) -> Result<Vec<Reading>, DecodeError> {
    let value: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    let objects = match value {
        serde_json::Value::Object(o) => vec![o],
        serde_json::Value::Array(items) => {
            if items.is_empty() {
                return Err(DecodeError::BadPayload("empty array: no samples".into()));
            }
            if items.len() > limits.max_samples_per_message {
                return Err(DecodeError::OverLimit {
                    cause: "too_many_samples",
                    message: format!(
                        "{} samples in one message exceed limits.max_samples_per_message ({})",
                        items.len(),
                        limits.max_samples_per_message
                    ),
                });
            }
            let mut objects = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    serde_json::Value::Object(o) => objects.push(o),
                    _ => {
                        return Err(DecodeError::BadPayload(format!(
                            "array element {i} is not an object"
                        )))
                    }
                }
            }
            objects
        }
        _ => {
            return Err(DecodeError::BadPayload(
                "expected a JSON object or an array of objects".into(),
            ))
        }
    };
    let topic_sensor = match (&sub.sensor_field, m.sensor) {
        (None, Some(s)) => {
            check_sensor(s, limits)?;
            Some(s)
        }
        _ => None,
    };
    let mut readings = Vec::with_capacity(objects.len());
    for (index, mut obj) in objects.into_iter().enumerate() {
        match sample_from_object(sub, topic_sensor, &mut obj, index, now_ms, limits) {
            Ok(r) => readings.push(r),
            Err(e) => errors.push(e),
        }
    }
    Ok(readings)
}

fn sample_from_object(
    sub: &Subscription,
    topic_sensor: Option<&str>,
    obj: &mut serde_json::Map<String, serde_json::Value>,
    index: usize,
    now_ms: i64,
    limits: &Limits,
) -> Result<Reading, DecodeError> {
    if obj.len() > limits.max_fields_per_sample + 2 {
        return Err(DecodeError::OverLimit {
            cause: "too_many_fields",
            message: format!(
                "sample {index}: {} fields exceed limits.max_fields_per_sample ({})",
                obj.len(),
                limits.max_fields_per_sample
            ),
        });
    }
    let sensor = match &sub.sensor_field {
        Some(f) => match obj.remove(f) {
            Some(serde_json::Value::String(s)) => {
                check_sensor(&s, limits)?;
                s
            }
            Some(serde_json::Value::Number(n)) => {
                let s = n.to_string();
                check_sensor(&s, limits)?;
                s
            }
            Some(_) => {
                return Err(DecodeError::BadSensor(format!(
                    "sample {index}: field {f:?} is not a string"
                )))
            }
            None => {
                return Err(DecodeError::BadSensor(format!(
                    "sample {index}: field {f:?} is missing"
                )))
            }
        },
        None => topic_sensor.unwrap_or_default().to_string(),
    };
    let ts_ms = match obj.remove(&sub.timestamp_field) {
        None => now_ms,
        Some(v) => {
            parse_timestamp(&v).map_err(|message| DecodeError::BadTimestamp { index, message })?
        }
    };
    let mut fields = Vec::with_capacity(obj.len());
    for (name, value) in std::mem::take(obj) {
        if name.len() > limits.max_field_name_length {
            return Err(DecodeError::OverLimit {
                cause: "field_name_too_long",
                message: format!(
                    "sample {index}: a field name of {} bytes exceeds limits.max_field_name_length ({})",
                    name.len(),
                    limits.max_field_name_length
                ),
            });
        }
        let value = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::Bool(b) => FieldValue::Bool(b),
            serde_json::Value::String(s) if s.len() > limits.max_string_length => {
                return Err(DecodeError::OverLimit {
                    cause: "string_too_long",
                    message: format!(
                        "sample {index}: field {:?} has {} bytes, over limits.max_string_length ({})",
                        truncate(&name, 64),
                        s.len(),
                        limits.max_string_length
                    ),
                })
            }
            serde_json::Value::String(s) => FieldValue::Str(s),
            serde_json::Value::Number(n) => match n.as_f64() {
                Some(f) if f.is_finite() => FieldValue::Num(f),
                _ => {
                    return Err(DecodeError::BadField {
                        index,
                        message: format!("field {name:?}: number out of range"),
                    })
                }
            },
            serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                return Err(DecodeError::BadField {
                    index,
                    message: format!("field {name:?}: nested objects and arrays are not supported"),
                })
            }
        };
        check_field_name(&name).map_err(|e| DecodeError::BadField {
            index,
            message: e.to_string(),
        })?;
        if name == "ts" {
            return Err(DecodeError::BadField {
                index,
                message: "field \"ts\" is reserved for the sample timestamp".into(),
            });
        }
        fields.push((name, value));
    }
    if fields.len() > limits.max_fields_per_sample {
        return Err(DecodeError::OverLimit {
            cause: "too_many_fields",
            message: format!(
                "sample {index}: {} fields exceed limits.max_fields_per_sample ({})",
                fields.len(),
                limits.max_fields_per_sample
            ),
        });
    }
    Ok(Reading {
        sensor,
        ts_ms,
        fields,
    })
}

/// RFC 3339 text, or an epoch number whose unit is told by its magnitude:
/// below 1e11 seconds, below 1e14 milliseconds, below 1e17 microseconds,
/// else nanoseconds. Integers are truncated to the millisecond (floor),
/// fractional numbers rounded to the nearest millisecond.
pub fn parse_timestamp(v: &serde_json::Value) -> Result<i64, String> {
    match v {
        serde_json::Value::String(s) => chrono::DateTime::parse_from_rfc3339(s.trim())
            .map(|t| t.timestamp_millis())
            .map_err(|e| format!("{:?} is not RFC 3339: {e}", truncate(s, 64))),
        serde_json::Value::Number(n) => {
            // Integers exactly (nanoseconds exceed f64 precision), floats rounded.
            if let Some(i) = n.as_i64() {
                let ms = match i.unsigned_abs() {
                    a if a < 100_000_000_000 => i.checked_mul(1000),
                    a if a < 100_000_000_000_000 => Some(i),
                    a if a < 100_000_000_000_000_000 => Some(i.div_euclid(1000)),
                    _ => Some(i.div_euclid(1_000_000)),
                };
                return ms
                    .filter(|ms| ms.unsigned_abs() <= 8_640_000_000_000_000)
                    .ok_or_else(|| format!("{n} is outside the representable date range"));
            }
            let x = n.as_f64().ok_or("not a number")?;
            if !x.is_finite() {
                return Err("not a finite number".into());
            }
            let ms = match x.abs() {
                a if a < 1e11 => x * 1e3,
                a if a < 1e14 => x,
                a if a < 1e17 => x / 1e3,
                _ => x / 1e6,
            };
            if ms.abs() > 8.64e15 {
                return Err(format!("{n} is outside the representable date range"));
            }
            Ok(ms.round() as i64)
        }
        other => Err(format!(
            "expected RFC 3339 text or an epoch number, got {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_787_234_400_000; // 2026-08-20T14:00:00Z

    #[test]
    fn epoch_units_are_told_by_magnitude() {
        let secs = NOW / 1000;
        for (v, want) in [
            (serde_json::json!(secs), NOW),
            (serde_json::json!(secs as f64 + 0.25), NOW + 250),
            (serde_json::json!(NOW), NOW),
            (serde_json::json!(NOW * 1000 + 999), NOW),
            (serde_json::json!(NOW * 1_000_000 + 1), NOW),
        ] {
            assert_eq!(parse_timestamp(&v), Ok(want), "{v}");
        }
        assert!(parse_timestamp(&serde_json::json!("yesterday")).is_err());
        assert!(parse_timestamp(&serde_json::json!(true)).is_err());
        assert_eq!(
            parse_timestamp(&serde_json::json!("2026-08-20T16:00:00+02:00")),
            Ok(NOW)
        );
    }
}
