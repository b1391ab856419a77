//! The import rule of `src/lib.rs`, checked: the core (sans-IO: config,
//! payload formats, buckets, flushes, dead letters, the record format, the
//! pipeline's state and policies) never names an edge (a task, a socket, a
//! file, metrics). A core file that mentions `crate::<edge>` or
//! `super::<edge>`, or uses `tokio` or the `metrics` facade, outside
//! comments, fails this test, with the line.

use std::path::{Path, PathBuf};

/// The core: files and folders under `src/`.
const CORE: &[&str] = &[
    "bucket",
    "clock.rs",
    "config",
    "deadletter.rs",
    "decode",
    "front",
    "handoff.rs",
    "record.rs",
    "spool_ids.rs",
    "thin.rs",
    "pipeline/backlog.rs",
    "pipeline/state",
    "pipeline/pending.rs",
    "pipeline/policy.rs",
];

/// The edges: what the core must not name.
const EDGES: &[&str] = &[
    "ingest",
    "admission",
    "spool",
    "store",
    "telemetry",
    "web",
    "simulate",
    "query",
    "shutdown",
    "testkit",
    "netem",
    "task",
];

fn files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            files(&e.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// `crate::x`, `super::x` or `pipeline::x` naming an edge, in code (not in
/// comments): (line number, line).
fn violations(text: &str) -> Vec<(usize, String)> {
    let names = EDGES.join("|");
    // `crate::spool`, or `crate::{bucket, spool}`.
    let re = regex::Regex::new(&format!(
        r"\b(crate|super|pipeline)::(({names})\b|\{{[^}}]*\b({names})\b)"
    ))
    .unwrap();
    let io = regex::Regex::new(r"\b(tokio|metrics)::").unwrap();
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.split("//").next().unwrap_or("");
            re.is_match(code) || io.is_match(code)
        })
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

#[test]
fn the_core_never_names_an_edge() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut core = Vec::new();
    for c in CORE {
        let p = src.join(c);
        assert!(p.exists(), "{} is listed as core but missing", p.display());
        files(&p, &mut core);
    }
    let mut found = Vec::new();
    for f in &core {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in violations(&text) {
            found.push(format!(
                "{}:{n}: {line}",
                f.strip_prefix(&src).unwrap().display()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "the core names an edge (src/lib.rs: imports run from the edges to the core):\n{}",
        found.join("\n")
    );
}

/// The check itself: a wrong import is found, a comment is not.
#[test]
fn the_check_finds_an_edge_named_in_code_and_not_in_a_comment() {
    assert_eq!(
        violations("use crate::telemetry;\n// see crate::spool::Spool\nuse crate::bucket;\n"),
        vec![(1, "use crate::telemetry;".to_string())]
    );
    assert_eq!(violations("let x = super::task::run();").len(), 1);
    assert_eq!(violations("use crate::{bucket, store::Store};").len(), 1);
    assert!(violations("use crate::spool_settings;").is_empty());
    assert_eq!(violations("metrics::counter!(X).increment(1);").len(), 1);
    assert_eq!(violations("tokio::time::sleep(d).await;").len(), 1);
}

/// The edges import one way too: the store records metrics and health
/// (`crate::telemetry`), the endpoints (`crate::web`) read the store and
/// the telemetry; telemetry names neither, so there is no circle.
#[test]
fn telemetry_names_neither_the_store_nor_the_endpoints() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut telemetry = Vec::new();
    files(&src.join("telemetry"), &mut telemetry);
    let re = regex::Regex::new(r"\bcrate::(store|web)\b").unwrap();
    let mut found = Vec::new();
    for f in &telemetry {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, l) in text.lines().enumerate() {
            let code = l.split("//").next().unwrap_or("");
            if re.is_match(code) {
                found.push(format!("{}:{}: {}", f.display(), i + 1, l.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "telemetry names an edge above it:\n{}",
        found.join("\n")
    );
}
