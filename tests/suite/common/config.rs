//! palletd's configuration for a test, as a typed builder over its TOML.

use super::*;

/// A palletd configuration, built up typed and written out as TOML.
///
/// The defaults: the given broker and database, database `name`, client id
/// `palletd-<name>`, a 5 s keep-alive, 100 messages in flight, readings
/// written within 1 s (`flush.max_delay`, 10 s by default in palletd), the
/// HTTP endpoint on a free port, the spool in the broker's directory (so it
/// survives a palletd restart within a test), and two subscriptions:
/// `sensors/{sensor}/telemetry` (JSON) and `plant/{sensor}/{field}` (numbers).
#[derive(Clone)]
pub struct Config {
    table: toml::Table,
    pub http_port: u16,
    pub name: String,
}

impl Config {
    pub fn new(broker: &Broker, db: &Database, name: &str) -> Config {
        Self::new_with(&broker.url(), broker.dir.path(), db, name)
    }

    /// The defaults on the broker at `url`, the spool in `dir`.
    pub fn new_with(url: &str, dir: &Path, db: &Database, name: &str) -> Config {
        let client_id = format!("palletd-{name}");
        let http_port = free_port();
        let spool = dir.join(format!("spool-{client_id}"));
        let text = format!(
            r#"
[mqtt]
url = "{url}"
client_id = "{client_id}"
keep_alive = "5s"
max_inflight = 100

[mongodb]
uri = "{uri}"
database = "{name}"
# Short (the default is 10s): a restart after a kill waits this long plus
# 1 s before reading what the killed run's last write applied.
write_time_limit = "2s"

[flush]
max_delay = "1s"

[http]
listen = "127.0.0.1:{http_port}"

[spool]
dir = "{spool}"

[[subscription]]
topic = "sensors/{{sensor}}/telemetry"

[[subscription]]
topic = "plant/{{sensor}}/{{field}}"
format = "number"
"#,
            uri = db.uri(),
            spool = spool.display(),
        );
        Config {
            table: toml::from_str(&text).unwrap(),
            http_port,
            name: name.to_string(),
        }
    }

    /// A configuration for in-process use of the library against `db` (no
    /// broker; its URL points nowhere).
    pub fn offline(db: &Database, name: &str) -> Config {
        let mut c = Config::new_with("mqtt://127.0.0.1:1", &std::env::temp_dir(), db, name);
        c.http_port = 0;
        c
    }

    /// The validated settings, as palletd would load them.
    pub fn settings(&self) -> palletd::config::Settings {
        palletd::config::parse(&self.toml(), None).expect("a valid config")
    }

    /// Sets `section.key` (or `section.sub.key`) to `value`.
    /// No wire compression (a proxy that reads the commands needs them in
    /// clear).
    /// One MQTT connection (`mqtt.connections = 1`): one ordered stream,
    /// for the tests that check a bucket keeps a sensor's publish order
    /// (over several connections, arrival order is only each one's).
    pub fn one_stream(self) -> Config {
        self.set("mqtt.connections", 1)
    }

    pub fn uncompressed(self) -> Config {
        self.set("mongodb.compressors", toml::Value::Array(Vec::new()))
    }

    pub fn set(mut self, path: &str, value: impl Into<toml::Value>) -> Config {
        let mut keys: Vec<&str> = path.split('.').collect();
        let last = keys.pop().expect("a key");
        let mut table = &mut self.table;
        for k in keys {
            table = table
                .entry(k)
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .expect("a table");
        }
        table.insert(last.to_string(), value.into());
        self
    }

    /// Another instance of this configuration: its own client id, spool
    /// (in `dir`) and HTTP port; the same broker, database and share group.
    pub fn another(&self, name: &str, dir: &Path) -> Config {
        let mut c = self
            .clone()
            .set("mqtt.client_id", format!("palletd-{name}"))
            .set(
                "spool.dir",
                dir.join(format!("spool-{name}")).display().to_string(),
            );
        let port = free_port();
        c.http_port = port;
        c.set("http.listen", format!("127.0.0.1:{port}"))
    }

