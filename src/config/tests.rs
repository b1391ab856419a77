//! The configuration's validation: defaults, every error with its path,
//! warnings, secrets.

use super::*;

const MINIMAL: &str = r#"
    [mqtt]
    url = "mqtt://127.0.0.1:1883"
    client_id = "palletd-test"
    [mongodb]
    uri = "mongodb://127.0.0.1:27017"
    database = "palletd"
    [[subscription]]
    topic = "sensors/{sensor}/telemetry"
"#;

fn errors(text: &str) -> Vec<String> {
    parse(text, None)
        .err()
        .unwrap_or_default()
        .iter()
        .map(|e| e.to_string())
        .collect()
}

#[test]
fn example_config_parses_and_validates() {
    let s = parse(EXAMPLE, None).expect("the example config is valid");
    assert_eq!(s.mongodb.collection, "readings");
    assert_eq!(s.bucket.max_samples, 200);
    assert_eq!(s.bucket.max_bytes, 256 * 1024);
    assert_eq!(s.flush.max_delay, Duration::from_secs(10));
}

#[test]
fn minimal_config_gets_defaults() {
    let s = parse(MINIMAL, None).unwrap();
    assert_eq!(s.mqtt.port, 1883);
    assert_eq!(s.mqtt.keep_alive, Duration::from_secs(30));
    assert_eq!(s.mongodb.write_concern, WriteConcern::Majority);
    assert!(s.mongodb.journal);
    assert_eq!(s.bucket.window, Duration::from_secs(3600));
    assert_eq!(s.flush.max_pending_samples, 1_000_000);
    assert_eq!(s.subscriptions[0].qos, 1);
    assert_eq!(s.closer.interval, Duration::from_secs(60));
    assert_eq!(s.closer.grace, Duration::from_secs(300));
    assert_eq!(s.storage.mode, StorageMode::Buckets);
    assert_eq!(s.retention.expire_after, None);
    assert_eq!(
        s.retention.deadletter_expire_after,
        Some(Duration::from_secs(7 * 86400))
    );
    assert_eq!(s.subscriptions[0].selection.timestamp.to_string(), "ts");
}

#[test]
fn every_error_is_reported_with_its_path() {
    let text = MINIMAL
        .replace(
            "mqtt://127.0.0.1:1883\"",
            "mqtt://127.0.0.1:1883\"\nkeep_alive = \"soon\"",
        )
        .replace(
            "database = \"palletd\"",
            "database = \"palletd\"\nwrite_concern = 0",
        )
        + "[bucket]\nmax_bytes = \"9MiB\"\nwindow = \"0s\"\n[flush]\nbogus = 1\n";
    let errs = errors(&text);
    let joined = errs.join("\n");
    assert!(
        joined.contains("mqtt.keep_alive: invalid duration"),
        "{joined}"
    );
    assert!(joined.contains("mongodb.write_concern:"), "{joined}");
    assert!(joined.contains("bucket.max_bytes:"), "{joined}");
    assert!(
        joined.contains("bucket.window: must be greater than zero"),
        "{joined}"
    );
    assert!(joined.contains("flush.bogus: unknown field"), "{joined}");
    assert_eq!(errs.len(), 5, "{joined}");
}

#[test]
fn missing_and_unknown_keys_name_their_path() {
    let text = MINIMAL.replace("client_id = \"palletd-test\"", "clientid = \"x\"");
    let joined = errors(&text).join("\n");
    assert!(joined.contains("mqtt.clientid: unknown field"), "{joined}");
    let text = MINIMAL.replace("client_id = \"palletd-test\"", "");
    let joined = errors(&text).join("\n");
    assert!(
        joined.contains("mqtt.client_id: required key is missing"),
        "{joined}"
    );
    let joined = errors(&(MINIMAL.to_string() + "[extra]\n")).join("\n");
    assert!(joined.contains("extra: unknown section"), "{joined}");
}

#[test]
fn subscription_errors_carry_their_index() {
    let text = MINIMAL.to_string()
        + "[[subscription]]\ntopic = \"a/{sensor}/{sensor}\"\n[[subscription]]\ntopic = \"b/{sensor}\"\nformat = \"number\"\nqos = 3\n";
    let joined = errors(&text).join("\n");
    assert!(joined.contains("subscription[1].topic:"), "{joined}");
    assert!(joined.contains("subscription[2].field:"), "{joined}");
    assert!(joined.contains("subscription[2].qos:"), "{joined}");
}

