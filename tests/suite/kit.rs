//! The operator's kit: the status page in a real browser (Chromium,
//! headless), the Debian package and what lintian says of it, the
//! Prometheus rules and Grafana dashboard, and the command line's
//! `--version`, completions and man page.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tool(names: &[&str]) -> PathBuf {
    find_binary("PALLETD_NO_SUCH_VARIABLE", names, &[])
}

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The text of the element with this id (`<x id="..." ...>text<`).
fn element(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[at..];
    let start = rest.find('>')? + 1;
    let end = rest[start..].find('<')?;
    Some(rest[start..start + end].trim().to_string())
}

/// A status-page chart's points: (ms, value) from its `data-points`.
fn chart_points(page: &str, id: &str) -> Vec<(i64, f64)> {
    let Some(at) = page.find(&format!("<svg id=\"{id}\"")) else {
        return Vec::new();
    };
    let rest = &page[at..];
    let start = rest.find("data-points=\"").expect("data-points") + 13;
    let end = start + rest[start..].find('"').expect("closing quote");
    rest[start..end]
        .split_whitespace()
        .map(|p| {
            let (t, v) = p.split_once(',').expect("t,v");
            (t.parse().unwrap(), v.parse().unwrap())
        })
        .collect()
}

fn chromium(args: &[&str]) -> (String, String) {
    let browser = tool(&["chromium", "chromium-browser"]);
    let profile = tempfile::tempdir().unwrap();
    let (ok, out, err) = run(Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args));
    assert!(ok, "chromium failed: {err}");
    (out, err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_a_browser_with_the_figures_of_metrics() {
    let mut stack = Stack::start("statuspage", |c| c).await;
    let mut publisher = stack.publisher().await;
    for seq in 0..20i64 {
        publisher
            .json(
                &format!("st-{}", seq % 4),
                serde_json::json!({ "seq": seq, "v": 1.5 }),
            )
            .await;
    }
    publisher
        .publish("sensors/broken/telemetry", "not json {")
        .await;
    publisher.flush().await;
    stack.wait_stored(20).await;
    stack
        .palletd
        .wait_until(
            Duration::from_secs(30),
            "the dead letter counted, the quiet sensors told",
            |p| {
                p.metric("palletd_dead_letters_total", None) >= 1.0
                    && http_get(p.http_port, "/").1.contains("st-3")
            },
        )
        .await;
    // The charts: a snapshot every 10 s; wait for one taken after all was
    // stored and counted.
    let stored_in_chart = |page: &str| {
        let points = chart_points(page, "chart-stored");
        let mut sum = 0.0;
        for (i, (t, v)) in points.iter().enumerate() {
            let dt = match i {
                0 => 10_000,
                _ => t - points[i - 1].0,
            };
            sum += v * dt as f64 / 1000.0;
        }
        sum
    };
    stack
        .palletd
        .wait_until(
            Duration::from_secs(40),
            "the charts showing every reading stored",
            |p| (stored_in_chart(&http_get(p.http_port, "/").1) - 20.0).abs() < 0.5,
        )
        .await;
    let url = format!("http://127.0.0.1:{}/", stack.palletd.http_port);
    let (dom, log) = chromium(&["--dump-dom", &url]);
    let metrics = &stack.palletd;
    // Each chart's points against the counters: readings stored per
    // second add up to what was stored, dead letters per interval to the
    // one counted; no backlog, no database error; the lag is that of
    // readings held for max_delay (1 s here).
    assert!((stored_in_chart(&dom) - 20.0).abs() < 0.5, "{dom}");
    let sum = |id: &str| chart_points(&dom, id).iter().map(|p| p.1).sum::<f64>();
    assert_eq!(
        sum("chart-dead-letters"),
        metrics.metric("palletd_dead_letters_total", None)
    );
    assert_eq!(sum("chart-db-errors"), 0.0);
    assert_eq!(sum("chart-backlog"), 0.0);
    let lag = chart_points(&dom, "chart-lag");
    assert!(!lag.is_empty(), "{dom}");
    assert!(lag.iter().all(|p| (0.0..10.0).contains(&p.1)), "{lag:?}");
    assert!(dom.matches("<svg id=\"chart-").count() == 5, "{dom}");

    // The figures are those of /metrics at the same moment (nothing moves:
    // every reading is stored).
    assert_eq!(element(&dom, "ready").as_deref(), Some("Ready"), "{dom}");
    assert_eq!(element(&dom, "broker").as_deref(), Some("connected"));
    assert_eq!(element(&dom, "database").as_deref(), Some("reachable"));
    let stored: f64 = element(&dom, "stored").unwrap().parse().unwrap();
    assert_eq!(stored, metrics.metric("palletd_samples_stored_total", None));
    assert_eq!(stored, 20.0);
    let backlog: f64 = element(&dom, "backlog").unwrap().parse().unwrap();
    assert_eq!(backlog, metrics.metric("palletd_backlog_readings", None));
    let scrape = metrics.scrape();
    let mut causes = 0;
    for sample in scrape
        .samples
        .iter()
        .filter(|s| s.metric == "palletd_dead_letters_total")
    {
        let cause = sample.labels.get("cause").unwrap();
        let value = match sample.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        if value > 0.0 {
            causes += 1;
            let shown: f64 = element(&dom, &format!("dead-{cause}"))
                .unwrap_or_else(|| panic!("dead letters of {cause} not shown: {dom}"))
                .parse()
                .unwrap();
            assert_eq!(shown, value, "{cause}");
        }
    }
    assert!(causes >= 1, "{dom}");
    for s in ["st-0", "st-1", "st-2", "st-3"] {
        assert!(
            dom.contains(&format!(
                "<td><a href=\"/?sensor={s}#sensor-charts\">{s}</a></td>"
            )),
            "{s} among the quiet sensors, its charts a click away: {dom}"
        );
    }
    let version = run(Command::new(env!("CARGO_BIN_EXE_palletd")).arg("--version")).1;
    assert_eq!(
        Some(version.trim().trim_start_matches("palletd ").to_string()),
        element(&dom, "version")
    );
    // No script errors, no failed loads (Chromium logs console messages).
    let console: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught") || l.contains("Failed to load"))
        .collect();
    assert!(console.is_empty(), "console: {console:?}");

    // And a screenshot, as in the README.
    let shot = stack.palletd.dir.path().join("status.png");
    chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1000,1000",
        "--hide-scrollbars",
        &url,
    ]);
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    if let Some(keep) = std::env::var_os("PALLETD_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    stack.stop();
}

