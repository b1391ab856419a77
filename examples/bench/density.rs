//! The `density` scenario: bytes per reading stored, palletd's buckets against other shapes.

use crate::*;

/// Readings in arrival order: (sensor, payload with `ts` in ms).
pub(crate) type Readings = Box<dyn Iterator<Item = (String, serde_json::Value)>>;

/// A data set of the density scenario: its name, how many readings, the
/// bucket window palletd stores it under, and its readings in arrival
/// order (sensor, payload with `ts` in ms).
pub(crate) struct DensitySet {
    pub(crate) name: &'static str,
    pub(crate) readings: usize,
    pub(crate) window: &'static str,
    pub(crate) granularity: &'static str,
    pub(crate) messages: Box<dyn Fn() -> Readings>,
}

/// The simulator's readings (`palletd simulate`: temperature, humidity
/// and pressure walking randomly, rounded to 0.01) of `sensors` sensors at
/// one a second for `hours`, ending two hours ago; and hourly weather
/// readings (the backfill's) of `stations` for `hours`, window 7d (168 a
/// bucket: an hourly sensor's readings in buckets of a day would be 24).
pub(crate) fn density_sets(
    sensors: usize,
    sim_hours: usize,
    stations: usize,
    hours: usize,
) -> Vec<DensitySet> {
    use rand::{Rng, SeedableRng};
    let hour = 3_600_000i64;
    let now = chrono::Utc::now().timestamp_millis() / hour * hour;
    let secs = sim_hours * 3600;
    let sim_first = now - 2 * hour - secs as i64 * 1000;
    // Ending where a window of 7 days ends (windows start at the epoch),
    // so the closer seals every bucket.
    let week = 7 * 24 * hour;
    let hourly_first = now / week * week - hours as i64 * hour;
    vec![
        DensitySet {
            name: "simulator, 3 fields at 1/s",
            readings: sensors * secs,
            window: "1h",
            granularity: "seconds",
            messages: Box::new(move || {
                let mut walks: Vec<(f64, f64, f64, rand::rngs::StdRng)> = (0..sensors)
                    .map(|s| {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(s as u64);
                        let start = (
                            rng.gen_range(15.0..25.0),
                            rng.gen_range(35.0..65.0),
                            rng.gen_range(990.0..1030.0),
                        );
                        (start.0, start.1, start.2, rng)
                    })
                    .collect();
                let mut i = 0;
                Box::new(std::iter::from_fn(move || {
                    if i >= sensors * secs {
                        return None;
                    }
                    let (t, s) = (i / sensors, i % sensors);
                    i += 1;
                    let w = &mut walks[s];
                    w.0 = (w.0 + w.3.gen_range(-0.1..0.1)).clamp(-40.0, 85.0);
                    w.1 = (w.1 + w.3.gen_range(-0.3..0.3)).clamp(0.0, 100.0);
                    w.2 = (w.2 + w.3.gen_range(-0.2..0.2)).clamp(900.0, 1100.0);
                    let round = |x: f64| (x * 100.0).round() / 100.0;
                    let v = json!({
                        "ts": sim_first + t as i64 * 1000,
                        "temp": round(w.0), "humidity": round(w.1), "pressure": round(w.2),
                    });
                    Some((format!("s{s:05}"), v))
                }))
            }),
        },
        DensitySet {
            name: "hourly weather, 3 fields",
            readings: stations * hours,
            window: "7d",
            granularity: "hours",
            messages: Box::new(move || {
                Box::new((0..hours).flat_map(move |h| {
                    (0..stations).map(move |s| {
                        let mut v = weather(s, h);
                        v["ts"] = json!(hourly_first + h as i64 * hour);
                        (format!("station-{s}"), v)
                    })
                }))
            }),
        },
    ]
}

/// Where a layout's bytes are, for one data set.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct Density {
    pub(crate) set: String,
    pub(crate) layout: String,
    pub(crate) readings: usize,
    pub(crate) documents: u64,
    /// collStats: `size` (the documents' BSON), `storageSize`,
    /// `totalIndexSize`; `None` where the server does not answer it.
    pub(crate) coll_size: Option<f64>,
    pub(crate) storage_size: Option<f64>,
    pub(crate) index_size: Option<f64>,
    /// The server's table files after a checkpoint, less their size
    /// before ([`table_bytes`]): documents, indexes.
    pub(crate) doc_file_bytes: u64,
    pub(crate) index_file_bytes: u64,
}