#[test]
fn thinning_rules_are_read_and_checked() {
    use crate::thin::Rule;
    let sub = "[[subscription]]\ntopic = \"g/{sensor}\"\n";
    let s = parse(
        &(MINIMAL.to_string()
            + sub
            + "[subscription.thinning.temp]\nkind = \"swinging_door\"\ndeviation = 0.2\n"
            + "[subscription.thinning.hum]\nkind = \"deadband\"\ndeviation_percent = 1.0\nspan = [0, 100]\nmax_interval = \"1h\"\nmin_interval = \"5s\"\n"),
        None,
    )
    .unwrap();
    let thinning = &s.subscriptions.last().unwrap().thinning;
    assert_eq!(
        thinning,
        &[
            (
                "hum".to_string(),
                Rule::Deadband {
                    band: 1.0,
                    max_interval_ms: 3_600_000,
                    min_interval_ms: 5_000
                }
            ),
            (
                "temp".to_string(),
                Rule::SwingingDoor {
                    deviation: 0.2,
                    max_interval_ms: 600_000
                }
            ),
        ]
    );
    assert!(s.subscriptions.last().unwrap().in_order());
    // The runs take an eighth of limits.max_memory, from what waits for
    // MongoDB.
    let (thinned, plain) = (
        s.limits.split(),
        parse(MINIMAL, None).unwrap().limits.split(),
    );
    assert_eq!(thinned.thinning, s.limits.max_memory as usize / 8);
    assert_eq!(
        (plain.thinning, plain.pending - thinned.pending),
        (0, thinned.thinning)
    );
    let bad = "[subscription.thinning.a]\nkind = \"spline\"\ndeviation = 1\n\
               [subscription.thinning.b]\nkind = \"deadband\"\ndeviation_percent = 1.0\n\
               [subscription.thinning.c]\nkind = \"swinging_door\"\ndeviation = -1.0\nmin_interval = \"1s\"\n\
               [subscription.thinning.d]\nkind = \"deadband\"\n\
               [subscription.thinning.e]\nkind = \"swinging_door\"\ndeviation = 1.0\nmin_interval = \"1s\"\n";
    let joined = errors(&(MINIMAL.to_string() + "[storage]\nmode = \"timeseries\"\n" + sub + bad))
        .join("\n");
    for want in [
        "subscription[1].thinning.a.kind: \"spline\" is not a thinning rule",
        "subscription[1].thinning.b.span: deviation_percent needs span",
        "subscription[1].thinning.c.deviation: must be a number of at least 0",
        "subscription[1].thinning.d.deviation: missing",
        "subscription[1].thinning.e.min_interval: applies to kind = \"deadband\" only",
    ] {
        assert!(joined.contains(want), "{want} in {joined}");
    }
    assert!(
        !joined.contains("storage.mode"),
        "both storage modes thin: {joined}"
    );
}

#[test]
fn storage_mode_is_checked() {
    let s = parse(
        &(MINIMAL.to_string() + "[storage]\nmode = \"timeseries\"\ngranularity = \"minutes\"\n"),
        None,
    )
    .unwrap();
    assert_eq!(s.storage.mode, StorageMode::Timeseries);
    assert_eq!(s.storage.granularity, "minutes");
    let joined =
        errors(&(MINIMAL.to_string() + "[storage]\nmode = \"ts\"\ngranularity = \"days\"\n"))
            .join("\n");
    assert!(joined.contains("storage.mode: must be"), "{joined}");
    assert!(joined.contains("storage.granularity: must be"), "{joined}");
}

#[test]
fn a_write_concern_short_of_majority_and_journal_is_warned_about() {
    let plain = parse(MINIMAL, None).unwrap();
    assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
    let text = MINIMAL.replace(
        "database = \"palletd\"",
        "database = \"palletd\"\nwrite_concern = 1\njournal = false",
    );
    let s = parse(&text, None).unwrap();
    let joined = s.warnings.join("\n");
    assert!(joined.contains("mongodb.write_concern = 1"), "{joined}");
    assert!(joined.contains("an election can roll it back"), "{joined}");
    assert!(joined.contains("mongodb.journal = false"), "{joined}");
}

