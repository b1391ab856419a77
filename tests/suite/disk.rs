//! Faults of the disk under the spool, with real processes: bit rot in a
//! segment, write and fsync errors injected with libfiu, a full disk (a
//! small tmpfs) during a database outage, a SIGKILL, and a spool copied to
//! another box. Each ends by comparing what was published with what the
//! buckets hold, and with what palletd counted as lost.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// The spool directory of a palletd run of the stack.
fn spool_dir(stack: &Stack) -> PathBuf {
    stack
        .broker
        .dir
        .path()
        .join(format!("spool-{}", stack.config.client_id()))
}

/// The spool's segment files, in LSN order, compressed or not.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.ends_with(".seg") || name.ends_with(".seg.zst")
        })
        .collect();
    out.sort();
    out
}

/// The offset of the first sample record at or after `from` in a plain
/// segment (the record format of the README: length, CRC32, LSN, kind).
fn sample_record_after(segment: &[u8], from: usize) -> std::ops::Range<usize> {
    let mut at = 0;
    loop {
        let len = u32::from_le_bytes(segment[at..at + 4].try_into().unwrap()) as usize;
        let kind = segment[at + 16];
        if at >= from && kind == 1 {
            return at..at + 8 + len;
        }
        at += 8 + len;
    }
}

/// Flips one bit of the byte at `offset` of `file`.
fn flip_bit(file: &Path, offset: u64) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[offset as usize] ^= 0x10;
    std::fs::write(file, bytes).unwrap();
}

/// Readings lost to damage, as palletd counts them (damaged sample
/// records, and records whose kind could not be read).
fn damaged(stack: &Stack) -> f64 {
    let m = |kind| {
        stack
            .palletd
            .metric("palletd_spool_damaged_records_total", Some(("kind", kind)))
    };
    m("sample") + m("unknown")
}

/// The case: the database down, 20,000 readings spooled and
/// acknowledged, palletd stopped, one bit flipped in the middle of the
/// segment. Before the fix recovery took the bad record for a torn tail and
/// cut the segment there: about 10,000 acknowledged readings lost, with a
/// WARN. Now it skips the damaged record alone and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_a_spool_segment_costs_only_the_damaged_record() {
    let mut stack = Stack::without_database("bitrot", |c| c.set("spool.compress", false)).await;
    let sent = publish_steadily(stack.publisher().await, 20, 5000.0, 20_000).await;
    stack.all_acknowledged().await;
    stack.palletd.kill();
    let dir = spool_dir(&stack);
    let segment = segments(&dir).pop().expect("a segment");
    let bytes = std::fs::read(&segment).unwrap();
    assert!(bytes.len() > 1_000_000, "one segment holds them all");
    // A bit of a reading's document, in the middle of the segment.
    let record = sample_record_after(&bytes, bytes.len() / 2);
    flip_bit(&segment, (record.end - 5) as u64);

    stack.db.start_again();
    let stack = Stack::on(stack.broker, stack.db, "bitrot", |c| {
        c.set("spool.compress", false)
    })
    .await;
    let lost = assert_stored_or_counted(&stack, &sent).await;
    assert_eq!(lost, 1, "the damaged record's one reading");
    assert_eq!(
        stack
            .palletd
            .metric("palletd_spool_damaged_records_total", None),
        1.0,
        "one record counted"
    );
    let log = stack.palletd.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("damaged")),
        "an ERROR line says what was lost:\n{log}"
    );
    assert!(
        !log.contains("torn record"),
        "damage is not taken for a torn tail:\n{log}"
    );
}

/// Waits until every sent reading is stored or counted as lost to damage;
/// checks that none is stored twice and that every missing one is counted
/// (records whose kind was unreadable count as readings, so the count is an
/// upper bound). Returns how many are missing.
async fn assert_stored_or_counted(stack: &Stack, sent: &[(String, i64)]) -> usize {
    let db = stack.config.database();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (stored, counted) = (stored_samples(&stack.client, &db).await, damaged(stack));
        if stored + counted as usize >= sent.len() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stored} of {} readings stored and {counted} counted as damaged:\n{}",
            sent.len(),
            stack.palletd.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stack.palletd.nothing_left_to_write().await;
    let stored = stored_counts(&stack.client, &db).await;
    let twice: Vec<_> = stored.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    let missing = sent.iter().filter(|k| !stored.contains_key(*k)).count();
    assert!(
        missing <= damaged(stack) as usize,
        "every reading missing is counted: {missing} missing, {} counted",
        damaged(stack)
    );
    assert_eq!(stored.len() + missing, sent.len(), "nothing extra");
    missing
}