/// SecantusDB's table files in its data directory (WiredTiger): the
/// documents' (`secantus_documents_*`) and the indexes' (index entries,
/// natural order, unique keys); the journal (`WiredTigerLog.*`, written
/// ahead in 128 MiB files) and the oplog tables are left out, as MongoDB's
/// collStats leaves them out.
pub(crate) fn table_bytes(dir: &Path) -> (u64, u64) {
    let (mut docs, mut indexes) = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let len = e.metadata().map_or(0, |m| m.len());
        if name.starts_with("secantus_documents") {
            docs += len;
        } else if [
            "secantus_index_entries",
            "secantus_natural_seq",
            "secantus_unique_keys",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        {
            indexes += len;
        }
    }
    (docs, indexes)
}

pub(crate) fn density(args: DensityArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();
    for set in density_sets(args.sensors, args.sim_hours, args.stations, args.hours) {
        for layout in [
            "palletd buckets (sealed)",
            "time series collection",
            "one document per reading",
        ] {
            eprintln!(
                "== density: {}, {layout}: {} readings",
                set.name, set.readings
            );
            let svc = Services::start(&args.run)?;
            let uri = svc.mongodb_uri();
            let db_dir = svc.db.data_dir();
            rt.block_on(data_bytes(&uri, &db_dir))?;
            let before = table_bytes(&db_dir);
            let started = Instant::now();
            if layout == "one document per reading" {
                rt.block_on(insert_per_reading(&uri, (set.messages)()))?;
            } else {
                let lateness = format!("{}d", args.hours / 24 + 30);
                let kind = match layout.starts_with("palletd") {
                    true => "buckets-nolatest",
                    false => "timeseries-nolatest",
                };
                let tail = format!(
                    "[bucket]\nwindow = \"{}\"\nmax_lateness = \"{lateness}\"\n[closer]\ninterval = \"1s\"\ngrace = \"1s\"\n[flush]\nmax_delay = \"2s\"\n",
                    set.window
                );
                let tail = match kind {
                    "timeseries-nolatest" => {
                        format!("storage.granularity = \"{}\"\n{tail}", set.granularity)
                    }
                    _ => tail,
                };
                let sink = start_sink_with(&args.run, kind, &svc, &uri, "", "", &tail)?;
                let port = sink.procs[0].1;
                rt.block_on(publish_acknowledged(
                    svc.broker_port,
                    "bench-density",
                    set.readings,
                    (set.messages)(),
                ))?;
                while counter_sum(port, palletd::telemetry::SAMPLES_STORED) < set.readings as f64 {
                    anyhow::ensure!(
                        started.elapsed() < Duration::from_secs(1800),
                        "not every reading was stored within 30 minutes"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                if kind == "buckets-nolatest" {
                    rt.block_on(wait_all_sealed(&uri))?;
                }
                drop(sink);
            }
            eprintln!("  stored in {:.1} s", started.elapsed().as_secs_f64());
            rt.block_on(data_bytes(&uri, &db_dir))?;
            let after = table_bytes(&db_dir);
            let mut row = rt.block_on(coll_stats(&uri))?;
            row.set = set.name.to_string();
            row.layout = layout.to_string();
            row.readings = set.readings;
            row.doc_file_bytes = after.0.saturating_sub(before.0);
            row.index_file_bytes = after.1.saturating_sub(before.1);
            eprintln!("  {row:?}");
            rows.push(row);
            if layout.starts_with("palletd") {
                breakdowns.push((set.name, rt.block_on(bucket_breakdown(&uri))?));
                // The proposal: the same sealed buckets with a column per
                // field instead of a document per sample.
                let mut row = rt.block_on(store_columnar(&uri))?;
                rt.block_on(data_bytes(&uri, &db_dir))?;
                let (before, after) = (after, table_bytes(&db_dir));
                row.set = set.name.to_string();
                row.layout = "sealed buckets as columns (proposal)".to_string();
                row.readings = set.readings;
                row.doc_file_bytes = after.0.saturating_sub(before.0);
                row.index_file_bytes = after.1.saturating_sub(before.1);
                eprintln!("  {row:?}");
                rows.push(row);
            }
        }
    }
    println!("| data | layout | documents | collStats size / reading | storageSize / reading | totalIndexSize / reading | document files / reading | index files / reading |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let per = |x: Option<f64>| fmt(x.map(|x| x / r.readings as f64), 1);
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
            r.set,
            r.layout,
            r.documents,
            per(r.coll_size),
            per(r.storage_size),
            per(r.index_size),
            r.doc_file_bytes as f64 / r.readings as f64,
            r.index_file_bytes as f64 / r.readings as f64,
        );
    }
    println!();
    println!("Where a sealed bucket's BSON goes, bytes per reading:");
    println!();
    let parts: Vec<&str> = BUCKET_PARTS.to_vec();
    println!("| data | {} | total |", parts.join(" | "));
    println!("|---|{}---:|", "---:|".repeat(parts.len()));
    for (name, b) in &breakdowns {
        let per = |x: u64| x as f64 / b.readings.max(1) as f64;
        let cells: Vec<String> = parts
            .iter()
            .map(|p| format!("{:.1}", per(b.parts.get(*p).copied().unwrap_or(0))))
            .collect();
        println!("| {name} | {} | {:.1} |", cells.join(" | "), per(b.total));
    }
    Ok(())
}

/// Copies every sealed bucket of `bench.readings` into
/// `bench.columnar` in the denser shape proposed for sealed buckets: the
/// same document with `samples` replaced by `columns: {ts: [...], <field>:
/// [...]}` (a field a sample lacks is null there), so each field name is
/// stored once per bucket instead of once per sample. Returns its
/// collStats.
pub(crate) async fn store_columnar(uri: &str) -> anyhow::Result<Density> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let from = db.collection::<bson::Document>("readings");
    let to = db.collection::<bson::Document>("columnar");
    let mut cursor = from.find(doc! { "closed": true }).await?;
    let mut docs = Vec::new();
    while let Some(mut b) = cursor.try_next().await? {
        let samples = match b.remove("samples") {
            Some(bson::Bson::Array(a)) => a,
            _ => continue,
        };
        let mut names: Vec<String> = Vec::new();
        for s in samples.iter().filter_map(|s| s.as_document()) {
            for k in s.keys() {
                if !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        let mut columns = bson::Document::new();
        for n in &names {
            let column: Vec<bson::Bson> = (samples.iter())
                .map(|s| (s.as_document()).and_then(|d| d.get(n)).cloned())
                .map(|v| v.unwrap_or(bson::Bson::Null))
                .collect();
            columns.insert(n, column);
        }
        b.insert("columns", columns);
        docs.push(b);
        if docs.len() == 500 {
            to.insert_many(std::mem::take(&mut docs)).await?;
        }
    }
    if !docs.is_empty() {
        to.insert_many(docs).await?;
    }
    let mut row = coll_stats_of(&db, "columnar").await?;
    row.documents = to.estimated_document_count().await?;
    Ok(row)
}

/// Inserts one document per reading (`{sensorId, ts, <fields>}`, indexed
/// on `{sensorId: 1, ts: 1}`) in unordered batches of 1,000.
pub(crate) async fn insert_per_reading(uri: &str, messages: Readings) -> anyhow::Result<()> {
    let coll = indexed_readings(uri, doc! { "sensorId": 1, "ts": 1 }).await?;
    let mut docs = Vec::with_capacity(1000);
    for (sensor, v) in messages {
        let mut d = doc! { "sensorId": sensor };
        for (k, x) in v.as_object().into_iter().flatten() {
            match k.as_str() {
                "ts" => d.insert("ts", bson::DateTime::from_millis(x.as_i64().unwrap_or(0))),
                _ => d.insert(k, x.as_f64().unwrap_or(0.0)),
            };
        }
        docs.push(d);
        if docs.len() == 1000 {
            coll.insert_many(std::mem::take(&mut docs))
                .ordered(false)
                .await?;
        }
    }
    if !docs.is_empty() {
        coll.insert_many(docs).ordered(false).await?;
    }
    Ok(())
}

/// `bench.readings`, with an index of `keys`.
pub(crate) async fn indexed_readings(
    uri: &str,
    keys: bson::Document,
) -> anyhow::Result<mongodb::Collection<bson::Document>> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    coll.create_index(mongodb::IndexModel::builder().keys(keys).build())
        .await?;
    Ok(coll)
}

/// Waits until the closer sealed every bucket.
pub(crate) async fn wait_all_sealed(uri: &str) -> anyhow::Result<()> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    let started = Instant::now();
    while coll.count_documents(doc! { "closed": false }).await? > 0 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "buckets still open after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// collStats of `bench.readings` (what the server answers of it).
pub(crate) async fn coll_stats(uri: &str) -> anyhow::Result<Density> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let mut row = coll_stats_of(&db, "readings").await?;
    row.documents = db
        .collection::<bson::Document>("readings")
        .estimated_document_count()
        .await?;
    Ok(row)
}

