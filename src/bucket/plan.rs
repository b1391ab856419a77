//! The planner: one sensor's samples cut into statements.

use super::*;

use crate::spool_ids::Tags;

/// Cuts one sensor's samples (arrival order) into statements.
///
/// Runs of consecutive samples that share a window become one or more
/// statements each: the first fills the remembered open bucket of that
/// window, the rest start new buckets of at most `max_samples` samples and
/// `max_bytes` bytes. `memory` is updated with the fill the plan expects, so
/// a later run of the same window continues where this one stopped; the
/// caller replaces it with what the database reported once the write is done.
///
/// Every sample must fit in an empty bucket ([`Shape::check`]); bigger ones
/// are dead-lettered before they get here. A run is also cut where the
/// spool id of its samples changes (`tags`), so each statement's LSN pair
/// goes under the id its samples were written with.
pub fn plan(samples: &Samples, memory: &mut Fills, shape: &Shape, tags: &Tags) -> Vec<Statement> {
    let mut out = Vec::new();
    let mut current: Option<Statement> = None;
    // The numeric names the current statement carries (each costs its
    // summaries once per statement).
    let mut names: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (i, sample) in samples.iter().enumerate() {
        let start = shape.window_start(sample.ts_ms);
        let tag = tags.of(sample.lsn);
        if let Some(st) = current.as_mut() {
            let base = st.base.unwrap_or_default();
            let bytes = sample.bytes()
                + sample
                    .nums()
                    .filter(|(n, _)| !names.contains(n))
                    .map(|(n, _)| summary_cost(n))
                    .sum::<u32>();
            let pushes = sample.pushes() as u32;
            let fits = st.start_ms == start
                && st.tag == tag
                && base.count + st.count() + pushes <= shape.max_samples
                && base.bytes + st.bytes + bytes <= shape.max_bytes;
            if fits {
                st.bytes += bytes;
                st.pushed += pushes;
                st.range.end = i + 1;
                names.extend(sample.nums().map(|(n, _)| n));
                continue;
            }
        }
        if let Some(st) = current.take() {
            close_statement(st, memory, &mut out);
        }
        names.clear();
        names.extend(sample.nums().map(|(n, _)| n));
        let bytes = sample.cost();
        // Extend the remembered bucket if this sample fits, else start the
        // next (the first of a window palletd knows nothing of).
        let known = memory.get(&start).copied();
        let pushes = sample.pushes() as u32;
        let mut base = known.filter(|f| {
            f.count + pushes <= shape.max_samples
                && f.bytes.saturating_add(bytes) <= shape.max_bytes
        });
        // A bucket with little room left ([`Shape::little_room`]) that
        // this run of the window overflows is left as it is when the whole
        // run fits a new one: one statement instead of two, so a bucket's
        // end costs no extra statement (at 10,000 sensors filling their
        // buckets together, the second statements pushed the lag p99 to
        // 20 s). At most a sixteenth of a bucket goes unused; the bucket
        // left is sealed early like a full one ([`Statement::leaves`]).
        let mut leaves = false;
        if let Some(b) = base.filter(|b| shape.little_room(b.count)) {
            let (n, run_bytes) = window_run(samples, i, start, tag, shape, tags);
            let room = (shape.max_samples - b.count) as usize;
            if n > room && n <= shape.max_samples as usize && run_bytes <= shape.max_bytes {
                base = None;
                leaves = true;
            }
        }
        let seq = match (base, known) {
            (Some(b), _) => b.seq,
            (None, Some(k)) => k.seq + 1,
            (None, None) => 0,
        };
        current = Some(Statement {
            start_ms: start,
            range: i..i + 1,
            pushed: pushes,
            bytes,
            base,
            tag,
            seq,
            leaves,
        });
    }
    if let Some(st) = current {
        close_statement(st, memory, &mut out);
    }
    out
}

/// The samples from `i` on that belong to window `start` under spool id
/// `tag`, in a row: how many (up to one more than a bucket holds) and
/// what they cost at most (each with its summaries, as if alone).
fn window_run(
    samples: &Samples,
    i: usize,
    start: i64,
    tag: u32,
    shape: &Shape,
    tags: &Tags,
) -> (usize, u32) {
    let mut n = 0;
    let mut bytes = 0u32;
    // By index from `i`: `iter().skip(i)` would read every sample before
    // it, each time a statement starts (quadratic over a long backfill).
    // Bounded too where thinning leaves samples nothing to push.
    for s in (i..samples.len())
        .take(16 * shape.max_samples as usize)
        .map(|j| samples.get(j))
    {
        if n > shape.max_samples as usize
            || shape.window_start(s.ts_ms) != start
            || tags.of(s.lsn) != tag
        {
            break;
        }
        n += s.pushes() as usize;
        bytes = bytes.saturating_add(s.cost());
    }
    (n, bytes)
}

fn close_statement(st: Statement, memory: &mut Fills, out: &mut Vec<Statement>) {
    let base = st.base.unwrap_or_default();
    memory.insert(
        st.start_ms,
        Fill {
            count: base.count + st.count(),
            bytes: base.bytes + st.bytes,
            seq: st.seq,
        },
    );
    out.push(st);
}
