//! The spool's tests: what it does with real files, and its properties
//! over the simulated disk ([`super::sim`]) with faults and power cuts.

use std::fs::{self as stdfs, OpenOptions};

use super::fs::Os;
use super::segment::{self, list_segments};
use super::*;
use crate::record::tests::sample;

/// The box the spools of these tests belong to.
const BOX: &str = "test-box";

/// The window the spools of these tests keep per session (the default).
const WINDOW: usize = 40;

fn os() -> Arc<dyn Storage> {
    fs::os()
}

fn recover(dir: &Path) -> io::Result<Recovery> {
    recover::recover(&Os, dir, BOX, &Default::default(), 1000)
}

/// A spool whose appends continue at `first` (the records' own LSNs).
fn start_at(dir: &Path, first: Option<u64>, max_size: u64) -> (Spool, AppenderThread) {
    start_with(dir, first, max_size, false, WhenFull::Stop)
}

fn start_with(
    dir: &Path,
    first: Option<u64>,
    max_size: u64,
    compress: bool,
    when_full: WhenFull,
) -> (Spool, AppenderThread) {
    let mut rec = recover(dir).unwrap();
    if let Some(first) = first {
        rec.next_lsn = first;
    }
    let settings = SpoolSettings {
        dir: dir.to_path_buf(),
        max_size,
        fsync: Fsync::Batch,
        compress,
        when_full,
        max_queued: DEFAULT_MAX_QUEUED,
        redelivery: Default::default(),
        last_values: 1000,
        held: Vec::new(),
    };
    start(os(), &settings, &rec).unwrap()
}

/// A sample record the size of a real reading.
fn reading(lsn: u64) -> Record {
    let doc = bson::to_vec(&bson::doc! {
        "ts": bson::DateTime::from_millis(1_700_000_000_000 + lsn as i64 % 100_000),
        "temperature": 20.0 + (lsn % 50) as f64 / 10.0,
        "humidity": 40.0 + (lsn % 7) as f64,
    })
    .unwrap();
    Record {
        lsn,
        received_ms: 1_700_000_000_000 + lsn as i64,
        entry: Entry::Sample {
            sensor: format!("sensor-{:04}", lsn % 1000),
            doc,
        },
    }
}

fn compressed_files(dir: &Path) -> usize {
    stdfs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .to_str()
                .is_some_and(|p| p.ends_with(".seg.zst"))
        })
        .count()
}

#[test]
fn segments_moved_on_from_are_compressed_and_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
    let plain: u64 = records.iter().map(|r| r.encode().len() as u64).sum();
    let (spool, thread) = start_with(dir.path(), Some(base), 1 << 20, true, WhenFull::Stop);
    for r in &records {
        append(&spool, r);
    }
    while spool.durable() < base + 20_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let segments = loop {
        let segments = list_segments(&Os, dir.path()).unwrap();
        // Every segment but the open one, once the compressor is done
        // (counted in the same listing: the compressor renames files
        // meanwhile).
        let compressed = segments
            .iter()
            .filter(|s| segment::is_compressed(&s.1))
            .count();
        if segments.len() > 2 && compressed == segments.len() - 1 {
            break segments;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        segments[..segments.len() - 1]
            .iter()
            .all(|(_, p)| segment::is_compressed(p)),
        "{segments:?}"
    );
    thread.finish();
    let on_disk = spool.bytes();
    assert!(on_disk * 3 < plain, "{on_disk} bytes on disk for {plain}");
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.records, 20_000);
    assert_eq!(rec.bytes, on_disk);
    assert!(rec.uncompressed.is_empty());
    // From the middle of a compressed segment, in small reads.
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), base + 777);
    let mut got = Vec::new();
    loop {
        let batch = reader.read_records(999, base + 20_000).unwrap();
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    assert_eq!(got, records[777..].to_vec());
}

#[test]
fn a_read_stopped_at_its_limit_goes_on_from_there() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 100).map(reading).collect();
    write_all(dir.path(), &records, 1 << 30);
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), base);
    assert_eq!(reader.read_records(1000, base + 40).unwrap(), records[..40]);
    assert_eq!(
        reader.read_records(1000, base + 100).unwrap(),
        records[40..]
    );
}

#[test]
fn a_compression_cut_short_is_cleaned_up_at_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
    write_all(dir.path(), &records, 1 << 20);
    let segments = list_segments(&Os, dir.path()).unwrap();
    assert!(segments.len() > 2);
    // The first one compressed but not yet swapped, the second one
    // half way through compressing.
    let tmp = appender::compress_segment(&Os, &segments[0].1, segments[0].0, 0).unwrap();
    stdfs::rename(
        &tmp,
        dir.path().join(segment::compressed_name(segments[0].0)),
    )
    .unwrap();
    let _ = appender::compress_segment(&Os, &segments[1].1, segments[1].0, 0).unwrap();
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.records, 20_000);
    assert_eq!(compressed_files(dir.path()), 1);
    assert!(!segments[0].1.exists(), "the plain copy went");
    assert_eq!(
        rec.uncompressed.len(),
        list_segments(&Os, dir.path()).unwrap().len() - 2,
        "the rest is queued for compression"
    );
    let got = Reader::new(os(), dir.path().to_path_buf(), 0)
        .read_records(100_000, u64::MAX)
        .unwrap();
    assert_eq!(got, records);
}

#[test]
fn drop_oldest_deletes_the_oldest_segments_and_a_reader_finds_exactly_what_was_lost() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
    let max_size = 256 * 1024;
    let (spool, thread) = start_with(
        dir.path(),
        Some(base),
        max_size,
        false,
        WhenFull::DropOldest,
    );
    // The first 100 are in MongoDB.
    spool.checkpoint(base + 100);
    for r in &records {
        append(&spool, r);
    }
    while spool.durable() < base + 20_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!spool.is_full(), "it made room");
    let bytes = spool.bytes();
    assert!(bytes <= max_size, "{bytes}");
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), base);
    let kept = reader.read_records(100_000, u64::MAX).unwrap();
    assert_eq!(kept, records[20_000 - kept.len()..], "the newest are kept");
    let missing = reader.take_missing();
    assert_eq!(
        missing,
        (base + 100..base + 20_000 - kept.len() as u64).collect::<Vec<u64>>(),
        "a reader finds every deleted reading missing, the confirmed ones not"
    );
    spool.forget_lost(&missing).unwrap();
    let mut again = Reader::new(os(), dir.path().to_path_buf(), base);
    again.read_records(100_000, u64::MAX).unwrap();
    assert!(
        again.take_missing().is_empty(),
        "counted ones are forgotten"
    );
    thread.finish();
}

