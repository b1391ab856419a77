//! `[[subscription]]`: a topic pattern, its payload format and where a
//! reading's sensor and time are.

use super::*;
use crate::decode::{Arrays, Path, Selection};
use serde::Deserialize;

/// Why the keys that place a sensor, field or time do not apply to
/// Sparkplug B.
const SPARKPLUG_OWN: &str = "format = \"sparkplug_b\" (sensor ids, field names and times come from the Sparkplug topic and payload)";

impl Validator {
    pub(super) fn subscription(&mut self, s: RawSubscription, path: &str) -> Option<Subscription> {
        let pattern = match TopicPattern::parse(&s.topic) {
            Ok(p) => Some(p),
            Err(e) => {
                self.err(format!("{path}.topic"), e);
                None
            }
        };
        let format = match s
            .format
            .as_deref()
            .unwrap_or("json")
            .parse::<PayloadFormat>()
        {
            Ok(f) => f,
            Err(e) => {
                self.err(format!("{path}.format"), e);
                PayloadFormat::Json
            }
        };
        let timestamp_field_set = s.timestamp_field.is_some();
        let single = matches!(format, PayloadFormat::Number | PayloadFormat::Value);
        let structured = matches!(
            format,
            PayloadFormat::Json | PayloadFormat::Cbor | PayloadFormat::MsgPack
        );
        if s.sensor_field.is_some() && !structured {
            self.err(
                format!("{path}.sensor_field"),
                "needs format = \"json\", \"cbor\" or \"msgpack\"",
            );
        }
        let by_messages = matches!(
            format,
            PayloadFormat::Senml | PayloadFormat::SenmlCbor | PayloadFormat::OpcUa
        );
        if by_messages {
            self.not_applicable(
                path,
                &[
                    ("field", s.field.is_some()),
                    ("timestamp_field", timestamp_field_set),
                    ("timezone", s.timezone.is_some()),
                ],
                &format!("format = \"{format}\" (field names and times come from the messages)"),
            );
        }
        let selection = self.selection(&s, path, structured);
        if let Some(t) = &s.sensor_template {
            if format != PayloadFormat::LineProtocol {
                self.err(
                    format!("{path}.sensor_template"),
                    "needs format = \"line_protocol\"",
                );
            } else if let Err(e) = crate::decode::line::check_template(t) {
                self.err(format!("{path}.sensor_template"), e);
            }
        }
        let timezone = s.timezone.as_deref().and_then(|tz| match tz.parse::<chrono_tz::Tz>() {
            Ok(tz) => Some(tz),
            Err(_) => {
                self.err(
                    format!("{path}.timezone"),
                    format!("{tz:?} is not a zone of the IANA time zone database (e.g. \"Europe/Berlin\", \"UTC\")"),
                );
                None
            }
        });
        if let Some(f) = &s.field {
            if let Err(e) = crate::decode::check_field_name(f) {
                self.err(format!("{path}.field"), e.to_string());
            }
        }
        let qos = self.int_in(&format!("{path}.qos"), s.qos, 1, 0, 2) as u8;
        let retained = self.retained(&s, path);
        let sparkplug = format == PayloadFormat::SparkplugB;
        let rebirth_min_interval = self.rebirth(&s, path, sparkplug);
        let pattern = pattern?;
        self.sensor_placed(&s, path, &pattern, sparkplug, by_messages);
        let from_properties = self.properties(&s, path, sparkplug);
        if single && !pattern.has_field() && s.field.is_none() {
            self.err(
                format!("{path}.field"),
                format!("format = \"{format}\" needs a {{field}} placeholder in the topic or a field name here"),
            );
        }
        let thinning = (s.thinning.into_iter().flatten())
            .filter_map(|(field, t)| {
                let rule = self.thinning(t, &format!("{path}.thinning.{field}"))?;
                Some((field, rule))
            })
            .collect();
        Some(Subscription {
            pattern,
            format,
            selection,
            timezone,
            sensor_template: s.sensor_template,
            field: s.field,
            qos,
            rebirth_min_interval,
            from_properties,
            retained,
            thinning,
        })
    }

