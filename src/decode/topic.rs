//! Topic patterns: `sensors/{sensor}/telemetry`, `plant/{sensor}/{field}`,
//! `site/+/{sensor}/#`, `homie/{sensor}/{field}/{field}`. Each placeholder
//! is one topic level and becomes `+` in the MQTT subscription filter;
//! `{field}` may fill several levels next to each other, and the field name
//! is those levels with their `/` (`thermostat/temperature`).
//!
//! A level that begins with `$` is never matched by a placeholder or a
//! wildcard, only by a literal: such levels are metadata, not readings
//! (Homie's `$name`, `$unit`, `$state`; MQTT keeps a first level with `$`
//! for the broker's own topics; and a MongoDB field name cannot begin with
//! `$`). A message on such a topic is skipped, not refused (see
//! [`super::Decoder::decode_with`]).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    Literal(String),
    Sensor,
    Field,
    /// `+`: any one level, not captured.
    Any,
}

/// A parsed topic pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPattern {
    levels: Vec<Level>,
    /// Ends in `#`: matches any number (including zero) of further levels.
    multi: bool,
    text: String,
}

/// What a topic matched: the captured sensor id and field name, if the
/// pattern has those placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicMatch<'a> {
    pub sensor: Option<&'a str>,
    pub field: Option<&'a str>,
}

impl TopicPattern {
    /// Parses a pattern. Placeholders must fill a whole level; `#` only last.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if text.contains('\0') {
            return Err("must not contain NUL".into());
        }
        let parts: Vec<&str> = text.split('/').collect();
        let mut levels = Vec::with_capacity(parts.len());
        let mut multi = false;
        for (i, part) in parts.iter().enumerate() {
            let level = match *part {
                "{sensor}" => Level::Sensor,
                "{field}" => Level::Field,
                "+" => Level::Any,
                "#" if i == parts.len() - 1 => {
                    multi = true;
                    continue;
                }
                "#" => return Err("`#` is only allowed as the last level".into()),
                p if p.contains(['{', '}', '+', '#']) => {
                    return Err(format!(
                        "level {p:?}: placeholders {{sensor}} and {{field}} and the wildcards + and # must fill a whole level"
                    ))
                }
                p => Level::Literal(p.to_string()),
            };
            levels.push(level);
        }
        if levels.iter().filter(|l| **l == Level::Sensor).count() > 1 {
            return Err("{sensor} appears more than once".into());
        }
        let fields: Vec<usize> = (0..levels.len())
            .filter(|&i| levels[i] == Level::Field)
            .collect();
        if fields.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(
                "{field} levels must be next to each other (the field name is the levels they fill, with their `/`)"
                    .into(),
            );
        }
        Ok(TopicPattern {
            levels,
            multi,
            text: text.to_string(),
        })
    }

    pub(crate) fn has_sensor(&self) -> bool {
        self.levels.contains(&Level::Sensor)
    }

    pub(crate) fn has_field(&self) -> bool {
        self.levels.contains(&Level::Field)
    }

    /// The MQTT subscription filter: placeholders become `+`.
    pub fn filter(&self) -> String {
        let mut parts: Vec<&str> = self
            .levels
            .iter()
            .map(|l| match l {
                Level::Literal(s) => s.as_str(),
                _ => "+",
            })
            .collect();
        if self.multi {
            parts.push("#");
        }
        parts.join("/")
    }

    /// Matches a concrete topic, returning the captures.
    pub fn matches<'a>(&self, topic: &'a str) -> Option<TopicMatch<'a>> {
        let mut out = TopicMatch {
            sensor: None,
            field: None,
        };
        // Where the field's levels start and end in `topic`.
        let mut field: Option<(usize, usize)> = None;
        let mut parts = topic.split('/');
        for level in &self.levels {
            let part = parts.next()?;
            match level {
                Level::Literal(s) if s != part => return None,
                Level::Literal(_) => {}
                _ if part.starts_with('$') => return None,
                Level::Any => {}
                Level::Sensor => out.sensor = Some(part),
                Level::Field => {
                    let start = part.as_ptr() as usize - topic.as_ptr() as usize;
                    field = Some((field.map_or(start, |f| f.0), start + part.len()));
                }
            }
        }
        match parts.next() {
            None => {}
            Some(_) if !self.multi => return None,
            Some(next) if next.starts_with('$') || parts.any(|p| p.starts_with('$')) => {
                return None
            }
            Some(_) => {}
        }
        out.field = field.map(|(start, end)| &topic[start..end]);
        Some(out)
    }
}

impl fmt::Display for TopicPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_plus_in_the_filter() {
        let p = TopicPattern::parse("plant/{sensor}/{field}").unwrap();
        assert_eq!(p.filter(), "plant/+/+");
        let p = TopicPattern::parse("site/+/{sensor}/#").unwrap();
        assert_eq!(p.filter(), "site/+/+/#");
    }

    #[test]
    fn matching_captures_sensor_and_field() {
        let p = TopicPattern::parse("plant/{sensor}/{field}").unwrap();
        let m = p.matches("plant/s-1/temp").unwrap();
        assert_eq!(m.sensor, Some("s-1"));
        assert_eq!(m.field, Some("temp"));
        assert!(p.matches("plant/s-1").is_none());
        assert!(p.matches("plant/s-1/temp/x").is_none());
        assert!(p.matches("other/s-1/temp").is_none());
    }

    #[test]
    fn trailing_hash_matches_any_depth() {
        let p = TopicPattern::parse("site/{sensor}/#").unwrap();
        assert_eq!(p.matches("site/a").unwrap().sensor, Some("a"));
        assert_eq!(p.matches("site/a/b/c").unwrap().sensor, Some("a"));
        assert!(p.matches("site").is_none());
    }

    #[test]
    fn field_levels_next_to_each_other_make_one_name() {
        let p = TopicPattern::parse("homie/{sensor}/{field}/{field}").unwrap();
        assert_eq!(p.filter(), "homie/+/+/+");
        let m = p.matches("homie/kitchen/thermostat/temperature").unwrap();
        assert_eq!(m.sensor, Some("kitchen"));
        assert_eq!(m.field, Some("thermostat/temperature"));
        assert!(p.matches("homie/kitchen/thermostat").is_none());
        assert!(TopicPattern::parse("a/{field}/b/{field}").is_err());
    }

    #[test]
    fn dollar_levels_are_matched_only_by_literals() {
        let p = TopicPattern::parse("homie/{sensor}/{field}/{field}").unwrap();
        assert!(p.matches("homie/kitchen/thermostat/$name").is_none());
        assert!(p.matches("homie/kitchen/$fw/name").is_none());
        assert!(p.matches("homie/$broadcast/alert/x").is_none());
        let p = TopicPattern::parse("site/+/{sensor}/#").unwrap();
        assert!(p.matches("site/$SYS/a").is_none());
        assert!(p.matches("site/x/a/$meta").is_none());
        assert_eq!(p.matches("site/x/a/b").unwrap().sensor, Some("a"));
        let p = TopicPattern::parse("homie/{sensor}/$state").unwrap();
        assert_eq!(
            p.matches("homie/kitchen/$state").unwrap().sensor,
            Some("kitchen")
        );
    }

    #[test]
    fn bad_patterns_are_rejected() {
        for bad in [
            "",
            "a/#/b",
            "a/x{sensor}",
            "a/{sensor}/{sensor}",
            "a/b+",
            "a/{field}/+/{field}",
        ] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