fn append(spool: &Spool, r: &Record) {
    spool
        .tx
        .blocking_send(Command::Append {
            bytes: r.encode().into(),
            end: r.lsn + 1,
        })
        .unwrap();
}

fn write_all(dir: &Path, records: &[Record], max_size: u64) {
    let (spool, thread) = start_at(dir, records.first().map(|r| r.lsn), max_size);
    for r in records {
        append(&spool, r);
    }
    thread.finish();
}

#[test]
fn written_records_are_read_back_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 5000).map(sample).collect();
    write_all(dir.path(), &records, 256 * 1024);
    assert!(list_segments(&Os, dir.path()).unwrap().len() > 1, "rotated");
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.records, 5000);
    assert!(rec.next_lsn >= base + 5000);
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), base + 10);
    let mut got = Vec::new();
    loop {
        let batch = reader.read_records(700, base + 5000).unwrap();
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    assert_eq!(got, records[10..].to_vec());
}

#[test]
fn a_torn_write_past_the_durable_lsn_is_cut_and_the_rest_kept() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 10).map(sample).collect();
    write_all(dir.path(), &records[..9], 1 << 30);
    let (_, path) = list_segments(&Os, dir.path()).unwrap().pop().unwrap();
    // Power lost while the tenth was appended: half of it reached the
    // disk, it was never durable, never acknowledged.
    let torn = records[9].encode();
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, &torn[..torn.len() / 2]).unwrap();
    drop(f);
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.records, 9);
    assert_eq!(rec.torn_bytes as usize, torn.len() / 2);
    assert_eq!(rec.damaged, 0, "a torn write is not damage");
    assert!(rec.next_lsn >= base + 9);
    let got = Reader::new(os(), dir.path().to_path_buf(), 0)
        .read_records(100, u64::MAX)
        .unwrap();
    assert_eq!(got, records[..9].to_vec());
    // Appending after the cut works and reads back in order.
    write_all(dir.path(), &[sample(base + 9)], 1 << 30);
    let got = Reader::new(os(), dir.path().to_path_buf(), 0)
        .read_records(100, u64::MAX)
        .unwrap();
    assert_eq!(got.len(), 10);
}

/// A power cut can catch unsynced only the last [`appender::MAX_UNSYNCED`]
/// bytes of the newest segment. A bad page before them (an SD card that
/// lost a page it had long since written) is damage to records that were
/// acknowledged, even when the `durable` file, written without a sync, is
/// missing after the cut: counted, and every intact record after it kept.
/// (It was taken for a tear: the segment was cut back to its start, and
/// thousands of acknowledged readings went, uncounted.)
#[test]
fn a_damaged_synced_page_is_damage_even_without_the_durable_file() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 30_000).map(reading).collect();
    write_all(dir.path(), &records, 1 << 30);
    let (_, path) = list_segments(&Os, dir.path()).unwrap().pop().unwrap();
    let mut bytes = stdfs::read(&path).unwrap();
    assert!(
        bytes.len() as u64 > 2 * appender::MAX_UNSYNCED,
        "{}",
        bytes.len()
    );
    // A 4 KiB page a third of the way in, well before the last MiB.
    let page = bytes.len() / 3 / 4096 * 4096;
    for b in &mut bytes[page..page + 4096] {
        *b = 0xff;
    }
    stdfs::write(&path, &bytes).unwrap();
    stdfs::remove_file(dir.path().join("durable")).unwrap();
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.torn_bytes, 0, "damage far from the end is no tear");
    assert_eq!(stdfs::metadata(&path).unwrap().len() as usize, bytes.len());
    // A page holds a few dozen of these records; those it touched are lost.
    assert!(
        rec.damaged > 0 && rec.damaged < 100,
        "damaged {}",
        rec.damaged
    );
    assert_eq!(rec.records + rec.damaged, records.len() as u64);
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), 0);
    let mut got = Vec::new();
    loop {
        let batch = reader.read_records(5000, u64::MAX).unwrap();
        if batch.is_empty() {
            break;
        }
        got.extend(batch);
    }
    assert_eq!(got.len() as u64, rec.records);
    assert_eq!(got.last(), records.last(), "the records after it are kept");
    let lost: Vec<u64> = records
        .iter()
        .map(|r| r.lsn)
        .filter(|l| !got.iter().any(|g| g.lsn == *l))
        .collect();
    assert_eq!(lost.len() as u64, rec.damaged);
    assert_eq!(
        lost.last().unwrap() - lost[0] + 1,
        rec.damaged,
        "one stretch: {lost:?}"
    );

    // A tear in the last bytes is still one, cut and not counted.
    let torn = reading(base + 30_000).encode();
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut f, &torn[..torn.len() / 2]).unwrap();
    drop(f);
    let damaged_before = rec.damaged;
    let rec = recover(dir.path()).unwrap();
    assert_eq!(
        rec.damaged, 0,
        "the page was counted once ({damaged_before})"
    );
    // Cut from the last record that surely belongs to a finished commit:
    // these records carry no message identity to cut at.
    assert!(
        rec.torn_bytes > 0 && rec.torn_bytes <= appender::MAX_UNSYNCED + torn.len() as u64,
        "cut {}",
        rec.torn_bytes
    );
    let shortest = records.iter().map(|r| r.encode().len()).min().unwrap() as u64;
    assert!(
        rec.records >= 30_000 - damaged_before - appender::MAX_UNSYNCED / shortest,
        "kept {}",
        rec.records
    );
}

/// The last record was acknowledged (the `durable` file says so): a bad
/// byte in it is damage, counted, and the file is not cut.
#[test]
fn a_damaged_last_record_after_a_clean_stop_is_counted_not_replayed_nor_cut() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 3).map(sample).collect();
    write_all(dir.path(), &records, 1 << 30);
    let (_, path) = list_segments(&Os, dir.path()).unwrap().pop().unwrap();
    let mut bytes = stdfs::read(&path).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 0xff;
    stdfs::write(&path, &bytes).unwrap();
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.records, 2);
    assert_eq!(rec.damaged, 1);
    assert_eq!(rec.torn_bytes, 0);
    assert_eq!(stdfs::metadata(&path).unwrap().len() as usize, bytes.len());
    let got = Reader::new(os(), dir.path().to_path_buf(), 0)
        .read_records(100, u64::MAX)
        .unwrap();
    assert_eq!(got, records[..2].to_vec());
    assert_eq!(recover(dir.path()).unwrap().damaged, 0, "counted once");
}

