//! Which parts of a structured payload (a JSON object, a CBOR or
//! MessagePack map) become a sample's fields, and under which names: the
//! subscription's `root`, `include`, `exclude`, `rename`, `flatten` and
//! `arrays`, and the paths of its timestamp and sensor id.
//!
//! A path is a JSON Pointer (RFC 6901): `/params/temperature:0/tC`, with
//! `~1` for a `/` in a key and `~0` for a `~`; an array element is its
//! index (`/color/0`). In `include` and `exclude` a segment that is exactly
//! `*` matches any one key or index. A path names a value and everything
//! below it. `timestamp_field` and `sensor_field` may be a plain key
//! (`Time`, the same as `/Time`) or a pointer; they and every other path
//! are taken from `root` (the object there is the sample; the rest of the
//! payload is not read).
//!
//! Nested objects become fields named by their path from `root`, the keys
//! joined by `flatten` (default `.`, stored in palletd's escaped form
//! `%2E`, see [`super::field_name`]): `{"AM2301":{"Temperature":21.5}}` is
//! the field `AM2301.Temperature`. Arrays of values are flattened by index
//! (`color.0`) with `arrays = "index"` (the default) or left out and
//! counted with `arrays = "drop"`.

use std::borrow::Cow;

/// A parsed path: its segments (keys, indices as text, or `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(Vec<Seg>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    /// `*` (only where wildcards are allowed).
    Any,
}

/// How deep a payload's objects and arrays are followed; values deeper
/// than this are left out and counted (cause `bad_field`).
pub(crate) const MAX_DEPTH: usize = 16;

impl Path {
    /// Parses a JSON Pointer; `wildcards` allows `*` segments.
    pub fn parse(text: &str, wildcards: bool) -> Result<Path, String> {
        if text.is_empty() {
            return Ok(Path(Vec::new()));
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "{text:?} is not a JSON Pointer: it must start with '/' (e.g. \"/params/ts\")"
            ));
        };
        let mut segs = Vec::new();
        for raw in rest.split('/') {
            if raw == "*" && wildcards {
                segs.push(Seg::Any);
                continue;
            }
            let mut key = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    key.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => key.push('~'),
                    Some('1') => key.push('/'),
                    _ => {
                        return Err(format!(
                            "{text:?}: '~' must be followed by 0 or 1 (RFC 6901)"
                        ))
                    }
                }
            }
            segs.push(Seg::Key(key));
        }
        if segs.len() > MAX_DEPTH {
            return Err(format!("{text:?} is deeper than {MAX_DEPTH} levels"));
        }
        Ok(Path(segs))
    }

    /// A plain key (`Time`) as the path `/Time`; a pointer as itself.
    pub fn key_or_pointer(text: &str) -> Result<Path, String> {
        if text.starts_with('/') {
            Path::parse(text, false)
        } else if text.is_empty() {
            Err("must not be empty".into())
        } else {
            Ok(Path(vec![Seg::Key(text.to_string())]))
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How `at` stands to this path.
    fn relation<S: AsRef<str>>(&self, at: &[S]) -> Relation {
        let n = self.0.len().min(at.len());
        let same = self.0[..n].iter().zip(&at[..n]).all(|(s, a)| match s {
            Seg::Any => true,
            Seg::Key(k) => k == a.as_ref(),
        });
        match (same, at.len() >= self.0.len()) {
            (false, _) => Relation::Apart,
            (true, true) => Relation::Under,
            (true, false) => Relation::Above,
        }
    }

    /// Whether this is the path of one key, `key`.
    fn is_key(&self, key: &str) -> bool {
        matches!(self.0.as_slice(), [Seg::Key(k)] if k == key)
    }

    fn is<S: AsRef<str>>(&self, at: &[S]) -> bool {
        self.0.len() == at.len() && self.relation(at) == Relation::Under
    }
}

impl std::fmt::Display for Path {
    /// As a JSON Pointer; a path of one key as that key (how the
    /// configuration usually names it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let [Seg::Key(k)] = self.0.as_slice() {
            if !k.starts_with('/') {
                return f.write_str(k);
            }
        }
        for seg in &self.0 {
            match seg {
                Seg::Any => f.write_str("/*")?,
                Seg::Key(k) => write!(f, "/{}", k.replace('~', "~0").replace('/', "~1"))?,
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relation {
    /// At the path or below it.
    Under,
    /// On the way to it.
    Above,
    Apart,
}

/// What an array of a sample becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arrays {
    /// A field per element, named by its index.
    #[default]
    Index,
    /// Left out and counted.
    Drop,
}

/// A subscription's choice of fields, for the structured formats.
#[derive(Debug, Clone)]
pub struct Selection {
    pub root: Path,
    pub include: Vec<Path>,
    pub exclude: Vec<Path>,
    /// Exact paths and the field names they are stored under.
    pub rename: Vec<(Path, String)>,
    pub separator: String,
    pub arrays: Arrays,
    /// Where a payload names a unit (text) and the fields it applies to
    /// (`units = { "/TempUnit" = ["/*/Temperature"] }`): kept once per
    /// bucket as `units.<field>`, not as a field.
    pub units: Vec<(Path, Vec<Path>)>,
    pub timestamp: Path,
    pub sensor: Option<Path>,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            root: Path(Vec::new()),
            include: Vec::new(),
            exclude: Vec::new(),
            rename: Vec::new(),
            separator: ".".into(),
            arrays: Arrays::Index,
            units: Vec::new(),
            timestamp: Path(vec![Seg::Key("ts".into())]),
            sensor: None,
        }
    }
}

