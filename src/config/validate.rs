//! The validator every section goes through: it collects every error with
//! its TOML path (never stopping at the first) and the warnings, and reads
//! the value types all sections share (durations, sizes, bounded
//! integers, names, paths).

use super::*;

#[derive(Default)]
pub(super) struct Validator {
    pub(super) errors: Vec<ConfigError>,
    pub(super) warnings: Vec<String>,
}

impl Validator {
    pub(super) fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(super) fn section<T: DeserializeOwned>(
        &mut self,
        table: &toml::Table,
        name: &str,
        required: bool,
    ) -> Option<T> {
        match table.get(name) {
            Some(value @ toml::Value::Table(_)) => self.value(value, name),
            Some(_) => {
                self.err(name, "must be a table");
                None
            }
            None => {
                if required {
                    self.err(name, "missing required section");
                }
                None
            }
        }
    }

    /// An array of tables (`[[name]]`), each read on its own; `required`:
    /// at least one.
    pub(super) fn tables<T: DeserializeOwned>(
        &mut self,
        table: &toml::Table,
        name: &str,
        required: bool,
    ) -> Vec<T> {
        let needed = format!("at least one [[{name}]] is required");
        let mut out = Vec::new();
        match table.get(name) {
            None if required => self.err(name, needed),
            None => {}
            Some(toml::Value::Array(items)) => {
                if required && items.is_empty() {
                    self.err(name, needed);
                }
                for (i, item) in items.iter().enumerate() {
                    if let Some(t) = self.value(item, &format!("{name}[{i}]")) {
                        out.push(t);
                    }
                }
            }
            Some(_) => self.err(name, format!("must be an array of tables ([[{name}]])")),
        }
        out
    }

    /// Deserializes one value, recording every error with its full path.
    ///
    /// serde stops at the first error, so after each one the offending key is
    /// taken out and the value read again; a required key taken out this way
    /// is not reported a second time as missing.
    pub(super) fn value<T: DeserializeOwned>(
        &mut self,
        value: &toml::Value,
        prefix: &str,
    ) -> Option<T> {
        let mut value = value.clone();
        let mut reported: Vec<Vec<String>> = Vec::new();
        for _ in 0..64 {
            let e = match serde_path_to_error::deserialize(value.clone()) {
                Ok(v) => return reported.is_empty().then_some(v),
                Err(e) => e,
            };
            let mut keys: Vec<String> = e
                .path()
                .iter()
                .filter_map(|seg| match seg {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    _ => None,
                })
                .collect();
            let message = e.into_inner().to_string();
            // serde names a missing field in the message only.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
                .map(str::to_string);
            if let Some(field) = &missing {
                keys.push(field.clone());
            }
            let path = std::iter::once(prefix.to_string())
                .chain(keys.iter().cloned())
                .collect::<Vec<_>>()
                .join(".");
            if !reported.contains(&keys) {
                // serde may quote the value; never for a key that holds a secret.
                let secret = keys
                    .last()
                    .is_some_and(|k| k.contains("password") || k.starts_with("uri"));
                match missing {
                    Some(_) => self.err(path, "required key is missing"),
                    None if secret => self.err(
                        path,
                        "has the wrong type (value not shown: it may be a secret)",
                    ),
                    None => self.err(path, message),
                }
            }
            if missing.is_some() || keys.is_empty() || !remove_key(&mut value, &keys) {
                return None;
            }
            reported.push(keys);
        }
        None
    }