#[test]
fn checkpoint_deletes_whole_segments_below_it_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 5000).map(sample).collect();
    let (spool, thread) = start_at(dir.path(), Some(base), 256 * 1024);
    for r in &records {
        append(&spool, r);
    }
    let before = list_segments(&Os, dir.path()).unwrap().len();
    spool.checkpoint(base + 4000);
    thread.finish();
    let after = list_segments(&Os, dir.path()).unwrap();
    assert!(after.len() < before, "{} -> {}", before, after.len());
    assert!(
        after[0].0 <= base + 4000,
        "the segment holding the checkpoint stays"
    );
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.checkpoint, base + 4000);
    assert_eq!(rec.records, 1000);
    let got = Reader::new(os(), dir.path().to_path_buf(), rec.checkpoint)
        .read_records(10_000, u64::MAX)
        .unwrap();
    assert_eq!(got, records[4000..].to_vec());
}

/// What the spool is asked to hold stays although MongoDB confirmed it
/// (the Sparkplug B changes a start replays onto the last snapshot), and
/// goes once the hold moves on, also when the checkpoint did not.
#[test]
fn a_hold_keeps_its_records_past_the_checkpoint_until_it_moves() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 5000).map(sample).collect();
    let (spool, thread) = start_at(dir.path(), Some(base), 256 * 1024);
    spool.hold(Holder::Thinning, base + 1000);
    for r in &records {
        append(&spool, r);
    }
    spool.checkpoint(base + 4000);
    while spool.checkpointed() < base + 4000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = list_segments(&Os, dir.path()).unwrap();
    assert!(held.len() >= 3, "{held:?}");
    assert!(held[0].0 <= base + 1000, "the held records' segment stays");
    let got = Reader::new(os(), dir.path().to_path_buf(), base + 1000)
        .read_records(10_000, u64::MAX)
        .unwrap();
    assert_eq!(got, records[1000..].to_vec());

    // The hold moves on; the checkpoint stays where it is.
    spool.hold(Holder::Thinning, base + 4000);
    let started = std::time::Instant::now();
    let moved = loop {
        let now = list_segments(&Os, dir.path()).unwrap();
        if now.len() < held.len() || started.elapsed() > Duration::from_secs(10) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    thread.finish();
    assert!(
        moved.len() < held.len(),
        "{} -> {}",
        held.len(),
        moved.len()
    );
    assert!(moved[0].0 > base + 1000 && moved[0].0 <= base + 4000);
}

#[test]
fn message_ids_are_recovered_by_session_the_last_window_of_each() {
    use crate::front::window::{Redelivery, Seen};
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let id = |i: u64, session: SessionId, pkid: u16| Record {
        lsn: base + i,
        received_ms: 0,
        entry: Entry::MessageId {
            session,
            pkid,
            digest: u64::from(pkid) * 10 + i,
            topic: None,
        },
    };
    let ids = [
        // palletd 0.1's records: by connection index.
        id(0, SessionId::Index(0), 1),
        id(1, SessionId::Index(2), 1),
        id(2, SessionId::Key(100), 2),
        id(3, SessionId::Key(100), 3),
        id(4, SessionId::Key(102), 4),
        id(5, SessionId::Index(9), 5),
    ];
    write_all(dir.path(), &ids, 1 << 30);
    let redelivery = Redelivery {
        window: 2,
        by_index: vec![100, 101, 102],
    };
    let rec = recover::recover(&Os, dir.path(), BOX, &redelivery, 1000).unwrap();
    let seen = |pkid: u16, i: u64| Seen {
        pkid,
        digest: u64::from(pkid) * 10 + i,
    };
    // The last two of the first session (index 0 is its client id now).
    assert_eq!(rec.windows.of(100), [seen(2, 2), seen(3, 3)]);
    assert_eq!(rec.windows.of(102), [seen(1, 1), seen(4, 4)]);
    assert_eq!(rec.windows.keys().len(), 2, "index 9 means no session now");
}

