//! The `wire` scenario: bytes per statement on the wire, part by part.

use crate::*;

/// Where a part of a bucket statement is: `q`, `u` or `u.<operator>`, and
/// its keys there (one ending in `.` names every key it starts).
pub(crate) type WirePlace = (&'static str, &'static [&'static str]);

/// Parts of a bucket statement the wire account takes out one at a time.
pub(crate) const WIRE_PARTS: &[(&str, &[WirePlace])] = &[
    (
        "the string _id (as a 12-byte ObjectId instead)",
        &[("q", &["_id"])],
    ),
    (
        "first/last",
        &[("u.$min", &["first."]), ("u.$max", &["last."])],
    ),
    ("lsns", &[("u.$push", &["lsns."])]),
    (
        "the caps (closed, count, size)",
        &[("q", &["closed", "count", "size"])],
    ),
    ("$setOnInsert", &[("u", &["$setOnInsert"])]),
    ("sum and n", &[("u.$inc", &["sum.", "n."])]),
    (
        "min and max",
        &[("u.$min", &["min."]), ("u.$max", &["max."])],
    ),
];

pub(crate) fn wire(args: WireArgs) -> anyhow::Result<()> {
    use palletd::bucket::{self, Fills, Sample, Samples, Shape};
    use palletd::decode::{FieldValue, Reading};
    let shape = Shape {
        window_ms: 3_600_000,
        max_samples: 200,
        max_bytes: 256 << 10,
    };
    let tags = palletd::internals::Tags::new(0x5eed);
    let set = density_sets(args.sensors, 1, 1, 1).remove(0);
    println!(
        "| readings per statement | part | zstd 1 | zstd 3 | zstd 9 | zstd 19 | uncompressed |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for &k in &args.per_statement {
        // The first k seconds of every sensor, each sensor's in one run.
        let mut runs: Vec<Samples> = (0..args.sensors).map(|_| Samples::new()).collect();
        for (lsn, (sensor, v)) in (1..).zip((set.messages)().take(k * args.sensors)) {
            let s: usize = sensor[1..].parse()?;
            let mut reading = Reading {
                sensor: sensor.clone(),
                ts_ms: v["ts"].as_i64().unwrap_or(0),
                ..Reading::default()
            };
            for (name, x) in v.as_object().into_iter().flatten() {
                if name != "ts" {
                    reading
                        .fields
                        .push((name.clone(), FieldValue::Num(x.as_f64().unwrap_or(0.0))));
                }
            }
            let sample = Sample::encode(&reading, lsn);
            runs[s].push(sample.as_ref());
        }
        let mut statements = Vec::new();
        let mut latest = Vec::new();
        for (s, samples) in runs.iter().enumerate() {
            let sensor = format!("s{s:05}");
            // A bucket the sensor is extending (what live flushes do).
            let mut fills = Fills::new();
            let start = shape.window_start(samples.first().map_or(0, |x| x.ts_ms));
            fills.insert(
                start,
                bucket::Fill {
                    count: 10,
                    bytes: 800,
                    seq: 0,
                },
            );
            for st in bucket::plan(samples, &mut fills, &shape, &tags) {
                statements.push(bson::Document::try_from(
                    st.to_bson(&sensor, samples, &shape, false).as_ref(),
                )?);
            }
            if let Some(newest) = samples.last() {
                latest.push(bson::Document::try_from(
                    palletd::internals::latest_statement(&sensor, newest).as_ref(),
                )?);
            }
        }
        let readings = (k * args.sensors) as f64;
        let row = |label: &str, docs: &[bson::Document]| -> anyhow::Result<()> {
            let cmd = doc! {
                "update": "readings", "updates": docs, "ordered": true,
                "writeConcern": { "w": "majority", "j": true }, "maxTimeMS": 10_000i64,
            };
            let bytes = bson::to_vec(&cmd)?;
            let z = |level| zstd::bulk::compress(&bytes, level).map(|c| c.len());
            println!(
                "| {k} | {label} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                z(1)? as f64 / readings,
                z(3)? as f64 / readings,
                z(9)? as f64 / readings,
                z(19)? as f64 / readings,
                bytes.len() as f64 / readings
            );
            Ok(())
        };
        row("bucket statements as sent", &statements)?;
        for (label, places) in WIRE_PARTS {
            let cut: Vec<bson::Document> = statements
                .iter()
                .map(|st| without_part(st, places))
                .collect();
            row(&format!("without {label}"), &cut)?;
        }
        let samples_only: Vec<bson::Document> = statements
            .iter()
            .map(|st| {
                let each = st
                    .get_document("u")
                    .and_then(|u| u.get_document("$push"))
                    .and_then(|p| p.get_document("samples"))
                    .cloned()
                    .unwrap_or_default();
                doc! { "samples": each }
            })
            .collect();
        row("the samples alone (the floor)", &samples_only)?;
        row("the latest-value command", &latest)?;
    }
    Ok(())
}

/// A bucket statement without one of [`WIRE_PARTS`] (an `_id` is replaced
/// by an ObjectId-sized value rather than removed).
pub(crate) fn without_part(st: &bson::Document, places: &[WirePlace]) -> bson::Document {
    let mut st = st.clone();
    for &(place, names) in places {
        let mut path = place.split('.');
        let Ok(doc) = st.get_document_mut(path.next().unwrap_or("")) else {
            continue;
        };
        let doc = match path.next() {
            Some(op) => match doc.get_document_mut(op) {
                Ok(d) => d,
                Err(_) => continue,
            },
            None => doc,
        };
        let keys: Vec<String> = (doc.keys())
            .filter(|k| (names.iter()).any(|n| *k == n || (n.ends_with('.') && k.starts_with(n))))
            .cloned()
            .collect();
        for k in keys {
            match k.as_str() {
                "_id" => doc.insert(k, bson::oid::ObjectId::new()),
                _ => doc.remove(&k),
            };
        }
    }
    st
}