/// Compressed segments are written in independent frames of about 16 KiB
/// of records: one flipped bit costs its frame, not the rest of the
/// segment (before, a compressed segment was one zstd frame, and damage
/// lost everything after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_a_compressed_segment_costs_one_frame_of_records() {
    let small = |c: Config| c.set("spool.max_size", "4MiB");
    let mut stack = Stack::without_database("bitrotz", small).await;
    let sent = publish_steadily(stack.publisher().await, 20, 5000.0, 20_000).await;
    stack.all_acknowledged().await;
    let dir = spool_dir(&stack);
    let compressed = || {
        segments(&dir)
            .into_iter()
            .find(|p| p.to_string_lossy().ends_with(".zst"))
    };
    eventually(Duration::from_secs(30), "a segment compressed", || async {
        compressed().is_some()
    })
    .await;
    stack.palletd.kill();
    let segment = compressed().unwrap();
    let len = std::fs::metadata(&segment).unwrap().len();
    flip_bit(&segment, len / 2);

    stack.db.start_again();
    let stack = Stack::on(stack.broker, stack.db, "bitrotz", small).await;
    let lost = assert_stored_or_counted(&stack, &sent).await;
    eprintln!("one flipped bit in a compressed segment: {lost} readings lost");
    assert!(
        (1..=150).contains(&lost),
        "one frame's readings (16 KiB of records of about 120 bytes, half of them message ids): {lost}"
    );
    let log = stack.palletd.log();
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("damaged") && l.contains("lost_frames=1")),
        "an ERROR line says what was lost:\n{log}"
    );
}