    /// Removes `section.key`.
    pub fn unset(mut self, path: &str) -> Config {
        let (section, key) = path.split_once('.').expect("section.key");
        if let Some(t) = self.table.get_mut(section).and_then(|t| t.as_table_mut()) {
            t.remove(key);
        }
        self
    }

    /// Adds a `[[subscription]]` for a JSON topic pattern.
    pub fn subscribe(self, topic: &str) -> Config {
        self.subscription(&[("topic", topic.into())])
    }

    /// Adds a `[[subscription]]` of `format = "sparkplug_b"` on `spBv1.0/#`,
    /// with rebirth requests at most every `rebirth` if given.
    pub fn sparkplug(self, rebirth: Option<&str>) -> Config {
        let mut keys = vec![
            ("topic", "spBv1.0/#".into()),
            ("format", "sparkplug_b".into()),
        ];
        if let Some(every) = rebirth {
            keys.push(("request_rebirth", true.into()));
            keys.push(("rebirth_min_interval", every.into()));
        }
        self.subscription(&keys)
    }

    /// Adds a preset's subscriptions (`palletd print-config --preset`).
    pub fn preset(mut self, name: &str) -> Config {
        let text = palletd::config::presets::preset(name).expect("a preset");
        let table: toml::Table = text.parse().expect("a preset is TOML");
        let Some(toml::Value::Array(theirs)) = table.get("subscription") else {
            panic!("preset {name} has no subscriptions");
        };
        if let Some(toml::Value::Array(subs)) = self.table.get_mut("subscription") {
            subs.extend(theirs.iter().cloned());
        }
        self
    }

    /// Adds a `[[subscription]]` with these keys.
    pub fn subscription(mut self, keys: &[(&str, toml::Value)]) -> Config {
        let sub: toml::Table = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        if let Some(toml::Value::Array(subs)) = self.table.get_mut("subscription") {
            subs.push(toml::Value::Table(sub));
        }
        self
    }

    /// Adds a `[[rollup]]` of `interval`.
    pub fn rollup(mut self, interval: &str, partial: bool, expire_after: Option<&str>) -> Config {
        let mut r = toml::Table::new();
        r.insert("interval".into(), interval.into());
        r.insert("partial".into(), partial.into());
        if let Some(e) = expire_after {
            r.insert("expire_after".into(), e.into());
        }
        let rollups = self
            .table
            .entry("rollup")
            .or_insert_with(|| toml::Value::Array(Vec::new()));
        if let toml::Value::Array(items) = rollups {
            items.push(toml::Value::Table(r));
        }
        self
    }

    pub fn window(self, window: &str) -> Config {
        self.set("bucket.window", window)
    }

    pub fn max_samples(self, n: i64) -> Config {
        self.set("bucket.max_samples", n)
    }

    pub fn max_delay(self, delay: &str) -> Config {
        self.set("flush.max_delay", delay)
    }

    pub fn closer(self, every: &str, grace: &str) -> Config {
        self.set("closer.interval", every)
            .set("closer.grace", grace)
    }

    pub fn timeseries(self) -> Config {
        self.set("storage.mode", "timeseries")
            .set("storage.granularity", "seconds")
    }

    pub fn mongodb_uri(self, uri: &str) -> Config {
        self.set("mongodb.uri", uri)
    }

    pub fn client_id(&self) -> String {
        self.table["mqtt"]["client_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn database(&self) -> String {
        self.table["mongodb"]["database"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn toml(&self) -> String {
        toml::to_string(&self.table).unwrap()
    }

    /// The config written to `dir/<name>`, for a `palletd` command.
    pub fn write_to(&self, dir: &Path, name: &str) -> PathBuf {
        write_file(dir, name, &self.toml())
    }
}