/// The identities the broker may still resend outlive the segments that
/// held them: written to `message-ids` before the checkpoint deletes
/// them, read back at the next start.
#[test]
fn message_ids_survive_the_deletion_of_their_segments() {
    use crate::front::window::Seen;
    let dir = tempfile::tempdir().unwrap();
    let mut lsn = recover(dir.path()).unwrap().next_lsn;
    let (spool, thread) = start_at(dir.path(), None, 1 << 30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut spool = spool;
        let mut bytes = Vec::new();
        for pkid in 1..=50u16 {
            Record {
                lsn,
                received_ms: 0,
                entry: Entry::MessageId {
                    session: SessionId::Key(7),
                    pkid,
                    digest: u64::from(pkid),
                    topic: None,
                },
            }
            .encode_into(&mut bytes);
            lsn += 1;
        }
        spool.append(bytes.into(), lsn).await.unwrap();
        spool.wait_durable(lsn).await.unwrap();
        // Everything is in MongoDB: the open segment goes too.
        spool.checkpoint(lsn);
        while !list_segments(&Os, dir.path()).unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    thread.finish();
    let rec = recover(dir.path()).unwrap();
    let want: Vec<Seen> = (11..=50u16)
        .map(|pkid| Seen {
            pkid,
            digest: u64::from(pkid),
        })
        .collect();
    assert_eq!(rec.windows.of(7), want, "the last 40 (the default window)");
}

/// The topics' last values outlive the segments that held them (the file
/// `retained`, written before the checkpoint deletes them), and the
/// records left after the file are taken over it, in LSN order: from an
/// identity that names its topic (QoS 1/2) or a record of their own
/// (QoS 0).
#[test]
fn last_values_survive_the_deletion_of_their_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut lsn = recover(dir.path()).unwrap().next_lsn;
    let (spool, thread) = start_at(dir.path(), Some(lsn), 1 << 30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let record = |lsn: u64, topic: u64, digest: u64, qos0: bool| Record {
        lsn,
        received_ms: 0,
        entry: match qos0 {
            true => Entry::LastValue { topic, digest },
            false => Entry::MessageId {
                session: SessionId::Key(7),
                pkid: (lsn % 60_000) as u16 + 1,
                digest,
                topic: Some(topic),
            },
        },
    };
    rt.block_on(async {
        let mut spool = spool;
        let mut bytes = Vec::new();
        for topic in 1..=20u64 {
            record(lsn, topic, 100 + topic, topic % 2 == 0).encode_into(&mut bytes);
            lsn += 1;
        }
        spool.append(bytes.into(), lsn).await.unwrap();
        spool.wait_durable(lsn).await.unwrap();
        spool.checkpoint(lsn);
        while !list_segments(&Os, dir.path()).unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        // After the file: topic 3 changes again, in a segment left.
        let mut bytes = Vec::new();
        record(lsn, 3, 999, true).encode_into(&mut bytes);
        lsn += 1;
        spool.append(bytes.into(), lsn).await.unwrap();
        spool.wait_durable(lsn).await.unwrap();
    });
    thread.finish();
    assert!(dir.path().join(crate::front::retained::FILE_NAME).exists());
    let rec = recover(dir.path()).unwrap();
    for topic in 1..=20u64 {
        let want = if topic == 3 { 999 } else { 100 + topic };
        assert!(rec.last_values.same(topic, want), "topic {topic}");
    }
    assert_eq!(rec.last_values.len(), 20);
}

#[test]
fn a_checkpoint_past_everything_frees_even_the_open_segment() {
    // One append larger than the whole spool: the open segment alone
    // makes it full. Once the checkpoint confirms all of it, the spool
    // must have room again, or it would stay full for ever (no append
    // comes to rotate the segment away).
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let (spool, thread) = start_at(dir.path(), Some(base), 64 * 1024);
    let mut bytes = Vec::new();
    let n = 2000;
    for lsn in base..base + n {
        sample(lsn).encode_into(&mut bytes);
    }
    assert!(bytes.len() as u64 > spool.max_size());
    spool
        .tx
        .blocking_send(Command::Append {
            bytes: bytes.into(),
            end: base + n,
        })
        .unwrap();
    while spool.durable() < base + n {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(spool.is_full());
    spool.checkpoint(base + n - 1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(spool.is_full(), "the last record is not confirmed yet");
    spool.checkpoint(base + n);
    let deadline = Instant::now() + Duration::from_secs(5);
    while spool.is_full() {
        assert!(Instant::now() < deadline, "the spool stays full");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(list_segments(&Os, dir.path()).unwrap().is_empty());
    // Appends go on in a new segment, and recovery sees them.
    append(&spool, &sample(base + n));
    thread.finish();
    let rec = recover(dir.path()).unwrap();
    assert_eq!(rec.checkpoint, base + n);
    assert_eq!(rec.records, 1);
    assert!(rec.next_lsn > base + n);
}

#[test]
fn a_record_not_yet_durable_is_left_for_the_next_read() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    let records: Vec<Record> = (base..base + 10).map(sample).collect();
    write_all(dir.path(), &records, 1 << 30);
    let mut reader = Reader::new(os(), dir.path().to_path_buf(), base);
    // Only the first five are durable yet, though all ten are written.
    let first = reader.read_records(100, base + 5).unwrap();
    assert_eq!(first, records[..5].to_vec());
    let rest = reader.read_records(100, base + 10).unwrap();
    assert_eq!(rest, records[5..].to_vec(), "none skipped");
}

// ------------------------------------------------------------------------
// Properties over the simulated disk: the real appender, recovery and
// reader, with EIO, short writes, failed syncs that lose their data, a
// full disk, power cuts that tear any block, and bit rot.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::appender::{Appender, Command as Cmd, Start};
use super::sim::{Faults, Sim};

fn sim_dir() -> PathBuf {
    PathBuf::from("/spool")
}

/// A group commit larger than [`appender::MAX_UNSYNCED`] syncs on the way,
/// at append boundaries, so a power cut can tear no more than that much
/// at the end of the newest segment (what recovery relies on).
#[test]
fn a_large_group_commit_syncs_every_max_unsynced_bytes() {
    let (mut rig, _) = Rig::open(Sim::new(7), 64 << 20);
    let pad = 200 << 10;
    // Fifteen appends of 200 KiB waiting for one commit: 3 MB.
    for _ in 0..15 {
        rig.append(1, pad);
    }
    let before = rig.app.shared.fsyncs.load(Ordering::Relaxed);
    assert!(rig.commit());
    let syncs = rig.app.shared.fsyncs.load(Ordering::Relaxed) - before;
    // Five appends fit in 1 MiB: three syncs.
    assert_eq!(syncs, 3, "one per MAX_UNSYNCED bytes");
    assert_eq!(rig.app.durable(), rig.next);
}

/// The appender driven by hand over a simulated disk, and what was
/// appended and acknowledged.
struct Rig {
    sim: Sim,
    app: Appender,
    segment_size: u64,
    next: u64,
    /// Everything below this was made durable (acknowledged).
    acked: u64,
    /// The highest checkpoint asked for: below it, records are "in MongoDB"
    /// and may be gone.
    confirmed: u64,
    /// Every record appended that may still be in the spool, by LSN.
    written: BTreeMap<u64, Record>,
}

impl Rig {
    fn open(sim: Sim, segment_size: u64) -> (Rig, Recovery) {
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let rec =
            recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
        let rig = Rig::at(sim, segment_size, &rec, BTreeMap::new());
        (rig, rec)
    }

    fn at(sim: Sim, segment_size: u64, rec: &Recovery, written: BTreeMap<u64, Record>) -> Rig {
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let shared = Arc::new(Shared::new(DEFAULT_MAX_QUEUED));
        shared.checkpoint.store(rec.checkpoint, Ordering::Relaxed);
        shared.requested.store(rec.checkpoint, Ordering::Relaxed);
        let app = Appender::new(Start {
            storage,
            dir: sim_dir(),
            fsync: Fsync::Batch,
            segment_size,
            next_lsn: rec.next_lsn,
            checkpoint: rec.checkpoint,
            shared,
            max_size: u64::MAX,
            when_full: WhenFull::Stop,
            compressor: None,
            windows: rec.windows.clone(),
            last_values: rec.last_values.clone(),
        });
        // Nothing lies below the first record: checkpoints start there.
        let first = written.keys().next().copied().unwrap_or(rec.next_lsn);
        Rig {
            sim,
            app,
            segment_size,
            next: rec.next_lsn,
            acked: rec.next_lsn,
            confirmed: rec.checkpoint.max(first),
            written,
        }
    }

    fn storage(&self) -> Arc<dyn Storage> {
        Arc::new(self.sim.clone())
    }

    /// Appends a message of `k` samples of `pad` bytes each and its
    /// identity (last, as the admission writes it), as one admission batch.
    fn append(&mut self, k: usize, pad: usize) {
        let mut bytes = Vec::new();
        for i in 0..=k {
            let entry = match i < k {
                true => Entry::Sample {
                    sensor: format!("s{}", self.next % 7),
                    doc: vec![(self.next % 251) as u8; pad + 1],
                },
                false => Entry::MessageId {
                    session: SessionId::Key(self.next % 3),
                    pkid: (self.next % 65_535) as u16,
                    digest: self.next,
                    topic: None,
                },
            };
            let r = Record {
                lsn: self.next,
                received_ms: self.next as i64,
                entry,
            };
            r.encode_into(&mut bytes);
            self.written.insert(r.lsn, r);
            self.next += 1;
        }
        let mut closing = false;
        let end = self.next;
        self.app.take(
            Cmd::Append {
                bytes: bytes.into(),
                end,
            },
            &mut closing,
        );
    }

    /// One commit attempt; true when everything appended is durable.
    fn commit(&mut self) -> bool {
        let ok = self.app.commit().is_ok();
        self.app.housekeeping();
        if ok {
            self.app.committed();
        }
        let durable = self.app.durable();
        assert!(durable >= self.acked, "the durable LSN never goes back");
        self.acked = durable;
        ok
    }

    /// The pipeline confirms everything below `lsn`.
    fn checkpoint(&mut self, lsn: u64) {
        let lsn = lsn.min(self.acked);
        self.confirmed = self.confirmed.max(lsn);
        self.app.shared.requested.fetch_max(lsn, Ordering::Relaxed);
        self.app.housekeeping();
    }

    /// Compresses the oldest closed plain segment, as the compressor does.
    fn compress(&mut self) {
        let storage = self.storage();
        let segments = list_segments(storage.as_ref(), &sim_dir()).unwrap();
        let closed = segments.len().saturating_sub(1);
        let plain = segments[..closed]
            .iter()
            .find(|(_, p)| !segment::is_compressed(p))
            .cloned();
        if let Some((first, path)) = plain {
            let checkpoint = self.app.checkpoint;
            if let Ok(tmp) = appender::compress_segment(storage.as_ref(), &path, first, checkpoint)
            {
                let mut closing = false;
                self.app.take(Cmd::Compressed { first, tmp }, &mut closing);
            }
        }
    }

    /// Everything readable from `from` on.
    fn read_all(&self, from: u64) -> Vec<Record> {
        Reader::new(self.storage(), sim_dir(), from)
            .read_records(usize::MAX, u64::MAX)
            .unwrap()
    }

    /// A power cut, recovery, and the checks: every acknowledged record not
    /// yet confirmed is back, intact, in order; nothing else is invented;
    /// no damage is reported (nothing rotted); each session's recovered
    /// window is identities appended under it, in order, and (`whole`: the
    /// disk worked when segments were last deleted) exactly the window of
    /// durable identities the appender held, whether their segments were
    /// deleted or not. Then palletd runs on.
    fn crash_and_check(self, whole: bool) -> Result<Rig, TestCaseError> {
        let Rig {
            sim,
            app,
            segment_size,
            acked,
            confirmed,
            mut written,
            ..
        } = self;
        let held = app.windows.clone();
        drop(app);
        sim.crash();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let rec =
            recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
        prop_assert_eq!(rec.damaged, 0, "a power cut is not damage");
        prop_assert!(
            rec.checkpoint <= confirmed,
            "the checkpoint {} is one that was asked for (at most {})",
            rec.checkpoint,
            confirmed
        );
        prop_assert!(rec.next_lsn >= acked, "LSNs are never handed out twice");
        let got = Reader::new(storage.clone(), sim_dir(), rec.checkpoint)
            .read_records(usize::MAX, u64::MAX)
            .unwrap();
        for w in got.windows(2) {
            prop_assert!(w[0].lsn < w[1].lsn, "in LSN order");
        }
        for r in &got {
            prop_assert_eq!(Some(r), written.get(&r.lsn), "a record as it was appended");
        }
        let back: std::collections::HashSet<u64> = got.iter().map(|r| r.lsn).collect();
        let from = rec.checkpoint.max(confirmed);
        for lsn in written.range(from..acked).map(|(l, _)| *l) {
            prop_assert!(
                back.contains(&lsn),
                "acknowledged record {} lost (durable up to {}, checkpoint {})",
                lsn,
                acked,
                rec.checkpoint
            );
        }
        // What was not acknowledged and did not survive is gone for good.
        written.retain(|lsn, _| *lsn < acked || back.contains(lsn));
        for key in 0..3u64 {
            let ids: Vec<crate::front::window::Seen> = written
                .values()
                .filter_map(|r| match r.entry {
                    Entry::MessageId {
                        session: SessionId::Key(k),
                        pkid,
                        digest,
                        ..
                    } if k == key => Some(crate::front::window::Seen { pkid, digest }),
                    _ => None,
                })
                .collect();
            let got = rec.windows.of(key);
            let mut rest = ids.iter();
            prop_assert!(
                got.iter().all(|g| rest.any(|i| i == g)),
                "session {}: recovered {:?}, not among those appended",
                key,
                got
            );
            prop_assert!(got.len() <= WINDOW);
            if whole {
                prop_assert_eq!(got, held.of(key), "session {}'s window", key);
            }
        }
        let mut rig = Rig::at(sim, segment_size, &rec, written);
        rig.confirmed = confirmed.max(rec.checkpoint);
        Ok(rig)
    }
}

/// One read of the reader following the rig's appender: what it returns
/// is as written and in order, and everything below `complete_to` was
/// returned.
fn follow(
    rig: &Rig,
    reader: &mut Reader,
    got: &mut Vec<u64>,
    start: u64,
    max: usize,
) -> Result<(), TestCaseError> {
    let r = reader.read(max, rig.acked).unwrap();
    prop_assert!(r.records <= max);
    prop_assert!(r.complete_to <= rig.acked);
    for rec in parse(&r.bytes) {
        prop_assert_eq!(Some(&rec.into_record()), rig.written.get(&rec.lsn));
        got.push(rec.lsn);
    }
    let expect: Vec<u64> = rig
        .written
        .range(start..r.complete_to)
        .map(|(l, _)| *l)
        .collect();
    prop_assert!(
        got.len() >= expect.len(),
        "complete to {} but not all returned",
        r.complete_to
    );
    prop_assert_eq!(&got[..expect.len()], &expect[..]);
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Append { records: u8, pad: u16 },
    Commit,
    Faults { eio: u8, short: u8, lost: u8 },
    Checkpoint(u8),
    Compress,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u8..6, 0u16..200).prop_map(|(records, pad)| Op::Append { records, pad }),
        4 => Just(Op::Commit),
        2 => (0u8..3, 0u8..3, 0u8..3).prop_map(|(eio, short, lost)| Op::Faults { eio, short, lost }),
        1 => (0u8..=100).prop_map(Op::Checkpoint),
        1 => Just(Op::Compress),
        1 => Just(Op::Crash),
    ]
}

fn chance(level: u8) -> f64 {
    [0.0, 0.1, 0.4][level as usize]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No acknowledged record is lost to EIO, short writes, a failed fsync
    /// that drops its data (the next one "succeeds"), commands of a batch
    /// after a failed one, or a power cut tearing any block, and the
    /// sessions' windows outlive the segments. Mutants this kills (each
    /// tried): trusting the sync after a failed one (records acknowledged
    /// without being on disk), dropping the appends staged behind a failed
    /// write, writing on after a short write without cutting the file back
    /// (a torn record below the durable LSN), keeping identities in the
    /// windows before they are durable (a crash then recovers identities
    /// of records it lost), deleting segments without saving the windows
    /// first.
    #[test]
    fn acknowledged_records_survive_write_and_sync_faults_and_power_cuts(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let (mut rig, _) = Rig::open(Sim::new(seed), 600);
        for op in ops {
            match op {
                Op::Append { records, pad } => rig.append(records as usize, pad as usize),
                Op::Commit => { rig.commit(); }
                Op::Faults { eio, short, lost } => rig.sim.set_faults(Faults {
                    eio: chance(eio),
                    short_write: chance(short),
                    lost_sync: chance(lost),
                }),
                Op::Checkpoint(pct) => {
                    let span = rig.acked - rig.confirmed;
                    rig.checkpoint(rig.confirmed + span * pct as u64 / 100);
                }
                Op::Compress => rig.compress(),
                Op::Crash => rig = rig.crash_and_check(false)?,
            }
        }
        // The disk heals: what waits becomes durable, and survives.
        rig.sim.set_faults(Faults::default());
        prop_assert!(rig.commit(), "writes work again once the disk does");
        prop_assert_eq!(rig.acked, rig.next);
        let mut rig = rig.crash_and_check(false)?;
        // Everything confirmed: every segment goes, and the windows with
        // them into their file.
        rig.append(1, 0);
        prop_assert!(rig.commit());
        rig.checkpoint(rig.next);
        rig.crash_and_check(true)?;
    }

    /// A reader following the appender returns every record once, in
    /// order, whatever the appender meets (short writes leave half records
    /// at the end of the file for a while, segments rotate, get compressed
    /// and deleted under it), and a read says how far it is complete.
    /// Mutant this kills: a reader that consumes the bytes of a record
    /// still being written (it then starts the next read mid-record).
    #[test]
    fn a_reader_returns_every_record_once_in_order_while_the_appender_writes_and_fails(
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..80),
        maxes in proptest::collection::vec(1usize..20, 80),
    ) {
        let (mut rig, rec) = Rig::open(Sim::new(seed), 600);
        let start = rec.next_lsn;
        let mut reader = Reader::new(rig.storage(), sim_dir(), start);
        let mut got: Vec<u64> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Append { records, pad } => rig.append(records as usize, pad as usize),
                Op::Commit => { rig.commit(); }
                Op::Faults { eio, short, lost } => rig.sim.set_faults(Faults {
                    eio: chance(eio),
                    short_write: chance(short),
                    lost_sync: chance(lost),
                }),
                // What the reader returned is what the pipeline confirms.
                Op::Checkpoint(pct) => {
                    let to = got.last().map_or(start, |l| l + 1);
                    let span = to.saturating_sub(rig.confirmed);
                    rig.checkpoint(rig.confirmed + span * pct as u64 / 100);
                }
                Op::Compress => rig.compress(),
                // A restart: the next run's LSNs jump (to the clock), so a
                // read up to its first durable LSN reaches the end of the
                // segment being written while LSNs below the limit remain:
                // there a half-written record must be left alone.
                Op::Crash => {
                    rig.sim.set_faults(Faults::default());
                    if rig.commit() {
                        rig.app.close();
                        let storage = rig.storage();
                        let rec = recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
                        let written = std::mem::take(&mut rig.written);
                        rig = Rig::at(rig.sim.clone(), rig.segment_size, &rec, written);
                    }
                }
            }
            if i % 3 == 0 {
                follow(&rig, &mut reader, &mut got, start, maxes[i])?;
            }
        }
        rig.sim.set_faults(Faults::default());
        prop_assert!(rig.commit());
        loop {
            let before = got.len();
            follow(&rig, &mut reader, &mut got, start, 7)?;
            if got.len() == before {
                break;
            }
        }
        let all: Vec<u64> = rig.written.range(start..).map(|(l, _)| *l).collect();
        prop_assert_eq!(got, all);
    }
}