#[test]
fn flush_interval_is_read_as_max_delay_with_a_warning() {
    let s = parse(
        &(MINIMAL.to_string() + "[flush]\ninterval = \"3s\"\n"),
        None,
    )
    .unwrap();
    assert_eq!(s.flush.max_delay, Duration::from_secs(3));
    assert!(
        s.warnings.iter().any(|w| w.contains("flush.max_delay")),
        "{:?}",
        s.warnings
    );
    let joined =
        errors(&(MINIMAL.to_string() + "[flush]\ninterval = \"3s\"\nmax_delay = \"2s\"\n"))
            .join("\n");
    assert!(joined.contains("flush.interval:"), "{joined}");
}

/// `flush.max_delay_limit`: 5 minutes unless set, never below
/// max_delay (an error when set so; unset, it follows a longer one).
#[test]
fn the_delay_limit_is_five_minutes_and_never_below_max_delay() {
    let s = parse(MINIMAL, None).unwrap();
    assert_eq!(s.flush.max_delay_limit, Duration::from_secs(300));
    let flush = |t: &str| MINIMAL.to_string() + "[flush]\n" + t;
    let s = parse(&flush("max_delay = \"10m\"\n"), None).unwrap();
    assert_eq!(s.flush.max_delay_limit, Duration::from_secs(600));
    let s = parse(&flush("max_delay_limit = \"30s\"\n"), None).unwrap();
    assert_eq!(s.flush.max_delay_limit, Duration::from_secs(30));
    let joined = errors(&flush("max_delay = \"1m\"\nmax_delay_limit = \"30s\"\n")).join("\n");
    assert!(
        joined.contains("flush.max_delay_limit: must be at least flush.max_delay (1m)"),
        "{joined}"
    );
}

/// limits.max_memory: "auto" unless set (an eighth of the box, 64-256
/// MiB: config::memory), a size when set, "auto" when written so.
#[test]
fn the_memory_budget_is_auto_unless_set() {
    let auto = memory::auto().0;
    assert!((64 << 20..=256 << 20).contains(&auto), "{auto}");
    let s = parse(MINIMAL, None).unwrap();
    assert_eq!(s.limits.max_memory, auto);
    assert!(matches!(
        s.limits.max_memory_from,
        MemoryBudgetFrom::Auto { available: Some(_) }
    ));
    let limits = |t: &str| MINIMAL.to_string() + "[limits]\n" + t;
    let s = parse(&limits("max_memory = \"auto\"\n"), None).unwrap();
    assert_eq!(s.limits.max_memory, auto);
    let s = parse(&limits("max_memory = \"32MiB\"\n"), None).unwrap();
    assert_eq!(s.limits.max_memory, 32 << 20);
    assert_eq!(s.limits.max_memory_from, MemoryBudgetFrom::Set);
    let joined = errors(&limits("max_memory = \"lots\"\n")).join("\n");
    assert!(
        joined.contains("limits.max_memory: invalid size"),
        "{joined}"
    );
}

#[test]
fn sparkplug_subscriptions_take_the_namespace_and_no_shared_group() {
    let sub = "[[subscription]]\ntopic = \"spBv1.0/Plant1/#\"\nformat = \"sparkplug_b\"\n";
    let s = parse(&(MINIMAL.to_string() + sub), None).unwrap();
    assert_eq!(s.subscriptions[1].format, PayloadFormat::SparkplugB);
    assert_eq!(
        s.subscriptions[1].rebirth_min_interval, None,
        "off by default"
    );
    let on = MINIMAL.to_string() + sub + "request_rebirth = true\nrebirth_min_interval = \"30s\"\n";
    assert_eq!(
        parse(&on, None).unwrap().subscriptions[1].rebirth_min_interval,
        Some(Duration::from_secs(30))
    );
    let cases = [
        (
            MINIMAL.replace("client_id = \"palletd-test\"", "client_id = \"palletd-test\"\nshare_group = \"g\"") + sub,
            "subscription[1].format: \"sparkplug_b\" cannot be used with mqtt.share_group",
        ),
        (
            MINIMAL.to_string() + "[[subscription]]\ntopic = \"spBv1.0/{sensor}/#\"\nformat = \"sparkplug_b\"\n",
            "subscription[1].topic: format = \"sparkplug_b\" needs an MQTT filter in the Sparkplug namespace",
        ),
        (
            MINIMAL.to_string() + sub + "sensor_field = \"x\"\n",
            "subscription[1].sensor_field: does not apply",
        ),
        (
            MINIMAL.to_string() + "request_rebirth = true\n",
            "subscription[0].request_rebirth: needs format = \"sparkplug_b\"",
        ),
    ];
    for (text, want) in cases {
        let joined = errors(&text).join("\n");
        assert!(joined.contains(want), "{want}\n{joined}");
    }
}

