//! `format = "line_protocol"`: InfluxDB line protocol, as Telegraf and
//! InfluxDB clients write it (`weather,site=north,host=ws1
//! temp=21.5,hum=45i,ok=true,note="x" 1796291070000000000`), one sample
//! per line (parsed by influxdata's `influxdb-line-protocol` crate).
//!
//! - The sensor is `sensor_template` filled from the line
//!   (`"{measurement}"`, `"{site}-{host}"`: `{measurement}` and tag names),
//!   else the topic's `{sensor}`. A line without a tag its template names
//!   is refused (`bad_sensor`).
//! - Fields are the line's fields (integers and floats as numbers, strings,
//!   booleans), and its tags that the template does not use, as text.
//! - The timestamp is an epoch number told by magnitude as JSON's is (the
//!   protocol's default precision, nanoseconds, included); without one,
//!   the message's time.

use super::{check_sensor, DecodeError, Decoded, Dropped, FieldValue, Message, Reading};
use influxdb_line_protocol::{parse_lines, FieldValue as Lp, ParsedLine};

/// The samples of one message of lines.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let limits = msg.limits;
    let text = std::str::from_utf8(msg.payload)
        .map_err(|_| DecodeError::BadPayload("not UTF-8 text".into()))?;
    let template = msg.sub.sensor_template.as_deref();
    let mut readings = Vec::new();
    let mut lines = 0;
    for (index, line) in parse_lines(text).enumerate() {
        lines += 1;
        if lines > limits.max_samples_per_message {
            let n = lines + parse_lines(text).skip(lines).count();
            return Err(super::too_many_samples(n, limits));
        }
        let line = match line {
            Ok(line) => line,
            Err(e) => {
                out.errors.push(DecodeError::BadField {
                    index,
                    message: format!("line {}: not line protocol: {e}", index + 1),
                });
                continue;
            }
        };
        match sample(msg, template, &line, index, &mut out.dropped) {
            Ok(r) => readings.push(r),
            Err(e) => out.errors.push(e),
        }
    }
    if lines == 0 {
        return Err(DecodeError::BadPayload("no lines".into()));
    }
    Ok(readings)
}

fn sample(
    msg: &Message<'_>,
    template: Option<&str>,
    line: &ParsedLine<'_>,
    index: usize,
    dropped: &mut Vec<Dropped>,
) -> Result<Reading, DecodeError> {
    let limits = msg.limits;
    let tags: Vec<(&str, &str)> = line
        .series
        .tag_set
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut used: Vec<&str> = Vec::new();
    let sensor = match template {
        Some(t) => fill(t, line.series.measurement.as_str(), &tags, &mut used)
            .map_err(|m| DecodeError::BadSensor(format!("line {}: {m}", index + 1)))?,
        None => msg.matched.sensor.unwrap_or_default().to_string(),
    };
    check_sensor(&sensor, limits)?;
    let ts_ms = match line.timestamp {
        None => msg.time_ms,
        Some(ts) => super::json::number_timestamp(&ts.into())
            .map_err(|message| DecodeError::BadTimestamp { index, message })?,
    };
    let mut fields = Vec::with_capacity(line.field_set.len() + tags.len());
    let unused = tags
        .iter()
        .filter(|(k, _)| !used.contains(k))
        .map(|(k, v)| (*k, FieldValue::Str(v.to_string())));
    let values = line.field_set.iter().map(|(k, v)| {
        let v = match v {
            Lp::I64(i) => FieldValue::Num(*i as f64),
            Lp::U64(u) => FieldValue::Num(*u as f64),
            Lp::F64(x) => FieldValue::Num(*x),
            Lp::String(s) => FieldValue::Str(s.to_string()),
            Lp::Boolean(b) => FieldValue::Bool(*b),
        };
        (k.as_str(), v)
    });
    for (name, value) in unused.chain(values) {
        match super::take_field(name, value, limits) {
            Ok(field) => fields.push(field),
            Err(why) => dropped.push(Dropped::of(index, name, why)),
        }
    }
    if fields.len() > limits.max_fields_per_sample {
        return Err(super::too_many_fields(index, fields.len(), limits));
    }
    Ok(Reading {
        sensor,
        ts_ms,
        fields,
        index,
        units: Vec::new(),
    })
}

/// A sensor template filled from a line; `used` gets the tags it took.
fn fill<'t>(
    template: &str,
    measurement: &str,
    tags: &[(&'t str, &str)],
    used: &mut Vec<&'t str>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or("an unclosed { in sensor_template")?
            + open;
        let name = &rest[open + 1..close];
        if name == "measurement" {
            out.push_str(measurement);
        } else {
            let (k, v) = tags
                .iter()
                .find(|(k, _)| *k == name)
                .ok_or_else(|| format!("no tag {name:?} for sensor_template"))?;
            out.push_str(v);
            used.push(k);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks a `sensor_template`: its placeholders are whole (`{name}`).
pub(crate) fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err("a } without its {".into());
        }
        let close = rest[open..].find('}').ok_or("a { without its }")? + open;
        if close == open + 1 || rest[open + 1..close].contains('{') {
            return Err("placeholders are {measurement} or {<tag name>}".into());
        }
        rest = &rest[close + 1..];
    }
    if template.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(())
}