/// A sensor's charts on the status page, in a real browser: a week of a
/// reading a minute (the Mauna Loa CO2 and El Nino series, real data),
/// rolled up by the hour; each field's chart has the points `/api/series`
/// answers for the parameters its link names (the week from the rollup,
/// the hour from the samples), the chooser lists the sensor, no script
/// runs and nothing fails to load; and a screenshot, as in the README.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensors_charts_render_in_a_browser_with_the_points_of_the_api() {
    let mut stack = Stack::start("sensorcharts", |c| {
        c.window("1h")
            .rollup("1h", false, None)
            .closer("200ms", "1s")
            .subscription(&[("topic", "kit/{sensor}/telemetry".into())])
    })
    .await;
    let port = stack.palletd.http_port;
    let co2 = co2();
    let sst = elnino();
    let minute = 60_000;
    let end = now_ms() / minute * minute;
    let week = 7 * 24 * 60;
    let mut publisher = stack.publisher().await;
    for k in 0..week {
        let v = serde_json::json!({
            "ts": end - (week - 1 - k) * minute,
            // Each series whole over the week.
            "co2": co2[k as usize * co2.len() / week as usize].1,
            "sst": sst[k as usize * sst.len() / week as usize],
        });
        publisher
            .publish("kit/greenhouse-1/telemetry", v.to_string())
            .await;
    }
    publisher.flush().await;
    stack.wait_stored(week as usize).await;
    // The past hours rolled up: the week is read from the rollup but for
    // the hours not settled yet (the open one, the one closing).
    let source = |path: &str| {
        let (_, head, _) = http_get_with(port, path, &[]);
        head.lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("x-palletd-source: ")
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    eventually(Duration::from_secs(60), "the week rolled up", || async {
        let s = source("/api/series?sensor=greenhouse-1&field=co2&from=7d&step=1h");
        s.starts_with("rollup:1h")
            && s.strip_prefix("rollup:1h+windows:")
                .is_none_or(|n| n.parse::<i64>().unwrap() <= 2)
    })
    .await;

    let page = |range: &str| format!("http://127.0.0.1:{port}/?sensor=greenhouse-1&range={range}");
    // The href of the element with this id.
    let href = |dom: &str, id: &str| -> String {
        let at = dom
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("{id}: {dom}"));
        let rest = &dom[at..];
        let start = rest.find("href=\"").unwrap() + 6;
        let end = start + rest[start..].find('"').unwrap();
        rest[start..end].replace("&amp;", "&")
    };
    for (range, steps, source_wanted) in [("week", 168, "rollup:1h"), ("hour", 60, "samples")] {
        let (dom, log) = chromium(&["--dump-dom", &page(range)]);
        assert!(
            dom.contains("<option value=\"greenhouse-1\">"),
            "the chooser lists the sensor: {dom}"
        );
        assert!(!dom.contains("<script"), "{dom}");
        for field in ["co2", "sst"] {
            let drawn = chart_points(&dom, &format!("sensor-{field}"));
            let api = href(&dom, &format!("sensor-{field}-json"));
            assert!(
                api.starts_with("/api/series?sensor=greenhouse-1&field="),
                "{api}"
            );
            assert!(
                source(&api).starts_with(source_wanted),
                "{api}: {}",
                source(&api)
            );
            let (status, body) = http_get(port, &api);
            assert_eq!(status, 200, "{body}");
            let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
            let answered: Vec<(i64, f64)> = rows
                .iter()
                .map(|r| {
                    let t = chrono::DateTime::parse_from_rfc3339(r["time"].as_str().unwrap());
                    (t.unwrap().timestamp_millis(), r["avg"].as_f64().unwrap())
                })
                .collect();
            assert_eq!(
                drawn, answered,
                "{range} of {field}: the chart against {api}"
            );
            // Every step of the range has a point (the newest minute may
            // not have come yet).
            assert!(
                drawn.len() <= steps && drawn.len() + 2 >= steps,
                "{range} of {field}: {} points",
                drawn.len()
            );
            let n: i64 = rows.iter().map(|r| r["n"].as_i64().unwrap()).sum();
            // Every reading of the range (the week's first hour may begin
            // before it): a reading a minute.
            let within = if range == "week" {
                week - 60..=week
            } else {
                58..=60
            };
            assert!(within.contains(&n), "{range} of {field}: {n} readings");
        }
        let console: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("CONSOLE") || l.contains("Uncaught") || l.contains("Failed to load")
            })
            .collect();
        assert!(console.is_empty(), "console: {console:?}");
    }

    // The sensors dashboard's queries (its variables' and panels'), as
    // Grafana's Infinity would send them: each answers, with the columns
    // the query names in every row.
    let text =
        std::fs::read_to_string(repo().join("deploy/grafana/palletd-sensors-dashboard.json"))
            .unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queries: Vec<&serde_json::Value> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["query"].get("infinityQuery"))
        .collect();
    for panel in dash["panels"].as_array().unwrap() {
        queries.extend(panel["targets"].as_array().unwrap());
    }
    assert_eq!(queries.len(), 4);
    let iso = |ms: i64| {
        let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    let (from, to) = (iso(end - 7 * 86_400_000), iso(end));
    let fill = |text: &str, field: &str| {
        text.replace("${palletd}", "")
            .replace("${sensor}", "greenhouse-1")
            .replace("${field}", field)
            .replace("${__from:date:iso}", &from)
            .replace("${__to:date:iso}", &to)
    };
    let mut fields_listed = Vec::new();
    for field in ["co2", "sst"] {
        for q in &queries {
            assert_eq!(q["datasource"]["type"], "yesoreyeram-infinity-datasource");
            assert_eq!(
                (q["type"].as_str(), q["source"].as_str()),
                (Some("json"), Some("url"))
            );
            let params: Vec<(String, String)> = q["url_options"]["params"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["key"].as_str().unwrap().to_string(),
                        fill(p["value"].as_str().unwrap(), field),
                    )
                })
                .collect();
            let url = fill(q["url"].as_str().unwrap(), field);
            let path = match params.is_empty() {
                true => url.clone(),
                false => format!("{url}?{}", serde_urlencoded::to_string(&params).unwrap()),
            };
            let (status, body) = http_get(port, &path);
            assert_eq!(status, 200, "{path}: {body}");
            let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
            assert!(!rows.is_empty(), "{path}");
            for c in q["columns"].as_array().unwrap() {
                let selector = c["selector"].as_str().unwrap();
                for r in &rows {
                    let v = &r[selector];
                    match c["type"].as_str().unwrap() {
                        "timestamp" => assert!(
                            chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or("")).is_ok(),
                            "{path}: {selector} of {r}"
                        ),
                        "number" => assert!(v.is_number(), "{path}: {selector} of {r}"),
                        _ => assert!(v.is_string(), "{path}: {selector} of {r}"),
                    }
                }
            }
            if url == "/api/fields" {
                fields_listed = rows.iter().map(|r| r["field"].clone()).collect();
            }
            if url == "/api/series" {
                // A week by default in whole windows: the hourly rollup.
                assert!(source(&path).starts_with("rollup:1h"), "{path}");
                assert!(rows.iter().all(|r| r["field"] == field));
            }
        }
    }
    assert_eq!(fields_listed, vec!["co2", "sst"]);

    let shot = stack.palletd.dir.path().join("sensor.png");
    chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=900,1000",
        "--hide-scrollbars",
        &page("week"),
    ]);
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    if let Some(keep) = std::env::var_os("PALLETD_KEEP_SENSOR_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }

    // The database down: the page does not wait on it, the charts say why,
    // and the API answers 503.
    stack.db.stop();
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "not ready", |p| {
            p.readyz().0 == 503
        })
        .await;
    let (status, body) = http_get(port, "/?sensor=greenhouse-1&range=week");
    assert_eq!(status, 200);
    assert!(
        body.contains("Cannot read its series: the database is unreachable"),
        "{body}"
    );
    assert!(body.contains("Not ready"), "{body}");
    let (status, body) = http_get(port, "/api/series?sensor=greenhouse-1");
    assert_eq!(status, 503, "{body}");
    stack.stop();
}

