//! The command line as an operator meets it: print-config, check-config and
//! exit codes. No services needed.

use std::process::{Command, Output};

fn palletd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_palletd"))
        .args(args)
        .output()
        .unwrap()
}

fn check(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palletd.toml");
    std::fs::write(&path, text).unwrap();
    let out = palletd(&["check-config", "--config", path.to_str().unwrap()]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn print_config_is_the_example_file_and_it_validates() {
    let out = palletd(&["print-config"]);
    assert!(out.status.success());
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml.example"))
            .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), example);
    let (code, text) = check(&example);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("configuration is valid"), "{text}");
    // Its thinning example, uncommented, is valid too.
    let (head, rest) = example
        .split_once("# [subscription.thinning.temp]")
        .unwrap();
    let (block, tail) = rest.split_once("\n\n").unwrap();
    let block: Vec<&str> = block
        .lines()
        .map(|l| l.strip_prefix("# ").unwrap_or(l))
        .collect();
    let thinned = format!(
        "{head}[subscription.thinning.temp]{}\n\n{tail}",
        block.join("\n")
    );
    let (code, text) = check(&thinned);
    assert_eq!(code, Some(0), "{text}\n{thinned}");
}

#[test]
fn invalid_configs_exit_78_naming_the_offending_path() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml.example"))
            .unwrap();
    let cases: Vec<(String, &[&str])> = vec![
        (
            example.replace("keep_alive = \"30s\"", "keep_alive = \"thirty\""),
            &["mqtt.keep_alive:"],
        ),
        (
            example.replace("max_bytes = \"256KiB\"", "max_bytes = \"64MiB\""),
            &["bucket.max_bytes:"],
        ),
        (
            example.replace("client_id = \"palletd-edge-1\"", "client_idd = \"x\""),
            &[
                "mqtt.client_idd: unknown field",
                "mqtt.client_id: required key is missing",
            ],
        ),
        (
            example.replace("format = \"number\"", "format = \"xml\""),
            &["subscription[1].format:"],
        ),
        (
            example
                .replace("write_concern = \"majority\"", "write_concern = \"most\"")
                .replace("max_delay = \"10s\"", "max_delay = \"0s\""),
            &["mongodb.write_concern:", "flush.max_delay:"],
        ),
        (
            example.replace("url = \"mqtt://127.0.0.1:1883\"", "url = \"http://broker\""),
            &["mqtt.url:"],
        ),
        (
            example.clone() + "\n[surprise]\nx = 1\n",
            &["surprise: unknown section"],
        ),
    ];
    for (text, needles) in cases {
        let (code, out) = check(&text);
        assert_eq!(code, Some(78), "{out}");
        for n in needles {
            assert!(out.contains(n), "expected {n:?} in:\n{out}");
        }
    }
}

#[test]
fn check_config_warns_when_the_write_concern_cannot_give_exactly_once() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml.example"))
            .unwrap();
    let (code, out) = check(&example);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        !out.contains("warning:"),
        "the defaults warn of nothing: {out}"
    );
    let weak = example.replace("write_concern = \"majority\"", "write_concern = 1");
    let (code, out) = check(&weak);
    assert_eq!(code, Some(0), "a warning, not an error: {out}");
    assert!(
        out.contains("warning: mongodb.write_concern = 1") && out.contains("roll it back"),
        "{out}"
    );
    let unjournaled = example.replace("journal = true", "journal = false");
    let (_, out) = check(&unjournaled);
    assert!(out.contains("warning: mongodb.journal = false"), "{out}");
}

#[test]
fn run_with_a_bad_config_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[mqtt]\n").unwrap();
    let out = palletd(&["--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mqtt.url: required key is missing"));
    let out = palletd(&["run", "--config", "/nonexistent/palletd.toml"]);
    assert_eq!(out.status.code(), Some(78));
}

/// Every preset prints as a whole configuration that check-config takes;
/// an unknown one is named with the ones there are.
#[test]
fn print_config_with_a_preset_validates() {
    for name in palletd::config::presets::PRESETS.iter().map(|p| p.0) {
        let out = palletd(&["print-config", "--preset", name]);
        assert!(out.status.success(), "{name}");
        let text = String::from_utf8(out.stdout).unwrap();
        let (code, checked) = check(&text);
        assert_eq!(code, Some(0), "{name}: {checked}");
    }
    let out = palletd(&["print-config", "--preset", "tasmato"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"tasmota\""));
}