/// With the database down, the spool on a 3 MiB disk: for a while every
/// fourth-or-so spool write, short write, truncate and fsync fails
/// (libfiu's POSIX fault points, in the running process), then the disk
/// fills up and the broker keeps what palletd cannot spool; palletd is
/// SIGKILLed; it starts again with the database back: every reading is
/// stored exactly once, and the broker keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_and_fsync_faults_and_a_full_disk_during_an_outage_then_a_kill_lose_nothing() {
    let disk = Tmpfs::mount("3m");
    let mut db = Database::start();
    db.stop();
    let broker = Broker::start();
    let config = Config::new(&broker, &db, "fiu")
        .set(
            "spool.dir",
            disk.path().join("spool").to_string_lossy().as_ref(),
        )
        .set("spool.compress", false)
        .set("spool.max_size", "64MiB");
    let fifo = broker.dir.path().join("fiu-ctl");
    let fifo_arg = fifo.to_string_lossy().to_string();
    let mut palletd = Palletd::start_with(
        &config,
        Run {
            under: &["fiu-run", "-x", "-f", &fifo_arg],
            ..Run::default()
        },
    );
    palletd.subscribed().await;
    let publisher = Publisher::connect(&broker, "pub-fiu").await;
    let stream = tokio::spawn(publish_steadily(publisher, 20, 2000.0, 40_000));
    // Faults on the spool's own calls: positioned writes (and short ones),
    // truncates, fsyncs.
    let faults = [
        "posix/io/rw/pwrite,probability=0.05",
        "posix/io/rw/pwrite/reduce,probability=0.1",
        "posix/io/rw/ftruncate,probability=0.2",
        "posix/io/sync/fdatasync,probability=0.25",
        "posix/io/sync/fsync,probability=0.25",
    ];
    let on: Vec<String> = faults
        .iter()
        .map(|f| format!("enable_random name={f}"))
        .collect();
    let off: Vec<String> = faults
        .iter()
        .map(|f| format!("disable name={}", f.split(',').next().unwrap()))
        .collect();
    palletd
        .wait_metric("palletd_samples_decoded_total", 1000.0)
        .await;
    let pid = palletd.child.id();
    fiu_ctrl(
        &fifo,
        pid,
        &on.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    palletd
        .wait_until(Duration::from_secs(60), "meeting write faults", |p| {
            p.metric("palletd_spool_write_errors_total", None) >= 30.0
        })
        .await;
    fiu_ctrl(
        &fifo,
        pid,
        &off.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // Then the disk fills: writes fail for good, readiness says so, the
    // broker keeps the rest.
    palletd
        .wait_until(Duration::from_secs(60), "out of disk", |p| {
            p.metric(
                "palletd_spool_write_errors_total",
                Some(("kind", "disk_full")),
            ) >= 1.0
                && p.readyz().1.contains("spool writes failing")
        })
        .await;
    let sent = stream.await.unwrap();
    assert!(
        broker.held_messages().await > 0,
        "the broker keeps what did not fit"
    );
    let errors = palletd.metric("palletd_spool_write_errors_total", None);
    palletd.kill();
    eprintln!("spool write errors met before the kill: {errors}");

    db.start_again();
    let mut stack = Stack::on(broker, db, "fiu", |_| config.clone()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while stored_samples(&stack.client, "fiu").await < sent.len() {
        if tokio::time::Instant::now() >= deadline {
            std::fs::write("/tmp/fiu-palletd.log", stack.palletd.log()).unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} stored; the broker holds {}; free on disk {}:\n{}",
            stored_samples(&stack.client, "fiu").await,
            sent.len(),
            stack.broker.held_messages().await,
            stack.palletd.metric("palletd_spool_disk_free_bytes", None),
            stack.palletd.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_exactly_once(&stack.client, "fiu", &sent, Duration::from_secs(60)).await;
    stack.all_acknowledged().await;
    assert_eq!(
        stack
            .palletd
            .metric("palletd_spool_damaged_records_total", None),
        0.0,
        "faults and a full disk are not damage"
    );
    stack.stop();
    drop(disk);
}

/// Rewrites a spool's id files as if the spool had been made on another
/// box (its machine fingerprint another), keeping them valid.
fn as_made_on_another_box(dir: &Path) {
    for name in ["spool.id", "spool.id.copy"] {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let body: String = text
            .lines()
            .filter(|l| !l.starts_with("crc "))
            .map(|l| match l.starts_with("machine ") {
                true => "machine 0123456789abcdef0123456789abcdef\n".to_string(),
                false => format!("{l}\n"),
            })
            .collect();
        let crc = crc32fast::hash(body.as_bytes());
        std::fs::write(dir.join(name), format!("{body}crc {crc:08x}\n")).unwrap();
    }
}

/// A spool's id and the ids it keeps for its earlier records.
fn spool_ids(dir: &Path) -> (String, Vec<String>) {
    let text = std::fs::read_to_string(dir.join("spool.id")).unwrap();
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix(key))
            .map(|v| v.split(' ').next().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    (field("id ").remove(0), field("previous "))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Two edge boxes flashed from one image made after a first start (its
/// spool holds readings and a dead letter not yet in MongoDB), writing one
/// database behind one shared subscription: each takes a new spool id of
/// its own, the image's records are stored once (under the old id), and
/// what each box spools next is told apart by its id, dead letters too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boxes_flashed_from_one_image_take_ids_of_their_own_and_store_everything_once() {
    let mut db = Database::start();
    db.stop();
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let alone = Config::new(&broker, &db, "clone");
    let base = alone.clone().set("mqtt.share_group", "boxes");
    // The image's first start: readings and a bad payload spooled while
    // the database was away.
    let image = alone.another("image", dir.path());
    let mut p = Palletd::start(&image);
    p.subscribed().await;
    let mut publisher = Publisher::connect(&broker, "pub-clone").await;
    publisher.publish("sensors/bad/telemetry", "not json").await;
    publisher.flush().await;
    let mut sent = publish_steadily(publisher, 10, 1000.0, 300).await;
    p.wait_metric("palletd_samples_decoded_total", 300.0).await;
    // Decoded is not yet durable: a reading killed before its fsync stays
    // with the broker, for the image's session, which no box resumes. Every
    // message acknowledged, all 300 are in the image's spool.
    eventually(
        Duration::from_secs(30),
        "the broker holds no message for the image",
        || async { broker.held_messages().await == 0 },
    )
    .await;
    p.kill();
    let image_dir = dir.path().join("spool-image");
    let (image_id, _) = spool_ids(&image_dir);
    as_made_on_another_box(&image_dir);
    copy_dir(&image_dir, &dir.path().join("spool-box-b"));
    copy_dir(&image_dir, &dir.path().join("spool-box-c"));

    db.start_again();
    let client = db.client().await;
    // One box after the other replays the image (at the same moment both
    // could write a record of it before either sees the other's: see the
    // README).
    let b = Palletd::start(&base.another("box-b", dir.path()));
    b.ready().await;
    assert_exactly_once(&client, "clone", &sent, Duration::from_secs(60)).await;
    let c = Palletd::start(&base.another("box-c", dir.path()));
    c.ready().await;
    c.wait_until(
        Duration::from_secs(30),
        "done with the image's backlog",
        |p| {
            p.metric("palletd_backlog_readings", None) == 0.0
                && p.log().contains("Spool replay done")
        },
    )
    .await;
    let (b_id, b_kept) = spool_ids(&dir.path().join("spool-box-b"));
    let (c_id, c_kept) = spool_ids(&dir.path().join("spool-box-c"));
    assert!(b_id != image_id && c_id != image_id && b_id != c_id);
    assert_eq!(
        b_kept,
        vec![image_id.clone()],
        "the old id, for the image's records"
    );
    assert_eq!(c_kept, vec![image_id.clone()]);
    for p in [&b, &c] {
        assert!(p.log().contains("This spool was made on another box"));
    }

    // Then both take new readings of the same sensors, and bad payloads.
    let mut publisher = Publisher::connect(&broker, "pub-clone-2").await;
    for i in 0..20 {
        publisher
            .publish("sensors/bad/telemetry", format!("garbage {i}"))
            .await;
    }
    publisher.flush().await;
    let more = publish_steadily_from(publisher, 10, 400.0, 300..1500).await;
    sent.extend(more);
    assert_exactly_once(&client, "clone", &sent, Duration::from_secs(90)).await;
    for p in [&b, &c] {
        assert!(
            p.metric("palletd_samples_stored_total", None) > 0.0,
            "both took a share"
        );
    }
    eventually(
        Duration::from_secs(30),
        "every dead letter kept",
        || async {
            all_docs(&client, "clone", "readings_deadletter")
                .await
                .len()
                == 21
        },
    )
    .await;
    // The buckets name all three ids.
    let ids: std::collections::BTreeSet<String> = all_docs(&client, "clone", "readings")
        .await
        .iter()
        .flat_map(|b| {
            b.get_document("lsns")
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    let want: std::collections::BTreeSet<String> = [&image_id, &b_id, &c_id]
        .iter()
        .map(|i| format!("s{i}"))
        .collect();
    assert_eq!(ids, want);
}