/// What collStats says of `coll`: size, storageSize, totalIndexSize.
pub(crate) async fn coll_stats_of(db: &mongodb::Database, coll: &str) -> anyhow::Result<Density> {
    let stats = db.run_command(doc! { "collStats": coll }).await;
    if let Err(e) = &stats {
        eprintln!("  collStats: {e}");
    }
    let num = |k: &str| {
        let s = stats.as_ref().ok()?;
        match s.get(k)? {
            bson::Bson::Int32(i) => Some(*i as f64),
            bson::Bson::Int64(i) => Some(*i as f64),
            bson::Bson::Double(x) => Some(*x),
            _ => None,
        }
    };
    Ok(Density {
        coll_size: num("size"),
        storage_size: num("storageSize"),
        index_size: num("totalIndexSize"),
        ..Density::default()
    })
}

/// The parts of a sealed bucket's BSON, as [`bucket_breakdown`] counts them.
pub(crate) const BUCKET_PARTS: &[&str] = &[
    "sample values",
    "sample field names",
    "sample array keys and framing",
    "_id",
    "summaries (sum n min max avg)",
    "first/last",
    "lsns",
    "other",
];

#[derive(Debug, Default)]
pub(crate) struct Breakdown {
    pub(crate) readings: u64,
    pub(crate) total: u64,
    pub(crate) parts: HashMap<&'static str, u64>,
}