/// Records lost to damage that palletd counted: the markers it left.
fn counted(sim: &Sim) -> u64 {
    let storage: &dyn Storage = sim;
    segment::list_ranges(storage, &sim_dir(), "damaged")
        .unwrap()
        .iter()
        .map(|(a, b, _)| b - a + 1)
        .sum()
}

/// Where each record of a segment file lies: (byte range in the file, LSNs
/// there). A plain segment: one range per record; a compressed one: one
/// per frame.
fn layout(sim: &Sim, path: &Path) -> Vec<(std::ops::Range<usize>, Vec<u64>)> {
    let bytes = sim.contents(path);
    let mut out = Vec::new();
    if !segment::is_compressed(path) {
        let mut at = 0;
        for r in parse(&bytes) {
            let len = r.into_record().encode().len();
            out.push((at..at + len, vec![r.lsn]));
            at += len;
        }
        return out;
    }
    let mut at = 16;
    while at < bytes.len() {
        let n = zstd::zstd_safe::find_frame_compressed_size(&bytes[at..]).unwrap();
        let plain = zstd::bulk::decompress(&bytes[at..at + n], 1 << 24).unwrap();
        out.push((at..at + n, parse(&plain).map(|r| r.lsn).collect()));
        at += n;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Bit rot: one to three flipped bits anywhere in the segment files
    /// (plain and compressed) cost the records they hit alone (a plain
    /// record, or the compressed frame holding it), every other record is
    /// read back, and exactly the lost ones are counted, once, whether
    /// recovery or a read finds them. Mutants this kills: recovery cutting
    /// the segment at the first bad record (the 10,000 readings),
    /// the reader skipping the rest of a segment at damage.
    #[test]
    fn bit_rot_costs_the_damaged_record_or_frame_alone_and_is_counted_once(
        seed in any::<u64>(),
        batches in proptest::collection::vec((1u8..8, 0u16..300), 5..60),
        compress in proptest::collection::vec(any::<bool>(), 8),
        flips in proptest::collection::vec((any::<u16>(), any::<u32>(), 0u8..8), 1..4),
        at_start in any::<bool>(),
    ) {
        let (mut rig, rec) = Rig::open(Sim::new(seed), 2048);
        for (k, pad) in batches {
            rig.append(k as usize, pad as usize);
            prop_assert!(rig.commit());
        }
        for c in compress {
            if c {
                rig.compress();
            }
        }
        rig.app.close();
        let storage = rig.storage();
        let segments = list_segments(storage.as_ref(), &sim_dir()).unwrap();
        // A read while palletd runs never meets the open segment's end
        // damaged (it is in the page cache): rot only closed segments then.
        let candidates = match at_start {
            true => &segments[..],
            false => &segments[..segments.len() - 1],
        };
        prop_assume!(!candidates.is_empty());
        let layouts: Vec<_> = candidates.iter().map(|(_, p)| layout(&rig.sim, p)).collect();
        let mut hit: std::collections::BTreeSet<u64> = Default::default();
        for (file, offset, bit) in flips {
            let file = file as usize % candidates.len();
            let path = &candidates[file].1;
            let len = rig.sim.contents(path).len();
            let offset = offset as usize % len;
            for (range, lsns) in layouts[file].iter().cloned() {
                if range.contains(&offset) {
                    hit.extend(lsns);
                }
            }
            rig.sim.flip(path, offset, bit);
        }
        let got = if at_start {
            let r = recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
            let got = rig.read_all(r.checkpoint);
            prop_assert_eq!(r.damaged, counted(&rig.sim));
            got
        } else {
            rig.read_all(rec.next_lsn)
        };
        let back: std::collections::BTreeSet<u64> = got.iter().map(|r| r.lsn).collect();
        for r in &got {
            prop_assert_eq!(Some(r), rig.written.get(&r.lsn), "read back as written");
        }
        let lost: Vec<u64> = rig.written.keys().copied().filter(|l| !back.contains(l)).collect();
        for l in &lost {
            prop_assert!(hit.contains(l), "record {} lost though no flip hit it", l);
        }
        prop_assert_eq!(counted(&rig.sim), lost.len() as u64, "every lost record counted, once");
        // And again: nothing is counted twice.
        let again = recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
        prop_assert_eq!(again.damaged, 0);
        prop_assert_eq!(rig.read_all(again.checkpoint).len(), got.len());
    }
}

/// The disk fills during an outage; once MongoDB confirms what the spool
/// holds, the appender frees those segments before it needs a file of its
/// own (the checkpoint), so writes go on. Before, the checkpoint's new file
/// came first: with the disk full it failed, nothing was deleted, and the
/// spool stayed stuck for good.
#[test]
fn a_full_disk_frees_confirmed_segments_before_it_needs_a_new_file() {
    let sim = Sim::new(7);
    let (mut rig, _) = Rig::open(sim.clone(), 1024);
    sim.set_capacity(Some(8 * 1024));
    let mut full = false;
    for _ in 0..200 {
        rig.append(4, 100);
        if !rig.commit() {
            full = true;
            break;
        }
    }
    assert!(full, "the disk filled");
    assert_eq!(sim.free_space(&sim_dir()), Some(0));
    // Everything durable is confirmed.
    rig.checkpoint(rig.acked);
    assert!(rig.commit(), "room again once confirmed segments went");
    assert_eq!(rig.acked, rig.next);
    rig.checkpoint(rig.acked);
    let storage = rig.storage();
    assert_eq!(checkpoint::read(storage.as_ref(), &sim_dir()), rig.acked);
}

/// A compression cut short by a full disk leaves no temporary file behind
/// (one leaked before, and counted against nothing).
#[test]
fn a_compression_that_fails_leaves_nothing_behind() {
    let sim = Sim::new(3);
    let (mut rig, _) = Rig::open(sim.clone(), 1024);
    for _ in 0..8 {
        rig.append(4, 100);
        assert!(rig.commit());
    }
    let used: u64 = sim.files().iter().map(|f| f.1 as u64).sum();
    sim.set_capacity(Some(used + 20));
    rig.compress();
    assert!(
        sim.files()
            .iter()
            .all(|(p, _)| !p.to_string_lossy().ends_with(".tmp")),
        "{:?}",
        sim.files()
    );
}

/// `spool.max_size` counts every file of the spool directory, not only
/// segments (tombstones, damage markers, the Sparkplug state, the id).
#[test]
fn the_spool_size_counts_every_file_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let base = recover(dir.path()).unwrap().next_lsn;
    stdfs::write(dir.path().join("sparkplug.json"), vec![b' '; 50_000]).unwrap();
    let records: Vec<Record> = (base..base + 10).map(sample).collect();
    write_all(dir.path(), &records, 1 << 30);
    let rec = recover(dir.path()).unwrap();
    let on_disk: u64 = stdfs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(rec.bytes, on_disk);
    assert!(rec.bytes > 50_000);
}