/// `palletd try` prints what a payload would be stored as, what would be
/// left out, and the dead letter (exit 2), storing nothing.
#[test]
fn try_shows_the_samples_a_payload_becomes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lamp.json");
    let long = "x".repeat(2000);
    std::fs::write(
        &file,
        format!(r#"{{"state":"ON","color":{{"x":0.4573,"y":0.41}},"note":"{long}","update":{{"state":"idle"}}}}"#),
    )
    .unwrap();
    let out = palletd(&[
        "try",
        "--preset",
        "zigbee2mqtt",
        "--topic",
        "zigbee2mqtt/lamp",
        file.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{text}");
    let mut lines = text.lines();
    let sample: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(sample["sensor"], "lamp");
    assert_eq!(
        sample["fields"],
        serde_json::json!({"state": "ON", "color%2Ex": 0.4573, "color%2Ey": 0.41})
    );
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("left out (string_too_long): sample 0: field \"note\""),
        "{text}"
    );
    let out = palletd(&[
        "try",
        "--preset",
        "zigbee2mqtt",
        "--topic",
        "zigbee2mqtt/bridge/state",
        file.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.starts_with("dead letter (unknown_topic)"), "{text}");
    // Homie's attributes are skipped; a value as the broker resends it on
    // subscribe (retained = "changed", the preset's: try keeps no history,
    // so it is the topic's first value) and as it is published are read.
    for (topic, retained, want) in [
        ("homie/car/engine/$name", false, "skipped (metadata)"),
        ("homie/car/engine/temperature", true, "{\"sensor\":\"car\""),
        ("homie/car/engine/temperature", false, "{\"sensor\":\"car\""),
    ] {
        let mut args = vec!["try", "--preset", "homie", "--topic", topic];
        if retained {
            args.push("--retained");
        }
        args.push(file.to_str().unwrap());
        std::fs::write(&file, "21.5").unwrap();
        let out = palletd(&args);
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{topic}: {text}");
        assert!(text.starts_with(want), "{topic}: {text}");
    }
}

/// The selection keys are checked like every other: a bad pointer, zone,
/// separator or arrays value names its path; keys of the wrong format too.
#[test]
fn selection_keys_are_validated() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml.example"))
            .unwrap();
    let first = "topic = \"sensors/{sensor}/telemetry\"\n";
    for (add, want) in [
        (
            "root = \"params\"\n",
            "subscription[0].root: \"params\" is not a JSON Pointer",
        ),
        ("include = [\"/a~2\"]\n", "subscription[0].include:"),
        ("timezone = \"Mars/Olympus\"\n", "subscription[0].timezone:"),
        ("arrays = \"keep\"\n", "subscription[0].arrays:"),
        ("flatten = \"\"\n", "subscription[0].flatten:"),
        ("rename = { \"/a\" = \"$x\" }\n", "subscription[0].rename."),
        (
            "retained = \"drop\"\n",
            "subscription[0].retained: must be one of \"changed\", \"store\", \"skip\"",
        ),
    ] {
        let (code, text) = check(&example.replacen(first, &format!("{first}{add}"), 1));
        assert_eq!(code, Some(78), "{add}: {text}");
        assert!(text.contains(want), "{add}: {text}");
    }
    let number = "format = \"number\"\n";
    let (code, text) =
        check(&example.replacen(number, &format!("{number}include = [\"/a\"]\n"), 1));
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains("subscription[1].include: needs format = \"json\""),
        "{text}"
    );
}

/// A configuration file that holds a secret itself (`mqtt.password`, a
/// password in `mongodb.uri`) is warned about while every user can read
/// it (the package installs it 0644), and not once it is 0600.
#[test]
fn a_readable_config_with_inline_secrets_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml.example"))
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palletd.toml");
    let check = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = palletd(&["check-config", "--config", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    std::fs::write(&path, &example).unwrap();
    assert!(!check(0o644).contains("readable by every user"));
    let secret = example
        .replacen(
            "[mqtt]\n",
            "[mqtt]\nusername = \"palletd\"\npassword = \"s3cret\"\n",
            1,
        )
        .replace(
            "mongodb://127.0.0.1:27017",
            "mongodb://palletd:pw@127.0.0.1:27017",
        );
    assert_ne!(secret, example);
    std::fs::write(&path, &secret).unwrap();
    let text = check(0o644);
    assert!(
        text.contains(
            "holds mqtt.password and a password in mongodb.uri and is readable by every user"
        ),
        "{text}"
    );
    assert!(!text.contains("s3cret") && !text.contains(":pw@"), "{text}");
    assert!(!check(0o600).contains("readable by every user"));
    // The HTTP endpoint's token too.
    let token = example.replacen(
        "listen = \"127.0.0.1:9464\"\n",
        "listen = \"127.0.0.1:9464\"\ntoken = \"t0ken\"\n",
        1,
    );
    assert_ne!(token, example);
    std::fs::write(&path, &token).unwrap();
    let text = check(0o644);
    assert!(
        text.contains("holds http.token and is readable by every user"),
        "{text}"
    );
    assert!(!text.contains("t0ken"), "{text}");
}