#[test]
fn rollups_are_whole_numbers_of_windows_each_once() {
    let text = MINIMAL.to_string()
        + "[[rollup]]\ninterval = \"1h\"\nexpire_after = \"400d\"\n[[rollup]]\ninterval = \"1d\"\npartial = true\n";
    let s = parse(&text, None).unwrap();
    let names: Vec<&str> = s.rollups.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["1h", "1d"]);
    assert_eq!(
        s.rollups[0].expire_after,
        Some(Duration::from_secs(400 * 86400))
    );
    assert!(s.rollups[1].partial && !s.rollups[0].partial);
    assert_eq!(s.rollups[1].start_of(86_400_000 * 3 + 5), 86_400_000 * 3);
    assert_eq!(
        s.rollups[0].start_of(-1),
        -3_600_000,
        "aligned to the epoch"
    );
    let bad = MINIMAL.to_string()
        + "[[rollup]]\ninterval = \"90m\"\n[[rollup]]\ninterval = \"60m\"\n[[rollup]]\ninterval = \"1h\"\n";
    let joined = errors(&bad).join("\n");
    assert!(
        joined.contains("rollup[0].interval: 90m is not a whole number of bucket.window (1h)"),
        "{joined}"
    );
    assert!(
        joined.contains("rollup[2].interval: a rollup of 1h is configured twice"),
        "{joined}"
    );
}

#[test]
fn retention_can_be_set_or_turned_off() {
    let text = MINIMAL.to_string()
        + "[retention]\nexpire_after = \"30d\"\ndeadletter_expire_after = \"off\"\n";
    let s = parse(&text, None).unwrap();
    assert_eq!(
        s.retention.expire_after,
        Some(Duration::from_secs(30 * 86400))
    );
    assert_eq!(s.retention.deadletter_expire_after, None);
    let joined =
        errors(&(MINIMAL.to_string() + "[retention]\nexpire_after = \"1500ms\"\n")).join("\n");
    assert!(
        joined.contains("retention.expire_after: must be a whole number of seconds"),
        "{joined}"
    );
}

#[test]
fn bad_url_and_toml_syntax_are_errors() {
    let joined = errors(&MINIMAL.replace("mqtt://127.0.0.1:1883", "http://x")).join("\n");
    assert!(joined.contains("mqtt.url: unsupported scheme"), "{joined}");
    let joined = errors("[mqtt\nurl=").join("\n");
    assert!(joined.contains("invalid TOML"), "{joined}");
}

#[test]
fn a_secret_of_the_wrong_type_is_not_echoed() {
    let text = MINIMAL.replace(
        "client_id = \"palletd-test\"",
        "client_id = \"c\"\nusername = \"u\"\npassword = 987654321",
    );
    let joined = errors(&text).join("\n");
    assert!(
        joined.contains("mqtt.password: has the wrong type"),
        "{joined}"
    );
    assert!(!joined.contains("987654321"), "{joined}");
}

#[test]
fn secrets_do_not_print() {
    let text = MINIMAL.replace(
        "client_id = \"palletd-test\"",
        "client_id = \"c\"\nusername = \"u\"\npassword = \"hunter2\"",
    );
    let s = parse(&text, None).unwrap();
    let shown = format!("{s:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(
        s.mqtt.password.as_ref().map(Secret::expose),
        Some("hunter2")
    );
}

#[test]
fn http_credentials_come_from_one_source_each() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("http.token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let http = |keys: &str| format!("{MINIMAL}\n[http]\n{keys}\n");
    let s = parse(
        &http("username = \"ops\"\npassword = \"pw\"\ntoken_file = \"http.token\""),
        Some(dir.path()),
    )
    .unwrap();
    let basic = s
        .http
        .auth
        .basic
        .as_ref()
        .map(|(u, p)| (u.as_str(), p.expose()));
    assert_eq!(basic, Some(("ops", "pw")));
    assert_eq!(
        s.http.auth.token.as_ref().map(Secret::expose),
        Some("t0ken")
    );
    assert!(!format!("{s:?}").contains("t0ken"));
    assert!(!parse(MINIMAL, None).unwrap().http.auth.required());
    for (keys, want) in [
        (
            "password = \"pw\"",
            "http.username: a password needs a username",
        ),
        (
            "username = \"ops\"",
            "http.password: a username needs a password",
        ),
        (
            "username = \"a:b\"\npassword = \"pw\"",
            "http.username: must be non-empty and without ':'",
        ),
        (
            "token = \"x\"\ntoken_env = \"X\"",
            "http.token: set only one of token, token_file and token_env",
        ),
        ("token = \"\"", "http.token: must not be empty"),
        ("token_file = \"missing\"", "http.token_file: cannot read"),
        (
            "token_env = \"PALLETD_NO_SUCH_VARIABLE\"",
            "http.token_env: environment variable",
        ),
    ] {
        let e = errors(&http(keys)).join("\n");
        assert!(e.contains(want), "{keys}: {e}");
    }
}