#[test]
fn a_spool_copied_to_another_box_takes_a_new_id_and_keeps_the_old_one_for_its_records() {
    let sim = Sim::new(1);
    let (mut rig, rec) = Rig::open(sim.clone(), 4096);
    let old = rec.tags.current();
    rig.append(10, 10);
    assert!(rig.commit());
    rig.app.close();
    let storage = rig.storage();
    let on_b = recover::recover(
        storage.as_ref(),
        &sim_dir(),
        "box-b",
        &Default::default(),
        1000,
    )
    .unwrap();
    let new = on_b.tags.current();
    assert_ne!(new, old, "a new id on the other box");
    assert_eq!(on_b.tags.previous(), &[(old, on_b.next_lsn)]);
    let first = *rig.written.keys().next().unwrap();
    assert_eq!(on_b.tags.of(first), old, "its records keep the old id");
    assert_eq!(on_b.tags.of(on_b.next_lsn), new);
    // The same box again: nothing changes.
    let again = recover::recover(
        storage.as_ref(),
        &sim_dir(),
        "box-b",
        &Default::default(),
        1000,
    )
    .unwrap();
    assert_eq!(again.tags, on_b.tags);
    // Once the checkpoint passed its records, the old id goes.
    let mut rig = Rig::at(sim.clone(), 4096, &again, BTreeMap::new());
    rig.append(1, 1);
    assert!(rig.commit());
    rig.checkpoint(rig.acked);
    rig.app.close();
    let later = recover::recover(
        storage.as_ref(),
        &sim_dir(),
        "box-b",
        &Default::default(),
        1000,
    )
    .unwrap();
    assert_eq!(later.tags.current(), new);
    assert!(later.tags.previous().is_empty());
}