/// Where sealed buckets spend their bytes: every bucket's top-level
/// fields, and within `samples` the values, the field names (each with
/// its type byte and NUL) and the array's own keys and framing.
pub(crate) async fn bucket_breakdown(uri: &str) -> anyhow::Result<Breakdown> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::RawDocumentBuf>("readings");
    let mut cursor = coll.find(doc! { "closed": true }).await?;
    let mut out = Breakdown::default();
    while let Some(d) = cursor.try_next().await? {
        out.total += d.as_bytes().len() as u64;
        out.readings += d.get_i32("count").unwrap_or(0).max(0) as u64;
        // The document's own length and final NUL.
        *out.parts.entry("other").or_default() += 5;
        for el in d.iter_elements() {
            let el = el?;
            let (key, value) = (el.key(), el.value()?);
            let len = 2 + key.len() as u64 + raw_value_len(value);
            let part = match key {
                "_id" => "_id",
                "sum" | "n" | "min" | "max" | "avg" => "summaries (sum n min max avg)",
                "first" | "last" => "first/last",
                "lsns" => "lsns",
                "samples" => {
                    let mut inner = 0;
                    for s in value.as_array().into_iter().flat_map(|a| a.into_iter()) {
                        let Some(doc) = s?.as_document() else {
                            continue;
                        };
                        for f in doc.iter_elements() {
                            let f = f?;
                            let v = raw_value_len(f.value()?);
                            *out.parts.entry("sample values").or_default() += v;
                            *out.parts.entry("sample field names").or_default() +=
                                2 + f.key().len() as u64;
                            inner += v + 2 + f.key().len() as u64;
                        }
                    }
                    *out.parts
                        .entry("sample array keys and framing")
                        .or_default() += len - inner;
                    continue;
                }
                _ => "other",
            };
            *out.parts.entry(part).or_default() += len;
        }
    }
    Ok(out)
}

/// Bytes of a BSON value as stored (without its type byte and key).
pub(crate) fn raw_value_len(v: bson::RawBsonRef<'_>) -> u64 {
    use bson::RawBsonRef as B;
    (match v {
        B::Double(_) | B::Int64(_) | B::DateTime(_) | B::Timestamp(_) => 8,
        B::Int32(_) => 4,
        B::Boolean(_) => 1,
        B::Null | B::Undefined | B::MinKey | B::MaxKey => 0,
        B::ObjectId(_) => 12,
        B::Decimal128(_) => 16,
        B::String(s) | B::Symbol(s) | B::JavaScriptCode(s) => 4 + s.len() + 1,
        B::Document(d) => d.as_bytes().len(),
        B::Array(a) => a.as_bytes().len(),
        B::Binary(b) => 4 + 1 + b.bytes.len(),
        B::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
        B::JavaScriptCodeWithScope(c) => 4 + 4 + c.code.len() + 1 + c.scope.as_bytes().len(),
        B::DbPointer(_) => 4 + 12,
    }) as u64
}