    /// `retained`: what a retained message is taken for (`"changed"`, the
    /// default; `"store"`; `"skip"`).
    fn retained(&mut self, s: &RawSubscription, path: &str) -> crate::decode::Retained {
        match s.retained.as_deref().map(crate::decode::Retained::parse) {
            None => crate::decode::Retained::default(),
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                self.err(format!("{path}.retained"), e);
                crate::decode::Retained::default()
            }
        }
    }

    /// `request_rebirth` (Sparkplug B only) and its `rebirth_min_interval`.
    fn rebirth(
        &mut self,
        s: &RawSubscription,
        path: &str,
        sparkplug: bool,
    ) -> Option<std::time::Duration> {
        let rebirth_min_interval = self.positive_duration(
            &format!("{path}.rebirth_min_interval"),
            s.rebirth_min_interval.as_deref(),
            "1m",
        );
        match s.request_rebirth {
            Some(true) if sparkplug => Some(rebirth_min_interval),
            Some(true) => {
                self.err(
                    format!("{path}.request_rebirth"),
                    "needs format = \"sparkplug_b\"",
                );
                None
            }
            _ => None,
        }
    }

    /// Whether the subscription says where a reading's sensor is (a
    /// Sparkplug B one: that the keys placing it are not set).
    fn sensor_placed(
        &mut self,
        s: &RawSubscription,
        path: &str,
        pattern: &TopicPattern,
        sparkplug: bool,
        by_messages: bool,
    ) {
        if sparkplug {
            self.not_applicable(
                path,
                &[
                    ("sensor_field", s.sensor_field.is_some()),
                    ("field", s.field.is_some()),
                    ("timestamp_field", s.timestamp_field.is_some()),
                    ("timezone", s.timezone.is_some()),
                ],
                SPARKPLUG_OWN,
            );
            if pattern.has_sensor() || pattern.has_field() || !s.topic.starts_with("spBv1.0/") {
                self.err(
                format!("{path}.topic"),
                "format = \"sparkplug_b\" needs an MQTT filter in the Sparkplug namespace without placeholders, e.g. \"spBv1.0/#\" or \"spBv1.0/Plant1/#\"",
            );
            }
        } else if s.sensor_field.is_none()
            && s.sensor_property.is_none()
            && !pattern.has_sensor()
            && !by_messages
            && s.sensor_template.is_none()
        {
            self.err(
            format!("{path}.topic"),
            "needs a {sensor} placeholder, or set sensor_field to read the sensor id from the payload (or sensor_property, from an MQTT 5 user property)",
        );
        }
    }

    /// What is read from an MQTT 5 message's properties.
    fn properties(
        &mut self,
        s: &RawSubscription,
        path: &str,
        sparkplug: bool,
    ) -> crate::decode::FromProperties {
        let from_properties = crate::decode::FromProperties {
            timestamp: s.timestamp_property.clone(),
            sensor: s.sensor_property.clone(),
            content_type: s.format_from_content_type.unwrap_or(false),
        };
        if sparkplug {
            self.not_applicable(
                path,
                &[
                    ("timestamp_property", from_properties.timestamp.is_some()),
                    ("sensor_property", from_properties.sensor.is_some()),
                    ("format_from_content_type", from_properties.content_type),
                ],
                SPARKPLUG_OWN,
            );
        }
        for (key, name) in [
            ("timestamp_property", &from_properties.timestamp),
            ("sensor_property", &from_properties.sensor),
        ] {
            if name.as_deref().is_some_and(str::is_empty) {
                self.err(format!("{path}.{key}"), "must not be empty");
            }
        }
        from_properties
    }

    /// One field's thinning rule: `kind`, its bound (`deviation`, or
    /// `deviation_percent` of `span`), `max_interval` (default 10 min)
    /// and, for a deadband, `min_interval`.
    fn thinning(&mut self, t: RawThinning, path: &str) -> Option<crate::thin::Rule> {
        use crate::thin::{Rule, DEADBAND, SWINGING_DOOR};
        let max_interval = self.positive_duration(
            &format!("{path}.max_interval"),
            t.max_interval.as_deref(),
            "10m",
        );
        let min_interval = self.duration(
            &format!("{path}.min_interval"),
            t.min_interval.as_deref(),
            "0s",
        );
        let bound = match (t.deviation, t.deviation_percent, t.span.as_deref()) {
            (Some(d), None, None) => Some(d),
            (None, Some(pct), Some(&[lo, hi])) if hi > lo && (hi - lo).is_finite() => {
                Some(pct / 100.0 * (hi - lo))
            }
            (None, Some(_), _) => {
                self.err(
                    format!("{path}.span"),
                    "deviation_percent needs span = [low, high], the field's range (high above low)",
                );
                None
            }
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                self.err(
                    format!("{path}.deviation"),
                    "give deviation (in the field's unit) or deviation_percent and span, not both",
                );
                None
            }
            (None, None, _) => {
                self.err(
                    format!("{path}.deviation"),
                    "missing: the error bound, in the field's unit (or deviation_percent and span)",
                );
                None
            }
        };
        let bound = bound.filter(|b| {
            let ok = b.is_finite() && *b >= 0.0;
            if !ok {
                self.err(
                    format!("{path}.deviation"),
                    "must be a number of at least 0",
                );
            }
            ok
        })?;
        let ms = |d: std::time::Duration| d.as_millis().min(i64::MAX as u128) as i64;
        match t.kind.as_str() {
            DEADBAND => Some(Rule::Deadband {
                band: bound,
                max_interval_ms: ms(max_interval),
                min_interval_ms: ms(min_interval),
            }),
            SWINGING_DOOR => {
                if t.min_interval.is_some() {
                    self.err(
                        format!("{path}.min_interval"),
                        "applies to kind = \"deadband\" only (a swinging door keeps its bound)",
                    );
                }
                Some(Rule::SwingingDoor {
                    deviation: bound,
                    max_interval_ms: ms(max_interval),
                })
            }
            other => {
                self.err(
                    format!("{path}.kind"),
                    format!("{other:?} is not a thinning rule: \"deadband\" or \"swinging_door\""),
                );
                None
            }
        }
    }

    /// An error for each of `keys` that is set: it does not apply to `what`.
    fn not_applicable(&mut self, path: &str, keys: &[(&str, bool)], what: &str) {
        for (key, set) in keys {
            if *set {
                self.err(format!("{path}.{key}"), format!("does not apply to {what}"));
            }
        }
    }

    /// The subscription's choice of fields (`root`, `include`, `exclude`,
    /// `rename`, `flatten`, `arrays`, `timestamp_field`, `sensor_field`);
    /// the choosing keys apply to `format = "json"` only.
    fn selection(&mut self, s: &RawSubscription, path: &str, structured: bool) -> Selection {
        let mut sel = Selection::default();
        let pointer = |v: &mut Self, key: &str, text: &str, wildcards: bool| {
            Path::parse(text, wildcards)
                .map_err(|e| v.err(format!("{path}.{key}"), e))
                .ok()
        };
        if let Some(text) = &s.timestamp_field {
            match Path::key_or_pointer(text) {
                Ok(p) => sel.timestamp = p,
                Err(e) => self.err(format!("{path}.timestamp_field"), e),
            }
        }
        if let Some(text) = &s.sensor_field {
            match Path::key_or_pointer(text) {
                Ok(p) => sel.sensor = Some(p),
                Err(e) => self.err(format!("{path}.sensor_field"), e),
            }
        }
        let choosing = [
            ("root", s.root.is_some()),
            ("include", s.include.is_some()),
            ("exclude", s.exclude.is_some()),
            ("rename", s.rename.is_some()),
            ("flatten", s.flatten.is_some()),
            ("arrays", s.arrays.is_some()),
            ("units", s.units.is_some()),
        ];
        if !structured {
            for (key, set) in choosing {
                if set {
                    self.err(
                        format!("{path}.{key}"),
                        "needs format = \"json\", \"cbor\" or \"msgpack\"",
                    );
                }
            }
            return sel;
        }
        if let Some(root) = &s.root {
            if let Some(p) = pointer(self, "root", root, false) {
                sel.root = p;
            }
        }
        for (key, list, into) in [
            ("include", &s.include, &mut sel.include),
            ("exclude", &s.exclude, &mut sel.exclude),
        ] {
            for text in list.iter().flatten() {
                if text.is_empty() {
                    self.err(
                        format!("{path}.{key}"),
                        "\"\" would name the whole sample; leave the key out instead",
                    );
                } else if let Some(p) = pointer(self, key, text, true) {
                    into.push(p);
                }
            }
        }
        for (from, to) in s.rename.iter().flatten() {
            let key = format!("rename.{from:?}");
            if let Err(e) = crate::decode::check_field_name(to) {
                self.err(format!("{path}.{key}"), e.to_string());
            }
            if let Some(p) = pointer(self, &key, from, false) {
                sel.rename.push((p, to.clone()));
            }
        }
        for (from, fields) in s.units.iter().flatten() {
            let key = format!("units.{from:?}");
            let Some(from) = pointer(self, &key, from, false) else {
                continue;
            };
            let fields: Vec<Path> = fields
                .iter()
                .filter_map(|f| pointer(self, &key, f, true))
                .collect();
            sel.units.push((from, fields));
        }
        if let Some(sep) = &s.flatten {
            if sep.is_empty() || sep.contains('\0') || sep.len() > 8 {
                self.err(
                    format!("{path}.flatten"),
                    "must be 1 to 8 bytes, without NUL (e.g. \".\" or \"_\")",
                );
            } else {
                sel.separator = sep.clone();
            }
        }
        match s.arrays.as_deref() {
            None | Some("index") => {}
            Some("drop") => sel.arrays = Arrays::Drop,
            Some(other) => self.err(
                format!("{path}.arrays"),
                crate::decode::not_one_of(&["index", "drop"], other),
            ),
        }
        sel
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSubscription {
    pub topic: String,
    pub format: Option<String>,
    pub timestamp_field: Option<String>,
    pub sensor_field: Option<String>,
    pub field: Option<String>,
    pub qos: Option<i64>,
    pub request_rebirth: Option<bool>,
    pub rebirth_min_interval: Option<String>,
    pub timestamp_property: Option<String>,
    pub sensor_property: Option<String>,
    pub format_from_content_type: Option<bool>,
    pub timezone: Option<String>,
    pub sensor_template: Option<String>,
    pub root: Option<String>,
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
    pub rename: Option<std::collections::BTreeMap<String, String>>,
    pub flatten: Option<String>,
    pub arrays: Option<String>,
    pub units: Option<std::collections::BTreeMap<String, Vec<String>>>,
    pub retained: Option<String>,
    pub thinning: Option<std::collections::BTreeMap<String, RawThinning>>,
}

/// `[subscription.thinning.<field>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawThinning {
    pub kind: String,
    pub deviation: Option<f64>,
    pub deviation_percent: Option<f64>,
    pub span: Option<Vec<f64>>,
    pub max_interval: Option<String>,
    pub min_interval: Option<String>,
}