#[test]
fn an_unreadable_spool_id_is_restored_from_its_copy_and_never_becomes_zero() {
    let sim = Sim::new(2);
    let (mut rig, rec) = Rig::open(sim.clone(), 4096);
    let id = rec.tags.current();
    rig.append(3, 3);
    assert!(rig.commit());
    rig.app.close();
    let storage = rig.storage();
    let path = sim_dir().join("spool.id");
    sim.flip(&path, 25, 1);
    let back =
        recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
    assert_eq!(back.tags.current(), id, "from spool.id.copy");
    // Both gone bad: a new id (never 0), said at ERROR.
    sim.flip(&path, 25, 1);
    sim.flip(&sim_dir().join("spool.id.copy"), 25, 1);
    let fresh =
        recover::recover(storage.as_ref(), &sim_dir(), BOX, &Default::default(), 1000).unwrap();
    assert_ne!(fresh.tags.current(), id);
    assert_ne!(fresh.tags.current(), 0);
}

/// A read up to a durable LSN beyond the last record (LSNs that hold no
/// record: the admission's `end` may run ahead of its records) reaches the
/// end of the segment being written, where a write that failed half way
/// left half a record. That half is left alone and read whole later.
/// Mutant this kills: a reader that consumes it, loses its place and
/// skips the records after it (the core then took the short read for the
/// whole range).
#[test]
fn a_half_written_record_at_the_end_of_the_newest_segment_is_left_for_the_next_read() {
    let sim = Sim::new(11);
    let (mut rig, rec) = Rig::open(sim.clone(), 1 << 20);
    rig.append(5, 40);
    // The durable LSN runs 50 ahead of the records.
    rig.next += 50;
    let mut closing = false;
    let end = rig.next;
    rig.app.take(
        Cmd::Append {
            bytes: Default::default(),
            end,
        },
        &mut closing,
    );
    assert!(rig.commit());
    let limit = rig.acked;
    assert_eq!(limit, end);
    rig.append(3, 40);
    let storage = rig.storage();
    let newest = list_segments(storage.as_ref(), &sim_dir()).unwrap()[0]
        .1
        .clone();
    let synced = sim.contents(&newest).len();
    let one = rig.written.values().next().unwrap().encode().len();
    // Writes fail after a short one, until half a record is in the file.
    for _ in 0..1000 {
        sim.set_faults(Faults {
            eio: 0.5,
            short_write: 1.0,
            lost_sync: 0.0,
        });
        let committed = rig.commit();
        assert!(!committed || sim.contents(&newest).len() > synced + 3 * one);
        sim.set_faults(Faults::default());
        let extra = sim.contents(&newest).len() - synced;
        if extra > 0 && extra < one {
            break;
        }
    }
    let extra = sim.contents(&newest).len() - synced;
    assert!(extra > 0 && extra < one, "half a record: {extra} bytes");
    let mut reader = Reader::new(storage.clone(), sim_dir(), rec.next_lsn);
    let first = reader.read(100, limit).unwrap();
    assert_eq!(
        first.records, 6,
        "five samples and their message's identity"
    );
    assert_eq!(first.complete_to, limit);
    assert!(rig.commit(), "the disk works again");
    let rest = reader.read(100, rig.acked).unwrap();
    assert_eq!(
        rest.records, 4,
        "the half-written record and those after it"
    );
    assert_eq!(rest.complete_to, rig.acked);
}