    pub(super) fn duration(&mut self, path: &str, raw: Option<&str>, default: &str) -> Duration {
        let text = raw.unwrap_or(default);
        match humantime::parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                self.err(
                    path,
                    format!("invalid duration {text:?}: {e} (e.g. \"500ms\", \"1h\")"),
                );
                humantime::parse_duration(default).unwrap_or_default()
            }
        }
    }

    pub(super) fn positive_duration(
        &mut self,
        path: &str,
        raw: Option<&str>,
        default: &str,
    ) -> Duration {
        let d = self.duration(path, raw, default);
        if d.is_zero() {
            self.err(path, "must be greater than zero");
        }
        d
    }

    pub(super) fn size(&mut self, path: &str, raw: Option<RawSize>, default: u64) -> u64 {
        match raw {
            None => default,
            Some(RawSize::Bytes(n)) => n,
            Some(RawSize::Text(t)) => match t.trim().parse::<bytesize::ByteSize>() {
                Ok(b) => b.as_u64(),
                Err(e) => {
                    self.err(path, format!("invalid size {t:?}: {e} (e.g. \"256KiB\")"));
                    default
                }
            },
        }
    }

    pub(super) fn int_in(
        &mut self,
        path: &str,
        raw: Option<i64>,
        default: i64,
        min: i64,
        max: i64,
    ) -> i64 {
        let n = raw.unwrap_or(default);
        if n < min || n > max {
            self.err(path, format!("must be between {min} and {max}, got {n}"));
            return default;
        }
        n
    }

    /// A secret given by one of `<key>` (inline), `<key>_file` (a file
    /// palletd reads at start, trailing newline dropped) or `<key>_env` (an
    /// environment variable); more than one is an error.
    pub(super) fn secret(
        &mut self,
        key: &str,
        inline: Option<String>,
        file: Option<String>,
        env: Option<String>,
        base: Option<&Path>,
    ) -> Option<Secret> {
        let name = key.rsplit('.').next().unwrap_or(key);
        if [inline.is_some(), file.is_some(), env.is_some()]
            .iter()
            .filter(|s| **s)
            .count()
            > 1
        {
            self.err(
                key,
                format!("set only one of {name}, {name}_file and {name}_env"),
            );
        }
        if let Some(s) = inline {
            Some(Secret::new(s))
        } else if let Some(f) = file {
            let key = format!("{key}_file");
            let p = resolve(base, &f);
            self.warn_if_readable_by_others(&key, &p);
            match std::fs::read_to_string(&p) {
                Ok(s) => Some(Secret::new(s.trim_end_matches(['\r', '\n']))),
                Err(e) => {
                    self.err(&key, format!("cannot read {}: {e}", p.display()));
                    None
                }
            }
        } else if let Some(var) = env {
            match std::env::var(&var) {
                Ok(v) => Some(Secret::new(v)),
                Err(_) => {
                    self.err(
                        format!("{key}_env"),
                        format!("environment variable {var:?} is not set"),
                    );
                    None
                }
            }
        } else {
            None
        }
    }

    /// A secret file others can read is a leak waiting to happen: warn.
    pub(super) fn warn_if_readable_by_others(&mut self, key: &str, path: &Path) {
        if readable_by_others(path) {
            self.warnings.push(format!(
                "{key}: {} is readable by every user; make it readable by palletd only (chmod 600)",
                path.display()
            ));
        }
    }
}

/// Whether every user may read the file.
pub(super) fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
}

/// Removes the key at `path` from nested tables; false if it was not there.
pub(super) fn remove_key(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut v = value;
    for p in parents {
        match v.get_mut(p.as_str()) {
            Some(next) => v = next,
            None => return false,
        }
    }
    v.as_table_mut().is_some_and(|t| t.remove(last).is_some())
}

pub(super) fn check_name(v: &mut Validator, path: &str, name: &str, forbidden: &[char]) {
    if name.is_empty() {
        v.err(path, "must not be empty");
    } else if let Some(c) = name.chars().find(|c| forbidden.contains(c) || *c == '\0') {
        v.err(path, format!("must not contain {c:?}"));
    } else if name.len() > 120 {
        v.err(path, "is longer than 120 bytes");
    }
}

/// A path from the configuration: relative to the config file's directory.
pub(super) fn resolve(base: Option<&Path>, path: &str) -> PathBuf {
    match base {
        Some(b) if Path::new(path).is_relative() => b.join(path),
        _ => PathBuf::from(path),
    }
}