#[test]
fn version_completions_and_man_page_come_from_the_command_line() {
    let palletd = env!("CARGO_BIN_EXE_palletd");
    let (ok, version, _) = run(Command::new(palletd).arg("--version"));
    assert!(ok);
    let re =
        regex::Regex::new(r"^palletd \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}|unknown)\)\n$").unwrap();
    assert!(re.is_match(&version), "{version:?}");
    let (ok, bash, _) = run(Command::new(palletd).args(["completions", "bash"]));
    assert!(ok && bash.contains("check-config") && bash.contains("--shutdown-timeout"));
    let (ok, man, _) = run(Command::new(palletd).arg("manpage"));
    assert!(
        ok && man.contains(".TH palletd") && man.contains("simulate"),
        "{man}"
    );
}

/// Both dashboards against Grafana's own dashboard schema: the types
/// `@grafana/schema` generates from it, checked by TypeScript with excess
/// properties refused (a misspelt key, a wrong value fails; Grafana's
/// string enums taken as their values). `__inputs` is the import
/// format's, outside the schema.
#[test]
fn the_dashboards_pass_grafanas_dashboard_schema() {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap());
    let root = home.join(".cache/palletd-test/grafana-schema");
    let tsc = root.join("node_modules/typescript/bin/tsc");
    assert!(
        tsc.is_file() && root.join("node_modules/@grafana/schema").is_dir(),
        "no @grafana/schema and TypeScript in {}: {INSTALL_HINT}",
        root.display()
    );
    // Inside the root, so that the import finds its node_modules.
    let dir = tempfile::tempdir_in(&root).unwrap();
    let check = |name: &str, dash: &serde_json::Value| -> (bool, String) {
        let mut dash = dash.clone();
        dash.as_object_mut().unwrap().remove("__inputs");
        let file = dir.path().join(format!("{name}.ts"));
        std::fs::write(
            &file,
            format!(
                "import type {{ Dashboard }} from \"@grafana/schema/dist/esm/raw/dashboard/x/Dashboard_types.gen\";\n\
                 type Plain<T> = T extends string ? `${{T}}` : T extends number | boolean | null | undefined ? T : T extends Array<infer U> ? Array<Plain<U>> : {{ [K in keyof T]: Plain<T[K]> }};\n\
                 export const dashboard: Plain<Dashboard> = {};\n",
                serde_json::to_string_pretty(&dash).unwrap()
            ),
        )
        .unwrap();
        let (ok, out, err) = run(Command::new("node")
            .arg(&tsc)
            .args([
                "--strict",
                "--noEmit",
                "--moduleResolution",
                "bundler",
                "--module",
                "esnext",
                "--target",
                "es2020",
            ])
            .arg(&file));
        (ok, format!("{out}{err}"))
    };
    for name in ["palletd-dashboard", "palletd-sensors-dashboard"] {
        let text =
            std::fs::read_to_string(repo().join(format!("deploy/grafana/{name}.json"))).unwrap();
        let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (ok, out) = check(name, &dash);
        assert!(ok, "{name} against Grafana's schema:\n{out}");
        // The check can fail: a misspelt key is refused.
        let mut bad = dash.clone();
        let panel = bad["panels"][0].as_object_mut().unwrap();
        let pos = panel.remove("gridPos").unwrap();
        panel.insert("gridpos".into(), pos);
        let (ok, out) = check(&format!("{name}-bad"), &bad);
        assert!(!ok && out.contains("gridpos"), "{out}");
    }
}

