//! Spool append throughput and fsync batching: what durability costs.
//!
//! `cargo bench --bench spool` prints, for each fsync mode, records appended
//! per second and fsyncs per second (group commit batches). Under
//! `cargo test` it runs a small smoke version.

use std::time::Duration;

use palletd::internals::{bench_append, bench_read, Fsync};

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let records: u64 = if full { 500_000 } else { 2_000 };
    let dir = std::env::var_os("PALLETD_BENCH_DIR").map(std::path::PathBuf::from);
    println!("spool append: {records} records of ~110 bytes (a sample record)");
    println!(
        "{:<8} {:>14} {:>12} {:>14}",
        "fsync", "records/s", "fsyncs", "fsyncs/s"
    );
    for (name, mode) in [
        ("off", Fsync::Off),
        ("batch", Fsync::Batch),
        ("always", Fsync::Always),
    ] {
        // "always" is one fsync per record: measure fewer of them.
        let n = if mode == Fsync::Always {
            records / 50
        } else {
            records
        };
        let tmp = match &dir {
            Some(d) => tempfile::tempdir_in(d),
            None => tempfile::tempdir(),
        }
        .expect("temporary directory");
        let (elapsed, fsyncs) = bench_append(tmp.path(), mode, n, 80).expect("spool bench");
        let secs = elapsed.max(Duration::from_micros(1)).as_secs_f64();
        println!(
            "{name:<8} {:>14.0} {fsyncs:>12} {:>14.0}",
            n as f64 / secs,
            fsyncs as f64 / secs
        );
    }
    // Reading back what one of them wrote: recovery's scan of every
    // segment, then every record read in steps of 50,000.
    let tmp = match &dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("temporary directory");
    bench_append(tmp.path(), Fsync::Off, records, 80).expect("spool bench");
    let (recover, read, n) = bench_read(tmp.path()).expect("spool read bench");
    println!(
        "recovery scan {:>10.0} records/s; read back {:>10.0} records/s ({n} records)",
        records as f64 / recover.as_secs_f64().max(1e-6),
        n as f64 / read.as_secs_f64().max(1e-6),
    );
}