#[test]
fn mqtt5_settings_and_properties_need_protocol_5() {
    let s = parse(MINIMAL, None).unwrap();
    assert_eq!(s.mqtt.protocol, MqttProtocol::V311);
    let v5 = MINIMAL.replace(
        "client_id = \"palletd-test\"",
        "client_id = \"palletd-test\"\nprotocol = \"5\"",
    );
    let s = parse(&v5, None).unwrap();
    assert_eq!(s.mqtt.protocol, MqttProtocol::V5);
    assert_eq!(s.mqtt.session_expiry, Duration::from_secs(7 * 86400));
    assert_eq!(s.mqtt.receive_maximum, 1000);
    let props = "\ntimestamp_property = \"time\"\nsensor_property = \"device\"";
    let s = parse(&format!("{v5}{props}"), None).unwrap();
    assert_eq!(
        s.subscriptions[0].from_properties,
        crate::decode::FromProperties {
            timestamp: Some("time".into()),
            sensor: Some("device".into()),
            content_type: false
        }
    );
    // Under 3.1.1 there are no properties to read, nor a session expiry.
    let e = errors(&format!("{MINIMAL}{props}"));
    assert!(
        e.iter()
            .any(|e| e.contains("subscription[0]") && e.contains("protocol = \"5\"")),
        "{e:?}"
    );
    let e = errors(&MINIMAL.replace(
        "client_id = \"palletd-test\"",
        "client_id = \"palletd-test\"\nsession_expiry = \"1h\"\nreceive_maximum = 500",
    ));
    assert!(e.iter().any(|e| e.contains("mqtt.session_expiry")), "{e:?}");
    assert!(
        e.iter().any(|e| e.contains("mqtt.receive_maximum")),
        "{e:?}"
    );
    let e = errors(&MINIMAL.replace(
        "client_id = \"palletd-test\"",
        "client_id = \"palletd-test\"\nprotocol = \"3\"",
    ));
    assert!(e.iter().any(|e| e.contains("mqtt.protocol")), "{e:?}");
    // A topic without {sensor} may name its sensor by a property.
    let t = v5.replace("sensors/{sensor}/telemetry", "fleet/telemetry");
    assert!(!errors(&t).is_empty());
    assert!(parse(&format!("{t}\nsensor_property = \"device\""), None).is_ok());
}

#[test]
fn the_compression_level_follows_the_servers_host_unless_set() {
    use ::mongodb::options::ServerAddress;
    let host = |h: &str| ServerAddress::Tcp {
        host: h.into(),
        port: Some(27017),
    };
    let s = parse(MINIMAL, None).unwrap();
    let m = &s.mongodb;
    let local = [host("127.0.0.1"), host("localhost"), host("[::1]")];
    assert_eq!(m.compression_level_for("zstd", &local), Some(1));
    let remote = [host("127.0.0.1"), host("db.example.net")];
    assert_eq!(m.compression_level_for("zstd", &remote), Some(3));
    assert_eq!(m.compression_level_for("zlib", &remote), None);
    assert_eq!(m.compression_level_for("snappy", &remote), None);
    let set = MINIMAL.replace(
        "database = \"palletd\"",
        "database = \"palletd\"\ncompression_level = 12",
    );
    let s = parse(&set, None).unwrap();
    assert_eq!(s.mongodb.compression_level_for("zstd", &local), Some(12));
    assert_eq!(s.mongodb.compression_level_for("zlib", &local), Some(9));
    let wrong = MINIMAL.replace(
        "database = \"palletd\"",
        "database = \"palletd\"\ncompression_level = 0",
    );
    let errs = errors(&wrong);
    assert!(
        errs.iter().any(|e| e.contains("mongodb.compression_level")),
        "{errs:?}"
    );
}