/// Every `palletd_*` metric name palletd defines.
fn metric_names() -> Vec<String> {
    let src = std::fs::read_to_string(repo().join("src/telemetry/mod.rs")).unwrap();
    let re = regex::Regex::new(r#""(palletd_[a-z_]+)""#).unwrap();
    re.captures_iter(&src).map(|c| c[1].to_string()).collect()
}

/// The names of palletd metrics a PromQL text uses, each checked to exist
/// (a histogram's series end in _bucket).
fn assert_known_metrics(text: &str, what: &str) {
    let known = metric_names();
    let re = regex::Regex::new(r"palletd_[a-z_]+").unwrap();
    for m in re.find_iter(text) {
        let name = m.as_str();
        let base = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            known.iter().any(|k| k == name || k == base),
            "{what} uses {name}, which palletd does not export"
        );
    }
}

#[test]
fn alerting_rules_pass_promtool_and_their_unit_tests() {
    let promtool = tool(&["promtool"]);
    let dir = repo().join("deploy/prometheus");
    let (ok, out, err) = run(Command::new(&promtool)
        .args(["check", "rules", "palletd.rules.yml"])
        .current_dir(&dir));
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run(Command::new(&promtool)
        .args(["test", "rules", "palletd.rules.test.yml"])
        .current_dir(&dir));
    assert!(ok && out.contains("SUCCESS"), "{out}{err}");
    let rules = std::fs::read_to_string(dir.join("palletd.rules.yml")).unwrap();
    assert_known_metrics(&rules, "the alerting rules");
    for alert in [
        "PalletdNotReady",
        "PalletdBacklogGrowing",
        "PalletdDeadLettersRising",
        "PalletdSpoolNearlyFull",
        "PalletdNothingStored",
        "PalletdSpoolDamaged",
        "PalletdSpoolWritesFailing",
        "PalletdSpoolWriteErrors",
        "PalletdSpoolDiskLow",
    ] {
        let tests = std::fs::read_to_string(dir.join("palletd.rules.test.yml")).unwrap();
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} untested"
        );
    }
}

