//! Topic patterns: `sensors/{sensor}/telemetry`, `plant/{sensor}/{field}`,
//! `site/+/{sensor}/#`. Each placeholder is one topic level and becomes `+`
//! in the MQTT subscription filter.

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
        for placeholder in [Level::Sensor, Level::Field] {
            if levels.iter().filter(|l| **l == placeholder).count() > 1 {
                return Err(format!(
                    "{} appears more than once",
                    if placeholder == Level::Sensor {
                        "{sensor}"
                    } else {
                        "{field}"
                    }
                ));
            }
        }
        Ok(TopicPattern {
            levels,
            multi,
            text: text.to_string(),
        })
    }

    pub fn has_sensor(&self) -> bool {
        self.levels.contains(&Level::Sensor)
    }

    pub fn has_field(&self) -> bool {
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
        let mut parts = topic.split('/');
        for level in &self.levels {
            let part = parts.next()?;
            match level {
                Level::Literal(s) if s != part => return None,
                Level::Literal(_) | Level::Any => {}
                Level::Sensor => out.sensor = Some(part),
                Level::Field => out.field = Some(part),
            }
        }
        if parts.next().is_some() && !self.multi {
            return None;
        }
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
    fn bad_patterns_are_rejected() {
        for bad in [
            "",
            "a/#/b",
            "a/x{sensor}",
            "a/{sensor}/{sensor}",
            "a/b+",
            "a/{field}/{field}",
        ] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