/// A message's records: its samples, then its identity (the admission
/// writes them so). A write torn inside a message that was never
/// acknowledged takes the whole message with it: recovered, its samples
/// would be stored and its redelivery too (its identity gone with the
/// tear); its identity recovered alone, its redelivery would be skipped
/// and its samples lost.
#[test]
fn a_torn_write_takes_the_whole_message_it_tore_with_it() {
    let message = |first: u64, pkid: u16| -> Vec<Record> {
        let mut m: Vec<Record> = (first..first + 2).map(sample).collect();
        m.push(Record {
            lsn: first + 2,
            received_ms: 0,
            entry: Entry::MessageId {
                session: SessionId::Key(5),
                pkid,
                digest: 7,
                topic: None,
            },
        });
        m
    };
    for tear_in in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let whole = message(base, 1);
        write_all(dir.path(), &whole, 1 << 30);
        let (_, path) = list_segments(&Os, dir.path()).unwrap().pop().unwrap();
        // The second message, never durable: cut short in its record
        // `tear_in` (a sample, a sample, its identity).
        let torn = message(base + 3, 2);
        let mut bytes = Vec::new();
        for r in &torn[..tear_in] {
            r.encode_into(&mut bytes);
        }
        let half = torn[tear_in].encode();
        bytes.extend_from_slice(&half[..half.len() / 2]);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, &bytes).unwrap();
        drop(f);
        let rec = recover(dir.path()).unwrap();
        assert_eq!(
            rec.windows.of(5),
            [crate::front::window::Seen { pkid: 1, digest: 7 }],
            "tear in {tear_in}"
        );
        let got = Reader::new(os(), dir.path().to_path_buf(), 0)
            .read_records(100, u64::MAX)
            .unwrap();
        assert_eq!(got, whole, "tear in {tear_in}: the first message alone");
    }
}

/// Appends the appender has not written yet count against
/// `spool.max_size`, and its queue is bounded in bytes: a disk that stalls
/// (here every write fails) can carry neither the spool past its size nor
/// palletd's memory past `max_queued`. Mutant this kills: the admission saw
/// only the bytes in the files, and the appender's queue took 1,024
/// batches of any size (in CI a slow disk let 2,000 messages through a
/// full 64 KiB spool, all acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_waiting_for_the_disk_count_against_the_size_and_are_bounded_in_bytes() {
    let sim = Sim::new(5);
    let settings = SpoolSettings {
        dir: sim_dir(),
        max_size: 64 * 1024,
        fsync: Fsync::Batch,
        compress: false,
        when_full: WhenFull::Stop,
        max_queued: 256 * 1024,
        redelivery: Default::default(),
        last_values: 1000,
        held: Vec::new(),
    };
    let (spool, rec, thread) = open_on(Arc::new(sim.clone()), &settings, BOX).unwrap();
    sim.set_faults(Faults {
        eio: 1.0,
        ..Faults::default()
    });
    let mut lsn = rec.next_lsn;
    let mut batch = || {
        let mut bytes = Vec::new();
        for _ in 0..100 {
            bytes.extend_from_slice(&reading(lsn).encode());
            lsn += 1;
        }
        (bytes::Bytes::from(bytes), lsn)
    };
    let mut appended = 0;
    while appended < settings.max_size as usize {
        let (bytes, end) = batch();
        appended += bytes.len();
        spool.append(bytes, end).await.unwrap();
    }
    assert!(spool.bytes() < settings.max_size, "nothing written");
    assert!(spool.is_full(), "what waits for the disk counts");
    while spool.queued() < settings.max_queued {
        let (bytes, end) = batch();
        spool.append(bytes, end).await.unwrap();
    }
    let (bytes, end) = batch();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), spool.append(bytes.clone(), end))
            .await
            .is_err(),
        "a full queue makes the next append wait"
    );
    sim.set_faults(Faults::default());
    spool.append(bytes, end).await.unwrap();
    let mut spool = spool;
    spool.wait_durable(end).await.unwrap();
    assert_eq!(spool.queued(), 0);
    drop(spool);
    tokio::task::spawn_blocking(move || thread.finish())
        .await
        .unwrap();
}