#[test]
fn the_dashboard_queries_parse_and_use_metrics_palletd_exports() {
    let text =
        std::fs::read_to_string(repo().join("deploy/grafana/palletd-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().replace("$instance", ".*"));
        }
    }
    assert!(exprs.len() >= 10);
    for wanted in [
        "palletd_samples_stored_total",
        "palletd_sample_age_at_write_seconds",
        "palletd_backlog_readings",
        "palletd_flush_duration_seconds",
        "palletd_dead_letters_total",
        "palletd_broker_reconnects_total",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(wanted)),
            "no panel shows {wanted}"
        );
    }
    assert_known_metrics(&exprs.join("\n"), "the dashboard");
    // promtool parses each query as a recording rule.
    let dir = tempfile::tempdir().unwrap();
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({ "record": format!("dashboard:query_{i}"), "expr": e }))
        .collect();
    let file = dir.path().join("queries.yml");
    // JSON is YAML.
    std::fs::write(
        &file,
        serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] }).to_string(),
    )
    .unwrap();
    let (ok, out, err) = run(Command::new(tool(&["promtool"]))
        .args(["check", "rules"])
        .arg(&file));
    assert!(ok, "{out}{err}");
}

/// Every metric the dashboard and the alerting rules name is in `/metrics`
/// on a fresh, healthy start, before anything happened: counters (by every
/// label value known in advance) at 0 and histograms empty, so a panel
/// shows 0, not "No data", and `increase(...) > 0` tells "none" from "not
/// scraped".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_kit_names_is_exported_from_the_start() {
    let stack = Stack::start("fresh", |c| c).await;
    let scrape = stack.palletd.scrape();
    fn series<'a>(
        scrape: &'a prometheus_parse::Scrape,
        name: &'a str,
    ) -> impl Iterator<Item = &'a prometheus_parse::Sample> + 'a {
        scrape.samples.iter().filter(move |s| s.metric == name)
    }
    let dash =
        std::fs::read_to_string(repo().join("deploy/grafana/palletd-dashboard.json")).unwrap();
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/palletd.rules.yml")).unwrap();
    let re = regex::Regex::new(r"palletd_[a-z_]+").unwrap();
    let mut named: Vec<&str> = re
        .find_iter(&dash)
        .chain(re.find_iter(&rules))
        .map(|m| m.as_str())
        .collect();
    named.sort();
    named.dedup();
    assert!(named.len() >= 20, "{named:?}");
    let missing: Vec<&str> = named
        .into_iter()
        // The kernel may not say whether the clock is synchronised: then
        // the gauge is absent by design (README, "Metrics and health").
        .filter(|name| {
            *name != "palletd_clock_synchronized"
                || palletd::telemetry::supervise::clock_synchronized().is_some()
        })
        // (A histogram's series are parsed under its own name.)
        .filter(|name| {
            let base = name.strip_suffix("_bucket").unwrap_or(name);
            series(&scrape, base).next().is_none()
        })
        .collect();
    assert!(
        missing.is_empty(),
        "not exported on a fresh start: {missing:?}"
    );
    // Counters a healthy box has not moved are there at 0, by label.
    for (name, label, value) in [
        ("palletd_broker_reconnects_total", None, None),
        (
            "palletd_database_errors_total",
            Some("kind"),
            Some("network"),
        ),
        (
            "palletd_database_errors_total",
            Some("kind"),
            Some("write_concern"),
        ),
        (
            "palletd_dead_letters_total",
            Some("cause"),
            Some("bad_payload"),
        ),
        (
            "palletd_dead_letters_total",
            Some("cause"),
            Some("time_out_of_range"),
        ),
        (
            "palletd_dead_letters_dropped_total",
            Some("cause"),
            Some("bad_payload"),
        ),
    ] {
        let found: Vec<f64> = series(&scrape, name)
            .filter(|s| label.is_none_or(|l| s.labels.get(l) == value))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .collect();
        assert_eq!(found, vec![0.0], "{name} {value:?}");
    }
    for cause in palletd::internals::DEAD_LETTER_CAUSES {
        assert!(
            series(&scrape, "palletd_dead_letters_total")
                .any(|s| s.labels.get("cause") == Some(cause)),
            "dead letters of {cause} at 0"
        );
    }
}

