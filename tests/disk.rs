//! Faults of the disk under the spool, with real processes: bit rot in a
//! segment, write and fsync errors injected with libfiu, a full disk (a
//! small tmpfs) during a database outage, a SIGKILL, and a spool copied to
//! another box. Each ends by comparing what was published with what the
//! buckets hold, and with what palletd counted as lost.

mod common;

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
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "nothing left to write", |p| {
            p.metric("palletd_pending_samples", None) == 0.0
                && p.metric("palletd_backlog_readings", None) == 0.0
        })
        .await;
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