/// What to do with the value at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Not read (outside the root, not included, or excluded).
    Skip,
    /// Read: a field, the way to one, or the root itself.
    Read,
    /// The sample's time.
    Timestamp,
    /// The sample's sensor id.
    Sensor,
    /// The unit of [`Selection::units`]' entry of this index.
    Unit(usize),
}

impl Selection {
    /// Whether this is the flat default (every key of the object a field).
    pub(crate) fn is_plain(&self) -> bool {
        self.root.is_empty()
            && self.include.is_empty()
            && self.exclude.is_empty()
            && self.rename.is_empty()
            && self.units.is_empty()
    }

    /// The entry of [`Selection::units`] whose unit applies to the field
    /// at `at` (a path from the payload's object, under the root).
    pub(crate) fn unit_of<S: AsRef<str>>(&self, at: &[S]) -> Option<usize> {
        let rel = &at[self.root.len().min(at.len())..];
        self.units
            .iter()
            .position(|(_, fields)| fields.iter().any(|p| p.relation(rel) == Relation::Under))
    }

    /// [`Selection::step`] for a key of the object itself when the
    /// selection [`is_plain`](Selection::is_plain).
    pub(crate) fn top_step(&self, key: &str) -> Step {
        if self.timestamp.is_key(key) {
            Step::Timestamp
        } else if self.sensor.as_ref().is_some_and(|s| s.is_key(key)) {
            Step::Sensor
        } else {
            Step::Read
        }
    }

    /// What to do with the value at `at` (a path from the payload's
    /// object).
    pub(crate) fn step<S: AsRef<str>>(&self, at: &[S]) -> Step {
        let root = self.root.len();
        if at.len() <= root {
            return match self.root.relation(at) {
                Relation::Apart => Step::Skip,
                _ => Step::Read,
            };
        }
        let rel = &at[root..];
        if self.timestamp.is(rel) {
            return Step::Timestamp;
        }
        if self.sensor.as_ref().is_some_and(|s| s.is(rel)) {
            return Step::Sensor;
        }
        if let Some(i) = self.units.iter().position(|(from, _)| from.is(rel)) {
            return Step::Unit(i);
        }
        if self
            .exclude
            .iter()
            .any(|p| p.relation(rel) == Relation::Under)
        {
            return Step::Skip;
        }
        if self.include.is_empty() {
            return Step::Read;
        }
        let towards = |p: &Path| p.relation(rel) != Relation::Apart;
        if self.include.iter().any(towards)
            || towards(&self.timestamp)
            || self.sensor.as_ref().is_some_and(towards)
            || self.units.iter().any(|(from, _)| towards(from))
        {
            Step::Read
        } else {
            Step::Skip
        }
    }

    /// The field name of the value at `at` (a path from the payload's
    /// object, under the root), before escaping.
    pub(crate) fn name<'a>(&self, at: &[Cow<'a, str>]) -> Cow<'a, str> {
        let rel = &at[self.root.len().min(at.len())..];
        if let Some((_, to)) = self.rename.iter().find(|(p, _)| p.is(rel)) {
            return Cow::Owned(to.clone());
        }
        match rel {
            [one] => one.clone(),
            more => Cow::Owned(
                more.iter()
                    .map(|s| s.as_ref())
                    .collect::<Vec<_>>()
                    .join(&self.separator),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        Path::parse(s, true).unwrap()
    }

    #[test]
    fn pointers_parse_as_rfc_6901_says() {
        assert_eq!(
            Path::parse("/a~1b/m~0n/0", false).unwrap(),
            Path(vec![
                Seg::Key("a/b".into()),
                Seg::Key("m~n".into()),
                Seg::Key("0".into())
            ])
        );
        assert_eq!(
            Path::parse("/*", false).unwrap(),
            Path(vec![Seg::Key("*".into())])
        );
        assert_eq!(p("/*"), Path(vec![Seg::Any]));
        assert!(Path::parse("a/b", false).is_err());
        assert!(Path::parse("/a~2", false).is_err());
        assert_eq!(
            Path::key_or_pointer("Time").unwrap(),
            Path::parse("/Time", false).unwrap()
        );
    }

    #[test]
    fn selection_reads_the_root_and_what_is_included() {
        let sel = Selection {
            root: p("/params"),
            include: vec![p("/*/tC"), p("/humidity:0")],
            exclude: vec![p("/humidity:0/id")],
            ..Selection::default()
        };
        let at = |s: &[&str]| sel.step(s);
        assert_eq!(at(&["params"]), Step::Read);
        assert_eq!(at(&["src"]), Step::Skip);
        assert_eq!(at(&["params", "ts"]), Step::Timestamp);
        assert_eq!(at(&["params", "temperature:0"]), Step::Read);
        assert_eq!(at(&["params", "temperature:0", "tC"]), Step::Read);
        assert_eq!(at(&["params", "temperature:0", "tF"]), Step::Skip);
        assert_eq!(at(&["params", "humidity:0", "rh"]), Step::Read);
        assert_eq!(at(&["params", "humidity:0", "id"]), Step::Skip);
        // On the way to `/*/tC`; nothing under it but a `tC` is read.
        assert_eq!(at(&["params", "sys"]), Step::Read);
        assert_eq!(at(&["params", "sys", "uptime"]), Step::Skip);
        let names: Vec<Cow<str>> = ["params", "temperature:0", "tC"]
            .into_iter()
            .map(Cow::Borrowed)
            .collect();
        assert_eq!(sel.name(&names), "temperature:0.tC");
    }
}
