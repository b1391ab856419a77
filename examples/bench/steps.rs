//! The stepped rates of a `run` scenario and whether each was sustained.

use crate::*;

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Step {
    pub(crate) target_per_s: f64,
    pub(crate) seconds: f64,
    pub(crate) published: u64,
    pub(crate) durable: u64,
    pub(crate) achieved_per_s: f64,
    pub(crate) simulator_max_lag_s: f64,
    /// Largest backlog (published minus durable) seen, in readings.
    pub(crate) max_backlog: f64,
    pub(crate) drained_after_s: Option<f64>,
    pub(crate) sustained: bool,
    pub(crate) note: String,
}

pub(crate) struct Measured {
    pub(crate) step: Step,
    pub(crate) before: Scrape,
    pub(crate) after: Scrape,
    pub(crate) cpu: Duration,
}

/// `palletd simulate` offering `total` readings/s from `sensors` JSON
/// sensors for `secs` seconds (QoS 1, one reading per message).
pub(crate) fn simulator(
    args: &RunArgs,
    svc: &Services,
    sensors: usize,
    total: f64,
    secs: u64,
) -> Command {
    let mut sim = Command::new(&args.palletd);
    sim.arg("simulate")
        .arg("--url")
        .arg(format!("mqtt://127.0.0.1:{}", svc.broker_port))
        .args(["--sensors", &sensors.to_string(), "--rate"])
        .arg(format!("{}", total / sensors as f64))
        .arg("--duration")
        .arg(format!("{secs}s"))
        .args(["--topic", TOPIC, "--batch-share", "0", "--qos", "1"])
        .args(["--sensor-prefix", "s"]);
    sim
}

/// Offers `total` readings/s for `secs` seconds and watches the sink.
pub(crate) fn step(
    args: &RunArgs,
    svc: &Services,
    sink: &Sink,
    sensors: usize,
    total: f64,
    secs: u64,
) -> anyhow::Result<Measured> {
    let before = sink.scrape()?;
    let cpu_before = sink.cpu();
    let started = Instant::now();
    let mut sim = simulator(args, svc, sensors, total, secs)
        .args(if sink.sparkplug {
            &["--format", "sparkplug_b", "--devices-per-node", "10"][..]
        } else {
            &[]
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut max_backlog: f64 = 0.0;
    // (seconds into the step, backlog) once a second.
    let mut backlog_at: Vec<(f64, f64)> = Vec::new();
    let mut note = String::new();
    // A runaway backlog ends the step early (it cannot be sustained).
    let limit = (total * 30.0).max(50_000.0);
    let status = loop {
        if let Some(status) = sim.try_wait()? {
            break Some(status);
        }
        std::thread::sleep(Duration::from_millis(1000));
        let elapsed = started.elapsed().as_secs_f64().min(secs as f64);
        let durable = sink
            .scrape()
            .map(|s| s.stored - before.stored)
            .unwrap_or(0.0);
        let backlog = (total * elapsed - durable).max(0.0);
        max_backlog = max_backlog.max(backlog);
        backlog_at.push((elapsed / secs as f64, backlog));
        if backlog > limit {
            note = format!("stopped early: backlog {backlog:.0} readings");
            let _ = sim.kill();
            let _ = sim.wait();
            break None;
        }
    };
    // Flat: the backlog's low point in the last third of the step is not
    // above its low point in the middle third by more than half a second of
    // readings. The first third is left to settle: a gateway that holds
    // readings for a while (palletd's flush.max_delay) holds more of them
    // at a higher rate. Low points, not peaks: a flush cycle can be long,
    // and a peak depends on where the window cuts it.
    let low_in = |from: f64, to: f64| {
        backlog_at
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .map(|(_, b)| *b)
            .fold(f64::INFINITY, f64::min)
    };
    let (early, late) = (low_in(0.33, 0.66), low_in(0.66, 1.0));
    let flat = late.is_finite() && late <= early + total * 0.5 + 1000.0;
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let seconds = started.elapsed().as_secs_f64();
    let (published, sim_lag) =
        parse_report(&report).unwrap_or(((total * seconds) as u64, f64::NAN));
    // Drain: how long until everything published is durable.
    let end = Instant::now();
    let mut drained = None;
    let mut after = sink.scrape()?;
    while end.elapsed() < Duration::from_secs(DRAIN_SECS) {
        after = sink.scrape()?;
        if after.stored - before.stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = sink.cpu().saturating_sub(cpu_before);
    let durable = (after.stored - before.stored) as u64;
    let on_schedule = status.is_some_and(|s| s.success()) && sim_lag <= 1.0;
    if status.is_some() && !on_schedule && note.is_empty() {
        note = format!("simulator fell behind its schedule by {sim_lag:.1}s");
    }
    let sustained = on_schedule && flat && drained.is_some();
    if status.is_some() && on_schedule && !sustained && note.is_empty() {
        note = if flat {
            format!("not durable within {DRAIN_SECS} s of the last publish")
        } else {
            format!("backlog low point grew from {early:.0} to {late:.0} readings")
        };
    }
    let step = Step {
        target_per_s: total,
        seconds,
        published,
        durable,
        achieved_per_s: durable as f64 / seconds,
        simulator_max_lag_s: sim_lag,
        max_backlog,
        drained_after_s: drained,
        sustained,
        note,
    };
    eprintln!(
        "    {:>9.0}/s offered: {:>9.0}/s durable, backlog max {:>8.0}, {}",
        total,
        step.achieved_per_s,
        max_backlog,
        if sustained {
            "sustained".to_string()
        } else {
            format!("NOT sustained ({})", step.note)
        }
    );
    Ok(Measured {
        step,
        before,
        after,
        cpu,
    })
}

/// (readings published, max lag behind schedule) from `palletd simulate`.
pub(crate) fn parse_report(text: &str) -> Option<(u64, f64)> {
    let line = text.lines().find(|l| l.starts_with("published "))?;
    let published = line.split_whitespace().nth(1)?.parse().ok()?;
    let lag = line
        .split("max lag behind schedule ")
        .nth(1)?
        .split('s')
        .next()?
        .parse()
        .ok()?;
    Some((published, lag))
}
