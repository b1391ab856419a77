//! Reading a sink's figures: its metrics, CPU and peak RSS.

use crate::*;

/// What a sink reported at one moment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    pub(crate) stored: f64,
    /// Bucket bytes the database rewrote (palletd in bucket mode only).
    pub(crate) rewritten: f64,
    /// Histogram of reading age: upper bound -> cumulative count (all
    /// lanes), and of the readings palletd wrote as live ones.
    pub(crate) age: Vec<(f64, f64)>,
    pub(crate) live_age: Vec<(f64, f64)>,
    /// palletd's backlog gauges.
    pub(crate) backlog_readings: f64,
    pub(crate) drain_rate: f64,
    /// palletd's spool fsyncs (group commits).
    pub(crate) fsyncs: f64,
}

/// Adds histogram `h` (cumulative buckets) into `into`.
pub(crate) fn add_histogram(into: &mut Vec<(f64, f64)>, h: &[(f64, f64)]) {
    if into.is_empty() {
        *into = h.to_vec();
    } else {
        for (i, (_, n)) in into.iter_mut().enumerate() {
            *n += h.get(i).map_or(0.0, |b| b.1);
        }
    }
}

impl Sink {
    /// The sum of what every process reports.
    pub(crate) fn scrape(&self) -> anyhow::Result<Scrape> {
        let mut out = Scrape::default();
        for (_, port) in &self.procs {
            let one = scrape_one(*port)?;
            out.stored += one.stored;
            out.rewritten += one.rewritten;
            add_histogram(&mut out.age, &one.age);
            add_histogram(&mut out.live_age, &one.live_age);
            out.backlog_readings += one.backlog_readings;
            out.drain_rate += one.drain_rate;
            out.fsyncs += one.fsyncs;
        }
        Ok(out)
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.0 .0.id()).collect()
    }

    /// User + system CPU time so far, of all processes.
    pub(crate) fn cpu(&self) -> Duration {
        self.pids().into_iter().map(cpu_of).sum()
    }

    /// The processes' peak RSS, summed (each process's own peak).
    pub(crate) fn peak_rss(&self) -> u64 {
        self.pids().into_iter().map(peak_rss_of).sum()
    }
}

pub(crate) fn scrape_one(port: u16) -> anyhow::Result<Scrape> {
    let body = http_get(port, "/metrics")?;
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines)?;
    let mut out = Scrape::default();
    for s in parsed.samples {
        if s.metric == palletd::telemetry::SAMPLES_STORED {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.stored = v;
            }
        } else if s.metric == palletd::telemetry::BYTES_REWRITTEN {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.rewritten = v;
            }
        } else if s.metric == palletd::telemetry::SAMPLE_AGE_SECONDS {
            if let prometheus_parse::Value::Histogram(h) = &s.value {
                let h: Vec<(f64, f64)> = h.iter().map(|b| (b.less_than, b.count)).collect();
                add_histogram(&mut out.age, &h);
                if s.labels.get("lane") == Some("live") {
                    out.live_age = h;
                }
            }
        } else if s.metric == palletd::telemetry::BACKLOG_READINGS {
            if let prometheus_parse::Value::Gauge(v) = s.value {
                out.backlog_readings = v;
            }
        } else if s.metric == palletd::telemetry::BACKLOG_DRAIN_RATE {
            if let prometheus_parse::Value::Gauge(v) = s.value {
                out.drain_rate = v;
            }
        } else if s.metric == palletd::telemetry::SPOOL_FSYNCS {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.fsyncs = v;
            }
        }
    }
    Ok(out)
}

/// User + system CPU time of a process so far.
pub(crate) fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime and stime are fields 14 and 15 (proc(5)).
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        f.get(n - 3)
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = field(14) + field(15);
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

/// Peak resident set size (VmHWM) of a process, in bytes.
pub(crate) fn peak_rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub(crate) fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

pub(crate) fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let (_, body) = body.split_once("\r\n\r\n").unwrap_or(("", ""));
    Ok(body.to_string())
}

/// The q-quantile (0..1) of the readings counted between two histograms.
pub(crate) fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before.iter().find(|x| x.0 == *le).map_or(0.0, |x| x.1);
            (*le, n - b)
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let want = total * q;
    let mut prev = (0.0, 0.0);
    for (le, n) in diff {
        if n >= want {
            if !le.is_finite() {
                return Some(prev.0);
            }
            // Linear inside the bucket.
            let share = if n > prev.1 {
                (want - prev.1) / (n - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * share);
        }
        prev = (le, n);
    }
    None
}

/// Database write commands and write operations so far, from serverStatus.
/// The database's write counters: (write commands, write operations as
/// `opcounters` counts them (an `insert_many` is one, each update
/// statement one), documents written (`metrics.document`: inserted,
/// updated, deleted)).
pub(crate) async fn db_writes(uri: &str) -> anyhow::Result<(f64, f64, f64)> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    let s = client
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await?;
    let num = |d: Option<&bson::Bson>| match d {
        Some(bson::Bson::Int32(x)) => *x as f64,
        Some(bson::Bson::Int64(x)) => *x as f64,
        Some(bson::Bson::Double(x)) => *x,
        _ => 0.0,
    };
    let cmds = s
        .get_document("metrics")
        .and_then(|m| m.get_document("commands"))
        .ok();
    let commands: f64 = ["insert", "update", "delete"]
        .iter()
        .map(|c| {
            cmds.and_then(|m| m.get_document(c).ok())
                .map_or(0.0, |d| num(d.get("total")))
        })
        .sum();
    let ops = s.get_document("opcounters").ok();
    let operations: f64 = ["insert", "update", "delete"]
        .iter()
        .map(|c| ops.map_or(0.0, |o| num(o.get(*c))))
        .sum();
    let docs = s
        .get_document("metrics")
        .and_then(|m| m.get_document("document"))
        .ok();
    let documents: f64 = ["inserted", "updated", "deleted"]
        .iter()
        .map(|c| docs.map_or(0.0, |d| num(d.get(*c))))
        .sum();
    Ok((commands, operations, documents))
}

/// Asks the database for a checkpoint, then sums its data directory.
pub(crate) async fn data_bytes(uri: &str, dir: &Path) -> anyhow::Result<u64> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    client
        .database("admin")
        .run_command(doc! { "fsync": 1 })
        .await?;
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| match e.metadata() {
                        Ok(m) if m.is_dir() => walk(&e.path()),
                        Ok(m) => m.len(),
                        Err(_) => 0,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    Ok(walk(dir))
}