#[test]
fn the_debian_package_holds_the_kit_and_lintian_finds_no_errors() {
    let (ok, out, err) = run(Command::new(repo().join("scripts/package"))
        .env("PALLETD_PACKAGE_PROFILE", "dev")
        .current_dir(repo()));
    assert!(ok, "scripts/package failed:\n{out}\n{err}");
    let deb = PathBuf::from(out.lines().last().unwrap().trim());
    assert!(deb.is_file(), "{deb:?}");
    let (ok, contents, err) = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    assert!(ok, "{err}");
    for path in [
        "./usr/bin/palletd",
        "./etc/palletd/config.toml",
        "/palletd.service",
        "./usr/share/man/man1/palletd.1.gz",
        "./usr/share/bash-completion/completions/palletd",
        "./usr/share/doc/palletd/README.md",
        "./usr/share/doc/palletd/docs/how-it-writes.md",
        "./usr/share/doc/palletd/docs/status-page.png",
        "./usr/share/doc/palletd/copyright",
        "./usr/share/palletd/prometheus/palletd.rules.yml",
        "./usr/share/palletd/grafana/palletd-dashboard.json",
        "./usr/share/palletd/grafana/palletd-sensors-dashboard.json",
        "./usr/share/doc/palletd/docs/sensor-charts.png",
    ] {
        assert!(contents.contains(path), "{path} missing:\n{contents}");
    }
    let (_, conffiles, _) = run(Command::new("dpkg-deb")
        .args(["--info"])
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/palletd/config.toml");
    // The unit runs the packaged binary.
    let x = tempfile::tempdir().unwrap();
    assert!(run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(x.path())).0);
    let unit = [
        "lib/systemd/system/palletd.service",
        "usr/lib/systemd/system/palletd.service",
    ]
    .iter()
    .map(|p| x.path().join(p))
    .find(|p| p.is_file())
    .expect("the unit is in the package");
    let unit = std::fs::read_to_string(unit).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/palletd run"), "{unit}");
    let config = std::fs::read_to_string(x.path().join("etc/palletd/config.toml")).unwrap();
    assert_eq!(config, palletd::config::EXAMPLE);
    let (ok, out, err) = run(Command::new(tool(&["lintian"]))
        .args(["--fail-on", "error", "--tag-display-limit", "0"])
        .arg(&deb));
    eprintln!("lintian:\n{out}{err}");
    assert!(ok, "lintian found errors:\n{out}{err}");
}

