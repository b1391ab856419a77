//! The `wan` scenario: palletd writing through a slow, flaky link (netem).

use crate::*;

pub(crate) fn wan(args: WanArgs) -> anyhow::Result<()> {
    use palletd::testkit::netem::{Link, Proxy};
    let svc = Services::start(&args.run)?;
    let rt = tokio::runtime::Runtime::new()?;
    let link = Link {
        one_way: Duration::from_millis(args.rtt_ms / 2),
        bytes_per_sec: (args.mbit * 1e6 / 8.0) as u64,
    };
    let proxy = rt.block_on(Proxy::link(svc.db_port, link))?;
    let mut compressors = match args.compressors.as_str() {
        "none" => "compressors = []".to_string(),
        c => format!("compressors = [\"{c}\"]"),
    };
    if let Some(level) = args.compression_level {
        compressors += &format!("\ncompression_level = {level}");
    }
    let sink = start_sink_with(
        &args.run,
        &args.mode,
        &svc,
        &proxy.mongodb_uri(""),
        &compressors,
        "max_size = \"8GiB\"",
        &format!("[flush]\nmax_delay = \"{}\"", args.max_delay),
    )?;
    let probe = (args.probe_rate > 0.0).then(|| {
        Probe::start(
            &rt,
            svc.broker_port,
            svc.mongodb_uri(),
            args.probe_rate,
            &args.mode,
        )
    });
    let total_secs = 30 + args.before_secs + args.cut_secs + args.drain_limit_secs + 60;
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, total_secs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let decoded = |s: &Sink| -> f64 {
        http_get(s.procs[0].1, "/metrics")
            .ok()
            .and_then(|b| {
                b.lines()
                    .find(|l| l.starts_with(palletd::telemetry::SAMPLES_DECODED))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0.0)
    };
    eprintln!("warm-up 30 s");
    std::thread::sleep(Duration::from_secs(30));
    // Without a backlog.
    let (s0, b0) = (sink.scrape()?, proxy.bytes());
    let cpu0 = sink.cpu();
    let before_from = palletd::clock::now_ms();
    eprintln!("measuring {} s without a backlog", args.before_secs);
    std::thread::sleep(Duration::from_secs(args.before_secs));
    let (s1, b1) = (sink.scrape()?, proxy.bytes());
    let cpu = sink.cpu().saturating_sub(cpu0);
    let stored = (s1.stored - s0.stored).max(1.0);
    let mut out = json!({
        "scenario": "wan",
        "mode": args.mode,
        "compressors": args.compressors,
        "rtt_ms": args.rtt_ms,
        "mbit": args.mbit,
        "sensors": args.sensors,
        "rate": args.rate,
        "stored_per_s": stored / args.before_secs as f64,
        "wire_bytes_up_per_reading": (b1.0 - b0.0) as f64 / stored,
        "wire_bytes_down_per_reading": (b1.1 - b0.1) as f64 / stored,
        "cpu_us_per_reading": cpu.as_secs_f64() * 1e6 / stored,
        "lag_p50_s": quantile(&s0.live_age, &s1.live_age, 0.5),
        "lag_p99_s": quantile(&s0.live_age, &s1.live_age, 0.99),
    });
    let before_to = palletd::clock::now_ms();
    eprintln!("{out}");
    if args.cut_secs > 0 {
        let spool_dir = svc.dir.path().join("spool-0");
        let spool_before = spool_sizes(&spool_dir)?;
        let decoded_before = decoded(&sink);
        eprintln!("link cut for {} s", args.cut_secs);
        proxy.cut();
        std::thread::sleep(Duration::from_secs(args.cut_secs));
        let spool_after = spool_sizes(&spool_dir)?;
        let spooled = (decoded(&sink) - decoded_before).max(1.0);
        out["spool_bytes_per_reading"] =
            json!((spool_after.0 as f64 - spool_before.0 as f64) / spooled);
        out["spool_plain_bytes_per_reading"] =
            json!((spool_after.1 as f64 - spool_before.1 as f64) / spooled);
        proxy.restore();
        let restored = Instant::now();
        let restored_ms = palletd::clock::now_ms();
        let s2 = sink.scrape()?;
        eprintln!("link restored; draining");
        let mut peak_backlog: f64 = 0.0;
        let mut drained = None;
        let mut s3 = s2.clone();
        let mut settled = None;
        while restored.elapsed() < Duration::from_secs(args.drain_limit_secs) {
            std::thread::sleep(Duration::from_secs(1));
            s3 = sink.scrape()?;
            if settled.is_none() && restored.elapsed() >= Duration::from_secs(args.settle_secs) {
                settled = Some(s3.clone());
            }
            peak_backlog = peak_backlog.max(s3.backlog_readings);
            let caught_up = s3.stored >= decoded(&sink) - args.rate * 15.0;
            if restored.elapsed() > Duration::from_secs(5)
                && s3.backlog_readings == 0.0
                && caught_up
            {
                drained = Some(restored.elapsed().as_secs_f64());
                break;
            }
        }
        out["backlog_readings_peak"] = json!(peak_backlog);
        out["drained_after_s"] = json!(drained);
        out["drain_per_s"] = json!(drained.map(|d| peak_backlog / d));
        out["live_lag_p50_from_restore_s"] = json!(quantile(&s2.live_age, &s3.live_age, 0.5));
        out["live_lag_p99_from_restore_s"] = json!(quantile(&s2.live_age, &s3.live_age, 0.99));
        out["settle_s"] = json!(args.settle_secs);
        if let Some(s) = &settled {
            out["live_lag_p50_while_draining_s"] = json!(quantile(&s.live_age, &s3.live_age, 0.5));
            out["live_lag_p99_while_draining_s"] = json!(quantile(&s.live_age, &s3.live_age, 0.99));
        }
        if let Some(probe) = &probe {
            // Every probe reading of the window after the cut stored, or a
            // minute more at most.
            let after_to = restored_ms + args.after_secs as i64 * 1000;
            let deadline = Instant::now() + Duration::from_secs(60);
            while (palletd::clock::now_ms() < after_to + 1000
                || probe.unseen(restored_ms, after_to) > 0)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            // (The last 15 s before the cut are left out: their flushes
            // meet the cut.)
            let mut before = probe.lags(before_from, before_to - 15_000);
            let mut after = probe.lags(restored_ms, after_to);
            out["probe_rate"] = json!(args.probe_rate);
            out["probe_lag_p50_before_s"] = json!(quantile_of(&mut before, 0.5));
            out["probe_lag_p99_before_s"] = json!(quantile_of(&mut before, 0.99));
            out["probe_lag_p50_after_s"] = json!(quantile_of(&mut after, 0.5));
            out["probe_lag_p99_after_s"] = json!(quantile_of(&mut after, 0.99));
            out["probe_lag_max_after_s"] = json!(after.last());
            out["probe_after_secs"] = json!(args.after_secs);
            out["probe_restored_ms"] = json!(restored_ms);
        }
    }
    if let Some(probe) = &probe {
        // Everything the probe published stored, or a minute more at most.
        probe.quiet.cancel();
        let deadline = Instant::now() + Duration::from_secs(60);
        while probe.unseen(0, i64::MAX) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        let (published, once, more) = probe.tally();
        let restored = out["probe_restored_ms"].as_i64().unwrap_or(0);
        out["probe_unseen_s_after_restore"] = json!(probe
            .unseen_ts()
            .iter()
            .map(|ts| (ts - restored) as f64 / 1000.0)
            .collect::<Vec<_>>());
        out["probe_published"] = json!(published);
        out["probe_stored_once"] = json!(once);
        out["probe_stored_more_than_once"] = json!(more);
    }
    let _ = sim.kill();
    let _ = sim.wait();
    drop(sink);
    println!("{}", serde_json::to_string_pretty(&out)?);
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!(
        "wan-{}-{}-{}.json",
        args.mode,
        args.compressors,
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    );
    std::fs::write(args.run.out.join(name), serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

/// Publish time (ms) of each probe reading -> when first seen stored (ms;
/// absent while not seen), and how many copies were seen.
pub(crate) type ProbeSeen = Arc<std::sync::Mutex<BTreeMap<i64, (Option<i64>, u32)>>>;

/// The WAN scenario's probe: one sensor the bench publishes itself (QoS 1,
/// stamped with the time of publishing) and watches for in the database
/// directly, every 100 ms, so each reading's publish-to-durable lag is
/// measured from outside palletd.
pub(crate) struct Probe {
    pub(crate) seen: ProbeSeen,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// Stops the publishing alone.
    pub(crate) quiet: tokio_util::sync::CancellationToken,
}

impl Probe {
    const SENSOR: &'static str = "probe";

    pub(crate) fn start(
        rt: &tokio::runtime::Runtime,
        broker: u16,
        uri: String,
        rate: f64,
        mode: &str,
    ) -> Probe {
        let seen: ProbeSeen = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let mut opts = MqttOptions::new("bench-probe", "127.0.0.1", broker);
        opts.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(opts, 100);
        let halt = stop.clone();
        rt.spawn(async move {
            loop {
                tokio::select! {
                    _ = halt.cancelled() => return,
                    e = eventloop.poll() => if e.is_err() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    },
                }
            }
        });
        let quiet = stop.child_token();
        let (published, halt) = (seen.clone(), quiet.clone());
        let every = Duration::from_secs_f64(1.0 / rate);
        rt.spawn(async move {
            let topic = TOPIC.replace("{sensor}", Probe::SENSOR);
            let mut tick = tokio::time::interval(every);
            let mut last = 0;
            while !halt.is_cancelled() {
                tick.tick().await;
                // Distinct milliseconds, so each reading is its own key.
                let ts = palletd::clock::now_ms().max(last + 1);
                last = ts;
                published.lock().unwrap().insert(ts, (None, 0));
                let payload = json!({ "ts": ts, "v": ts % 1000 }).to_string();
                let _ = client
                    .publish(&topic, QoS::AtLeastOnce, false, payload)
                    .await;
            }
        });
        let (watched, halt, buckets) = (seen.clone(), stop.clone(), mode == "buckets");
        rt.spawn(async move {
            let client = match mongodb::Client::with_uri_str(&uri).await {
                Ok(c) => c,
                Err(e) => return eprintln!("probe watcher: {e}"),
            };
            let coll = client
                .database("bench")
                .collection::<bson::Document>("readings");
            while !halt.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let found = match probe_stored(&coll, buckets).await {
                    Ok(f) => f,
                    Err(_) => continue,
                };
                let now = palletd::clock::now_ms();
                let mut seen = watched.lock().unwrap();
                let mut copies: HashMap<i64, u32> = HashMap::new();
                for ts in found {
                    *copies.entry(ts).or_default() += 1;
                }
                for (ts, n) in copies {
                    let e = seen.entry(ts).or_insert((None, 0));
                    e.0.get_or_insert(now);
                    e.1 = e.1.max(n);
                }
            }
        });
        Probe { seen, stop, quiet }
    }

    /// Readings published in `[from, to)` (ms) not seen stored yet.
    pub(crate) fn unseen(&self, from: i64, to: i64) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.range(from..to)
            .filter(|(_, (at, _))| at.is_none())
            .count()
    }

    /// Lags (s) of the readings published in `[from, to)` (ms), those not
    /// stored yet counted as now.
    pub(crate) fn lags(&self, from: i64, to: i64) -> Vec<f64> {
        let now = palletd::clock::now_ms();
        let seen = self.seen.lock().unwrap();
        seen.range(from..to)
            .map(|(ts, (at, _))| (at.unwrap_or(now) - ts) as f64 / 1000.0)
            .collect()
    }

    /// The readings not seen stored (their publish times, ms).
    pub(crate) fn unseen_ts(&self) -> Vec<i64> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, (at, _))| at.is_none())
            .map(|(ts, _)| *ts)
            .collect()
    }

    /// Readings published, those stored once, those stored more than once.
    pub(crate) fn tally(&self) -> (usize, usize, usize) {
        let seen = self.seen.lock().unwrap();
        let once = seen
            .values()
            .filter(|(at, n)| at.is_some() && *n == 1)
            .count();
        let more = seen.values().filter(|(_, n)| *n > 1).count();
        (seen.len(), once, more)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The probe's readings stored (their timestamps, a copy each).
pub(crate) async fn probe_stored(
    coll: &mongodb::Collection<bson::Document>,
    buckets: bool,
) -> anyhow::Result<Vec<i64>> {
    let mut out = Vec::new();
    let filter = doc! { "sensorId": Probe::SENSOR };
    if buckets {
        let mut cur = coll
            .find(filter)
            .projection(doc! { "samples.ts": 1 })
            .await?;
        while let Some(d) = cur.try_next().await? {
            for s in d.get_array("samples")? {
                if let Some(t) = s.as_document().and_then(|s| s.get_datetime("ts").ok()) {
                    out.push(t.timestamp_millis());
                }
            }
        }
    } else {
        let mut cur = coll.find(filter).projection(doc! { "ts": 1 }).await?;
        while let Some(d) = cur.try_next().await? {
            out.push(d.get_datetime("ts")?.timestamp_millis());
        }
    }
    Ok(out)
}

/// The `q` quantile of `xs` (sorted in place); `None` when empty.
pub(crate) fn quantile_of(xs: &mut [f64], q: f64) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() as f64 * q).ceil() as usize).checked_sub(1)?;
    xs.get(i.min(xs.len() - 1)).copied()
}

/// The spool's bytes on disk, and as they would be uncompressed.
pub(crate) fn spool_sizes(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut disk, mut plain) = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let name = path.to_string_lossy().to_string();
        let len = std::fs::metadata(&path)?.len();
        if name.ends_with(".seg.zst") {
            disk += len;
            let mut d = zstd::stream::read::Decoder::new(std::fs::File::open(&path)?)?;
            plain += std::io::copy(&mut d, &mut std::io::sink())?;
        } else if name.ends_with(".seg") {
            disk += len;
            plain += len;
        }
    }
    Ok((disk, plain))
}
