//! `[[subscription]]`: a topic pattern, its payload format and where a
//! reading's sensor and time are.

use super::*;

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
        let timestamp_field = s.timestamp_field.unwrap_or_else(|| "ts".into());
        if let Err(e) = crate::decode::check_field_name(&timestamp_field) {
            self.err(format!("{path}.timestamp_field"), e.to_string());
        }
        if let Some(f) = &s.sensor_field {
            if let Err(e) = crate::decode::check_field_name(f) {
                self.err(format!("{path}.sensor_field"), e.to_string());
            }
            if format == PayloadFormat::Number {
                self.err(format!("{path}.sensor_field"), "needs format = \"json\"");
            }
        }
        if let Some(f) = &s.field {
            if let Err(e) = crate::decode::check_field_name(f) {
                self.err(format!("{path}.field"), e.to_string());
            }
        }
        let qos = self.int_in(&format!("{path}.qos"), s.qos, 1, 0, 2) as u8;
        let rebirth_min_interval = self.positive_duration(
            &format!("{path}.rebirth_min_interval"),
            s.rebirth_min_interval.as_deref(),
            "1m",
        );
        let sparkplug = format == PayloadFormat::SparkplugB;
        let rebirth_min_interval = match s.request_rebirth {
            Some(true) if sparkplug => Some(rebirth_min_interval),
            Some(true) => {
                self.err(
                    format!("{path}.request_rebirth"),
                    "needs format = \"sparkplug_b\"",
                );
                None
            }
            _ => None,
        };
        let pattern = pattern?;
        if sparkplug {
            for (key, set) in [
                ("sensor_field", s.sensor_field.is_some()),
                ("field", s.field.is_some()),
                ("timestamp_field", timestamp_field_set),
            ] {
                if set {
                    self.err(
                        format!("{path}.{key}"),
                        "does not apply to format = \"sparkplug_b\" (sensor ids, field names and times come from the Sparkplug topic and payload)",
                    );
                }
            }
            if pattern.has_sensor() || pattern.has_field() || !s.topic.starts_with("spBv1.0/") {
                self.err(
                    format!("{path}.topic"),
                    "format = \"sparkplug_b\" needs an MQTT filter in the Sparkplug namespace without placeholders, e.g. \"spBv1.0/#\" or \"spBv1.0/Plant1/#\"",
                );
            }
        } else if s.sensor_field.is_none() && s.sensor_property.is_none() && !pattern.has_sensor() {
            self.err(
                format!("{path}.topic"),
                "needs a {sensor} placeholder, or set sensor_field to read the sensor id from the payload (or sensor_property, from an MQTT 5 user property)",
            );
        }
        let from_properties = crate::decode::FromProperties {
            timestamp: s.timestamp_property,
            sensor: s.sensor_property,
            content_type: s.format_from_content_type.unwrap_or(false),
        };
        for (key, set) in [
            ("timestamp_property", from_properties.timestamp.is_some()),
            ("sensor_property", from_properties.sensor.is_some()),
            ("format_from_content_type", from_properties.content_type),
        ] {
            if set && sparkplug {
                self.err(
                    format!("{path}.{key}"),
                    "does not apply to format = \"sparkplug_b\" (sensor ids, field names and times come from the Sparkplug topic and payload)",
                );
            }
        }
        for (key, name) in [
            ("timestamp_property", &from_properties.timestamp),
            ("sensor_property", &from_properties.sensor),
        ] {
            if name.as_deref().is_some_and(str::is_empty) {
                self.err(format!("{path}.{key}"), "must not be empty");
            }
        }
        if format == PayloadFormat::Number && !pattern.has_field() && s.field.is_none() {
            self.err(
                format!("{path}.field"),
                "format = \"number\" needs a {field} placeholder in the topic or a field name here",
            );
        }
        Some(Subscription {
            pattern,
            format,
            timestamp_field,
            sensor_field: s.sensor_field,
            field: s.field,
            qos,
            rebirth_min_interval,
            from_properties,
        })
    }
}