/// The README is the front door: its links and the documents' links to
/// each other point at files that exist, and every document links back.
#[test]
fn the_readme_and_the_documents_link_to_files_that_exist() {
    let re = regex::Regex::new(r"\]\(([^)#\s]+)(#[^)\s]*)?\)").unwrap();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 6, "{docs:?}");
    let readme = repo().join("README.md");
    let front = std::fs::read_to_string(&readme).unwrap();
    for doc in &docs {
        let name = format!("docs/{}", doc.file_name().unwrap().to_string_lossy());
        assert!(
            front.contains(&format!("]({name}")),
            "README does not link {name}"
        );
        let text = std::fs::read_to_string(doc).unwrap();
        assert!(
            text.contains("](../README.md)"),
            "{name} does not link back"
        );
    }
    // The repository's paths the documents name in code spans exist (a
    // layout table once named files that had moved).
    let named = regex::Regex::new(
        r"`((?:src|tests|scripts|deploy|examples|docs|bench|\.ci)/[A-Za-z0-9_./-]*)`",
    )
    .unwrap();
    let contributing = repo().join("CONTRIBUTING.md");
    for file in [&readme, &contributing].into_iter().chain(&docs) {
        let text = std::fs::read_to_string(file).unwrap();
        for c in named.captures_iter(&text) {
            assert!(
                repo().join(&c[1]).exists(),
                "{} names {}, which does not exist",
                file.display(),
                &c[1]
            );
        }
    }
    for file in [&readme, &contributing].into_iter().chain(&docs) {
        let text = std::fs::read_to_string(file).unwrap();
        let dir = file.parent().unwrap();
        for c in re.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http") {
                continue;
            }
            assert!(
                dir.join(target).exists(),
                "{} links to {target}, which does not exist",
                file.display()
            );
        }
    }
}
