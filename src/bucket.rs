//! The bucket document: how a reading becomes a sample, how a sensor's
//! pending samples are cut into upsert statements, and the BSON of those
//! statements. Sans-IO.
//!
//! A statement carries its caps in the filter (`count <= cap - k`,
//! `size <= max_bytes - bytes`), so no statement can overfill a bucket no
//! matter what the gateway believes about the bucket's fill. The planner uses
//! the remembered fill only to cut a run exactly: fill the open bucket, then
//! start full-sized new ones.
//!
//! Each statement also records which spool records it carries: `$push`
//! of its first and last LSN onto `lsns.<spool>` (see [`lsns_field`]). A
//! statement's samples are consecutive in their sensor's queue, which
//! holds every sample of the sensor read between them that is not yet in
//! MongoDB, so the pair names exactly the statement's samples of that
//! sensor and window; a replay asks whether a bucket of its sample's
//! sensor and window holds a pair around the sample's LSN.
//!
//! Besides `sum`, `n`, `min` and `max`, each numeric field's first and
//! last reading go in as `first.<f>` and `last.<f>`, `{t, v}` documents
//! kept by `$min` and `$max` (MongoDB compares documents field by field:
//! by time, then by value), so a bucket carries every summary a rollup
//! needs and rollups never read samples ([`crate::store::rollup`]). They
//! are written with every statement rather than computed by the seal: on
//! SecantusDB a seal computing them from the samples took 8-10 times as
//! long (200 buckets of 200 samples and 9 fields: 9.5-11.8 s against
//! 1.2 s), while the two more paths per field cost a statement of one
//! sample and 3 fields 8-30% and one of many samples proportionally less.
//!
//! With thinning ([`crate::thin`]) a sample carries what the admission
//! decided ([`THIN`], [`ARCHIVE`]): a statement pushes the fields kept and
//! the points stored late, counts those against the caps (`count`), and
//! summarises every reading; `thinned` counts the readings left out.

use bson::{rawdoc, RawArrayBuf, RawBson, RawDocument, RawDocumentBuf};

use crate::decode::{FieldValue, Reading};
use crate::tags::Tags;

/// Bucket caps and window, in the units the planner works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub window_ms: i64,
    pub max_samples: u32,
    pub max_bytes: u32,
}

impl Shape {
    /// Start of the window holding `ts_ms` (floor, also before 1970).
    pub fn window_start(&self, ts_ms: i64) -> i64 {
        ts_ms.div_euclid(self.window_ms) * self.window_ms
    }

    /// Whether a bucket of `count` samples has so little room left (a
    /// sixteenth of `max_samples` or less) that a run overflowing it goes
    /// whole to the next bucket ([`plan`]) and filling it makes no sensor
    /// ready to flush early.
    pub fn little_room(&self, count: u32) -> bool {
        count >= self.nearly_full()
    }

    /// The fewest samples of a bucket with little room left.
    pub fn nearly_full(&self) -> u32 {
        self.max_samples - self.max_samples / 16
    }
}

/// A sample larger than a whole bucket may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sample of {bytes} bytes does not fit in a bucket (bucket.max_bytes = {max_bytes})")]
pub struct TooBig {
    pub bytes: u32,
    pub max_bytes: u32,
}

impl Shape {
    /// Refuses a sample that could never fit in a bucket.
    pub fn check(&self, sample: SampleRef<'_>) -> Result<(), TooBig> {
        let bytes = sample.cost();
        if bytes > self.max_bytes {
            return Err(TooBig {
                bytes,
                max_bytes: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// One sample, borrowed: where it is in time, its spool LSN and its
/// document `{ts: Date, <field>: value, ...}` as it is pushed into
/// `samples`. The document's double fields are the numeric fields the
/// rollups cover (read back from it when a statement is built).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRef<'a> {
    pub ts_ms: i64,
    /// Log sequence number of the sample's spool record. A sensor's queue
    /// is in LSN order, and a bucket records the LSN ranges applied to it.
    pub lsn: u64,
    pub doc: &'a RawDocument,
}

impl<'a> SampleRef<'a> {
    /// A sample read from its document: `None` without a `ts` date.
    pub fn from_doc(doc: &'a RawDocument, lsn: u64) -> Option<SampleRef<'a>> {
        Some(SampleRef {
            ts_ms: ts_of(doc)?,
            lsn,
            doc,
        })
    }

    /// Bytes it counts against `bucket.max_bytes`: its document (with
    /// what thinning keeps beside it, a few bytes too many), nothing when
    /// thinning left it nothing to push ([`SampleRef::pushes`]).
    pub fn bytes(&self) -> u32 {
        if self.pushes() {
            self.doc.as_bytes().len() as u32
        } else {
            0
        }
    }

    /// The thinning it went through, `{field: {k, b, v?}}` ([`THIN`]).
    fn thin(&self) -> Option<&'a RawDocument> {
        match self.doc.get(THIN) {
            Ok(Some(bson::RawBsonRef::Document(thin))) => Some(thin),
            _ => None,
        }
    }

    /// Whether it is a point thinning stored after the reading it came
    /// with ([`ARCHIVE`]): pushed, and no reading of the summaries.
    /// The mark is its second element ([`Sample::archive`]): one look.
    pub fn is_archive(&self) -> bool {
        self.second().is_some_and(|name| name == ARCHIVE)
    }

    /// Whether it sums up readings thinning left out ([`LEFT_OUT`]).
    pub fn is_left_out(&self) -> bool {
        self.second().is_some_and(|name| name == LEFT_OUT)
    }

    /// Whether it is a reading as received (not a point stored late, not
    /// readings left out): what the latest value may show.
    pub fn is_reading(&self) -> bool {
        self.second()
            .is_none_or(|name| name != ARCHIVE && name != LEFT_OUT)
    }

    /// The name of its second element (the first is `ts`).
    fn second(&self) -> Option<&'a str> {
        self.doc.iter().nth(1)?.ok().map(|(name, _)| name)
    }

    /// Whether it has anything to push into `samples`: a field thinning
    /// did not drop (every sample without thinning does), or a point
    /// stored late. A payload's field never starts with `_` (escaped),
    /// so a second element that does not is a field: one look, but for a
    /// sample that begins with palletd's own keys (Sparkplug B's
    /// `_state`, or nothing kept but [`THIN`]).
    pub fn pushes(&self) -> bool {
        match self.second() {
            Some(name) if !name.starts_with('_') || name == ARCHIVE => true,
            _ => self.thin().is_none(),
        }
    }

    /// The thinning rules of its fields: (field, rule kind, bound).
    pub fn rules(&self) -> impl Iterator<Item = (&'a str, &'a str, f64)> {
        self.thin().into_iter().flat_map(|t| {
            t.iter().flatten().filter_map(|(name, v)| {
                let rule = v.as_document()?;
                let kind = rule.get_str("k").ok()?;
                let bound = rule.get_f64("b").ok()?;
                Some((name, kind, bound))
            })
        })
    }

    /// Bytes it costs a bucket alone: its document and the summary entries
    /// of its numeric fields ([`summary_cost`]).
    pub fn cost(&self) -> u32 {
        self.bytes() + self.nums().map(|(name, _)| summary_cost(name)).sum::<u32>()
    }

    /// The units its payload gave (`{field: unit}`), if any.
    pub fn units(&self) -> Option<&'a RawDocument> {
        match self.doc.get(UNITS) {
            Ok(Some(bson::RawBsonRef::Document(units))) => Some(units),
            _ => None,
        }
    }

    /// Its document as stored, without the units, and the units, which a
    /// bucket keeps once ([`UNITS`]); one look for them per sample (this
    /// is on every statement's path).
    pub fn stored(&self) -> (RawDocumentBuf, Option<&'a RawDocument>) {
        let units = self.units();
        if units.is_none() && self.thin().is_none() && !self.is_archive() {
            return (self.doc.to_raw_document_buf(), None);
        }
        let mut out = RawDocumentBuf::new();
        for (name, value) in self.doc.iter().flatten() {
            if name != UNITS && name != THIN && name != ARCHIVE {
                out.append(name, value.to_raw_bson());
            }
        }
        (out, units)
    }

    /// The reading as received, every value thinning dropped put back
    /// (what the latest value shows): `ts` and the fields.
    pub fn whole(&self) -> RawDocumentBuf {
        let (mut out, _) = self.stored();
        for (name, x) in self.dropped() {
            out.append(name, x);
        }
        out
    }

    /// The values thinning dropped: summarised, not pushed.
    pub fn dropped(&self) -> impl Iterator<Item = (&'a str, f64)> {
        self.thin().into_iter().flat_map(|t| {
            t.iter().flatten().filter_map(|(name, v)| {
                let x = v.as_document()?.get_f64("v").ok()?;
                Some((name, x))
            })
        })
    }

    /// The numeric fields of the reading, for the summaries and rollups:
    /// those it pushes and those thinning dropped; none of an archived
    /// point's (its reading was summarised when it came). One pass over
    /// the document (this is on every statement's path).
    pub fn nums(&self) -> impl Iterator<Item = (&'a str, f64)> {
        let archive = self.is_archive();
        self.doc
            .iter()
            .filter(move |_| !archive)
            .flatten()
            .flat_map(|(name, value)| {
                let (one, thin) = match value {
                    bson::RawBsonRef::Double(x) => (Some((name, x)), None),
                    bson::RawBsonRef::Document(t) if name == THIN => (None, Some(t)),
                    _ => (None, None),
                };
                let dropped = thin.into_iter().flat_map(|t| {
                    t.iter()
                        .flatten()
                        .filter_map(|(name, v)| Some((name, v.as_document()?.get_f64("v").ok()?)))
                });
                one.into_iter().chain(dropped)
            })
    }
}

/// Number summaries a bucket keeps per numeric field name: `sum`, `n`,
/// `min`, `max`, and the seal's `avg`.
const SUMMARY_ENTRIES: u32 = 5;

/// Bytes of a `first.<f>` or `last.<f>` value beyond its name:
/// `{t: Date, v: double}` (length, two elements, NUL) and its entry's
/// type byte and NUL.
const EDGE_ENTRY: u32 = 2 + 4 + (3 + 8) * 2 + 1;

/// Bytes a numeric field name costs a bucket's summaries, once per
/// statement that carries it: an entry (type, name, NUL, eight bytes) in
/// each number summary and one in `first` and `last`. So `size` counts
/// what the bucket holds, its samples and its summaries, and a bucket of
/// many distinct names stays within `bucket.max_bytes` too (each name is
/// counted again by every statement that carries it: an over-count of a
/// few percent on the usual shapes).
pub fn summary_cost(name: &str) -> u32 {
    let name = name.len() as u32;
    SUMMARY_ENTRIES * (name + 10) + 2 * (name + EDGE_ENTRY)
}

/// One numeric field's summary over a statement's samples: sum, count,
/// min, max, and its first and last reading as (ts, value), first and
/// last by time, ties broken by value (the smallest is first, the largest
/// last), the order in which MongoDB compares `{t, v}` documents.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FieldSummary {
    sum: f64,
    n: i32,
    min: f64,
    max: f64,
    first: (i64, f64),
    last: (i64, f64),
}

impl FieldSummary {
    fn of(ts_ms: i64, x: f64) -> FieldSummary {
        FieldSummary {
            sum: x,
            n: 1,
            min: x,
            max: x,
            first: (ts_ms, x),
            last: (ts_ms, x),
        }
    }

    fn add(&mut self, ts_ms: i64, x: f64) {
        self.sum += x;
        self.n += 1;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        if (ts_ms, x) < self.first {
            self.first = (ts_ms, x);
        }
        if (ts_ms, x) > self.last {
            self.last = (ts_ms, x);
        }
    }
}

/// `{t, v}`: a reading's time and value, as `first.<f>` and `last.<f>`
/// hold them (so `$min` and `$max` keep the first and last by time).
fn edge((ts_ms, x): (i64, f64)) -> RawDocumentBuf {
    rawdoc! { "t": bson::DateTime::from_millis(ts_ms), "v": x }
}

/// The `ts` of a sample document (its first field, as palletd writes it).
fn ts_of(doc: &RawDocument) -> Option<i64> {
    doc.iter().flatten().find_map(|(name, value)| match value {
        bson::RawBsonRef::DateTime(t) if name == "ts" => Some(t.timestamp_millis()),
        _ => None,
    })
}

/// Where a sample's document carries the units its payload gave, as
/// `{field: unit}` (its last field; palletd's own, as every name starting
/// with `_`). A statement sets them on the bucket as `units.<field>` and
/// pushes the sample without them; they count against `bucket.max_bytes`
/// with the sample (a few bytes too many, never too few).
pub const UNITS: &str = "_units";

/// Where a sample's document carries the thinning its fields went
/// through ([`crate::thin`]): `{field: {k: rule kind, b: bound, v: value}}`,
/// `v` only when the value was dropped (then the field is not in the
/// document: it is summarised, not pushed). A statement sets
/// `thinning.<field>` from it and counts `readings`.
pub const THIN: &str = "_thin";

/// Marks a sample that is a point thinning stored later than its reading
/// came (the swinging door's last point of a run): pushed, and not
/// summarised again (`{ts, <field>: value, _archive: true}`).
pub const ARCHIVE: &str = "_archive";

/// Marks a sample that sums up readings thinning left out, in time series
/// mode, where no bucket summarises them ([`LeftOut`]):
/// `{ts, _leftOut: {count, sum, n, min, max, first, last, thinning}}`,
/// the summaries shaped as a bucket's. Neither pushed into a bucket nor
/// a reading of its own.
pub const LEFT_OUT: &str = "_leftOut";

/// The readings of one sensor and window that thinning left out, summed
/// up ([`LEFT_OUT`]): `count`, those that left nothing to store (no
/// document of their own); per field its values left out (`sum`, `n`,
/// `min`, `max`, `first`, `last`) and its rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeftOut {
    pub count: i32,
    fields: Vec<(String, FieldSummary, &'static str, f64)>,
}

impl LeftOut {
    /// Adds field `name`'s value `x` of the reading at `ts_ms`, left out
    /// under a rule of `kind` and `bound`.
    pub fn add(&mut self, name: &str, ts_ms: i64, x: f64, kind: &'static str, bound: f64) {
        match self.fields.iter_mut().find(|f| f.0 == name) {
            Some(f) => {
                f.1.add(ts_ms, x);
                (f.2, f.3) = (kind, bound);
            }
            None => self
                .fields
                .push((name.to_string(), FieldSummary::of(ts_ms, x), kind, bound)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.fields.is_empty()
    }

    /// The latest reading's time.
    pub fn last_ts(&self) -> Option<i64> {
        self.fields.iter().map(|f| f.1.last.0).max()
    }

    /// Heap bytes (an estimate).
    pub fn heap_bytes(&self) -> usize {
        self.fields.capacity() * std::mem::size_of::<(String, FieldSummary, &str, f64)>()
            + self.fields.iter().map(|f| f.0.capacity()).sum::<usize>()
    }
}

/// What thinning did to one field of a reading ([`Sample::encode_thinned`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thinned<'a> {
    pub field: &'a str,
    pub kind: &'static str,
    pub bound: f64,
    /// Summarised, not pushed.
    pub dropped: bool,
}

/// One sample, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub ts_ms: i64,
    pub doc: RawDocumentBuf,
    pub lsn: u64,
}

impl Sample {
    pub fn encode(reading: &Reading, lsn: u64) -> Sample {
        Sample::encode_thinned(reading, lsn, &[])
    }

    /// A reading whose fields went through thinning: `thinned` says, per
    /// field, its rule's kind and bound and whether the value was dropped
    /// ([`THIN`]).
    pub fn encode_thinned(reading: &Reading, lsn: u64, thinned: &[Thinned<'_>]) -> Sample {
        let mut doc = RawDocumentBuf::new();
        doc.append("ts", bson::DateTime::from_millis(reading.ts_ms));
        let dropped = |name: &str| thinned.iter().any(|t| t.dropped && t.field == name);
        for (name, value) in &reading.fields {
            if dropped(name) {
                continue;
            }
            match value {
                FieldValue::Num(x) => doc.append(name, *x),
                FieldValue::Str(s) => doc.append(name, s.as_str()),
                FieldValue::Bool(b) => doc.append(name, *b),
                FieldValue::Date(t) => doc.append(name, bson::DateTime::from_millis(*t)),
                FieldValue::Int(i) => doc.append(name, *i),
            }
        }
        if !reading.units.is_empty() {
            let mut units = RawDocumentBuf::new();
            for (name, unit) in &reading.units {
                units.append(name, unit.as_str());
            }
            doc.append(UNITS, units);
        }
        if !thinned.is_empty() {
            let mut thin = RawDocumentBuf::new();
            for t in thinned {
                let mut rule = rawdoc! { "k": t.kind, "b": t.bound };
                if t.dropped {
                    let value = reading.fields.iter().find(|f| f.0 == t.field);
                    if let Some((_, FieldValue::Num(x))) = value {
                        rule.append("v", *x);
                    }
                }
                thin.append(t.field, rule);
            }
            doc.append(THIN, thin);
        }
        Sample {
            ts_ms: reading.ts_ms,
            doc,
            lsn,
        }
    }

    /// Points of one time that thinning stores after their reading came
    /// ([`ARCHIVE`]).
    /// The mark goes second, so [`SampleRef::is_archive`] is one look.
    pub fn archive(ts_ms: i64, fields: &[(&str, f64)], lsn: u64) -> Sample {
        let mut doc = RawDocumentBuf::new();
        doc.append("ts", bson::DateTime::from_millis(ts_ms));
        doc.append(ARCHIVE, true);
        for (name, x) in fields {
            doc.append(*name, *x);
        }
        Sample { ts_ms, doc, lsn }
    }

    /// Readings thinning left out, summed up, as of `ts_ms` (the latest
    /// of them: in their window) ([`LEFT_OUT`]).
    pub fn left_out(ts_ms: i64, left: &LeftOut, lsn: u64) -> Sample {
        let mut parts: [RawDocumentBuf; 7] = Default::default();
        for (name, f, kind, bound) in &left.fields {
            let [sum, n, min, max, first, last, rules] = &mut parts;
            sum.append(name, f.sum);
            n.append(name, f.n);
            min.append(name, f.min);
            max.append(name, f.max);
            first.append(name, edge(f.first));
            last.append(name, edge(f.last));
            rules.append(name, rawdoc! { "kind": *kind, bound_name(kind): *bound });
        }
        let mut summary = rawdoc! { "count": left.count };
        let names = ["sum", "n", "min", "max", "first", "last", "thinning"];
        for (name, part) in names.into_iter().zip(parts) {
            summary.append(name, part);
        }
        let mut doc = RawDocumentBuf::new();
        doc.append("ts", bson::DateTime::from_millis(ts_ms));
        doc.append(LEFT_OUT, summary);
        Sample { ts_ms, doc, lsn }
    }

    pub fn as_ref(&self) -> SampleRef<'_> {
        SampleRef {
            ts_ms: self.ts_ms,
            lsn: self.lsn,
            doc: &self.doc,
        }
    }

    /// Bytes this sample counts against `bucket.max_bytes`.
    pub fn bytes(&self) -> u32 {
        self.as_ref().bytes()
    }
}

/// Where one sample of [`Samples`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    ts_ms: i64,
    lsn: u64,
    /// End of its document in the buffer (it starts where the previous ends).
    end: u32,
}

/// One sensor's samples held compactly: their documents back to back in
/// one buffer, and per sample its time, LSN and where its document ends
/// (24 bytes besides the document, no allocation per sample).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Samples {
    docs: Vec<u8>,
    index: Vec<Slot>,
}

impl Samples {
    pub fn new() -> Samples {
        Samples::default()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of all documents.
    pub fn bytes(&self) -> usize {
        self.docs.len()
    }

    /// Heap bytes held (capacity), for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.docs.capacity() + self.index.capacity() * std::mem::size_of::<Slot>()
    }

    /// Makes room for `samples` more samples of `bytes` in all.
    pub fn reserve(&mut self, samples: usize, bytes: usize) {
        self.index.reserve(samples);
        self.docs.reserve(bytes);
    }

    pub fn push(&mut self, sample: SampleRef<'_>) {
        self.docs.extend_from_slice(sample.doc.as_bytes());
        self.index.push(Slot {
            ts_ms: sample.ts_ms,
            lsn: sample.lsn,
            end: self.docs.len() as u32,
        });
    }

    pub fn get(&self, i: usize) -> SampleRef<'_> {
        let slot = self.index[i];
        let start = if i == 0 {
            0
        } else {
            self.index[i - 1].end as usize
        };
        let bytes = &self.docs[start..slot.end as usize];
        SampleRef {
            ts_ms: slot.ts_ms,
            lsn: slot.lsn,
            // Pushed from a valid document: the bytes are one.
            doc: RawDocument::from_bytes(bytes).expect("a document pushed whole"),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = SampleRef<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }

    pub fn first(&self) -> Option<SampleRef<'_>> {
        (!self.is_empty()).then(|| self.get(0))
    }

    pub fn last(&self) -> Option<SampleRef<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// LSN and time of every sample.
    pub fn keys(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        self.index.iter().map(|s| (s.lsn, s.ts_ms))
    }

    /// Keeps the samples `keep` says yes to, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(SampleRef<'_>) -> bool) {
        let mut out = Samples::new();
        for s in self.iter() {
            if keep(s) {
                out.push(s);
            }
        }
        *self = out;
    }

    /// Splits off the first `n` samples and returns them; these keep the
    /// rest.
    pub fn split_front(&mut self, n: usize) -> Samples {
        if n >= self.len() {
            return std::mem::take(self);
        }
        let cut = self.index[n - 1].end;
        let rest = Samples {
            docs: self.docs[cut as usize..].to_vec(),
            index: self.index[n..]
                .iter()
                .map(|s| Slot {
                    end: s.end - cut,
                    ..*s
                })
                .collect(),
        };
        self.docs.truncate(cut as usize);
        self.index.truncate(n);
        std::mem::replace(self, rest)
    }

    /// How many samples from the front make at most `statements`
    /// statements (at least one sample if there are any), and how many they
    /// make: a statement per run of one window, and one more each time a
    /// run fills `max_samples` ([`plan`] cuts there too; cuts by bytes are
    /// not foreseen).
    pub fn front_within(&self, shape: &Shape, statements: usize) -> (usize, usize) {
        let mut made = 0;
        let mut window = None;
        let mut in_run = 0u32;
        for (i, s) in self.index.iter().enumerate() {
            let start = shape.window_start(s.ts_ms);
            if window != Some(start) || in_run >= shape.max_samples {
                if made >= statements && i > 0 {
                    return (i, made);
                }
                made += 1;
                window = Some(start);
                in_run = 0;
            }
            in_run += 1;
        }
        (self.len(), made)
    }

    /// Appends all of `other` after these.
    pub fn append(&mut self, other: &Samples) {
        for s in other.iter() {
            self.push(s);
        }
    }
}

impl<'a> FromIterator<SampleRef<'a>> for Samples {
    fn from_iter<I: IntoIterator<Item = SampleRef<'a>>>(iter: I) -> Samples {
        let mut out = Samples::new();
        for s in iter {
            out.push(s);
        }
        out
    }
}

/// What the gateway last knew of a window's newest bucket: its sequence
/// number in the window ([`bucket_id`]) and its fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fill {
    pub count: u32,
    pub bytes: u32,
    pub seq: u32,
}

impl Fill {
    /// A sealed bucket: nothing more goes in; the next is `seq + 1`.
    pub fn sealed(seq: u32) -> Fill {
        Fill {
            count: u32::MAX / 2,
            bytes: u32::MAX / 2,
            seq,
        }
    }
}

/// A bucket's `_id`: `<sensorId>|<window start, ms>|<sequence number>`, the
/// n-th bucket of the sensor's window. Every upsert names its bucket by it,
/// a point lookup on the one index every collection has (on SecantusDB
/// about 5,000 statements/s however many buckets a sensor has, against 400/s
/// for a filter on `{sensorId, startTs}` and the caps at 1,000 windows per
/// sensor). Unambiguous: the last two fields hold no `|`.
pub fn bucket_id(sensor: &str, start_ms: i64, seq: u32) -> String {
    format!("{sensor}|{start_ms}|{seq}")
}

/// The sequence number of a [`bucket_id`] (`None` for another `_id`, as
/// the ObjectIds of buckets written before palletd addressed them).
pub fn seq_of(id: &str) -> Option<u32> {
    let (rest, seq) = id.rsplit_once('|')?;
    let (_, start) = rest.rsplit_once('|')?;
    start.parse::<i64>().ok()?;
    seq.parse().ok()
}

/// What palletd knows of one sensor's open buckets: the fill per window
/// start (a window that is absent is unknown). Usually one or two windows,
/// so a small list rather than a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fills(Vec<(i64, Fill)>, Quiet);

/// How many fill lookups of a sensor in a row found no bucket in any
/// window they asked for (saturating): from [`QUIET_LOOKUPS`] on, its new
/// windows are taken to be empty without asking, until a bucket palletd did
/// not know of turns up (a collision on its `_id`); and whether that
/// happened since the last lookup (`surprised`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Quiet {
    misses: u8,
    surprised: bool,
}

/// Lookups that find nothing before a sensor's new windows are no longer
/// looked up: a backfill (history arriving in time order, every window
/// new) then costs the database its upserts only, not a query per flush;
/// a wrong guess costs one collision and turns the lookups back on.
pub const QUIET_LOOKUPS: u8 = 2;

impl Fills {
    pub fn new() -> Fills {
        Fills::default()
    }

    /// Whether a lookup of this sensor's windows is likely to find nothing.
    pub fn quiet(&self) -> bool {
        self.1.misses >= QUIET_LOOKUPS
    }

    /// Whether window `start`, of which nothing is known, is taken to be
    /// empty without a lookup: the sensor is quiet, or the window is newer
    /// than every window palletd knows of it (a live sensor crossing into
    /// its next window: only another writer could have started it, and then
    /// the upsert extends that bucket while it has room; a wrong guess
    /// costs a collision, which turns the lookups back on). Without it,
    /// every sensor's first flush of each window waited for a lookup: at
    /// the hour, 10,000 sensors' lookups at once.
    pub fn assume_empty(&self, start: i64) -> bool {
        self.quiet()
            || (!self.1.surprised && !self.0.is_empty() && self.0.iter().all(|e| e.0 < start))
    }

    /// A lookup of its windows found a bucket (`true`) or none.
    pub fn looked_up(&mut self, found: bool) {
        self.1 = Quiet {
            misses: if found {
                0
            } else {
                self.1.misses.saturating_add(1)
            },
            surprised: false,
        };
    }

    /// A statement met a bucket palletd did not know of: look up again.
    pub fn surprised(&mut self) {
        self.1 = Quiet {
            misses: 0,
            surprised: true,
        };
    }

    pub fn get(&self, start: &i64) -> Option<&Fill> {
        self.0.iter().find(|e| e.0 == *start).map(|e| &e.1)
    }

    pub fn contains_key(&self, start: &i64) -> bool {
        self.get(start).is_some()
    }

    pub fn insert(&mut self, start: i64, fill: Fill) {
        match self.0.iter_mut().find(|e| e.0 == start) {
            Some(e) => e.1 = fill,
            None => self.0.push((start, fill)),
        }
    }

    pub fn remove(&mut self, start: &i64) {
        self.0.retain(|e| e.0 != *start);
    }

    /// Keeps the windows `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&i64, &Fill) -> bool) {
        self.0.retain(|e| keep(&e.0, &e.1));
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<const N: usize> From<[(i64, Fill); N]> for Fills {
    fn from(entries: [(i64, Fill); N]) -> Fills {
        let mut f = Fills::new();
        for (start, fill) in entries {
            f.insert(start, fill);
        }
        f
    }
}

/// One upsert statement: k consecutive samples of one sensor and window,
/// a range of the sensor's run of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub start_ms: i64,
    /// Which of the run's samples it carries.
    pub range: std::ops::Range<usize>,
    /// How many of them it pushes into `samples` (all, but for what
    /// thinning dropped).
    pub pushed: u32,
    pub bytes: u32,
    /// The fill of the bucket this statement expects to extend; `None` when
    /// it expects to start a new bucket (or the fill is unknown).
    pub base: Option<Fill>,
    /// The bucket it writes ([`bucket_id`]): the one it extends, or the
    /// next. A bucket there that it does not fit makes the upsert's insert
    /// collide on `_id` (E11000): it goes to `seq + 1` ([`Statement::collided`]).
    pub seq: u32,
    /// The spool id its samples were written under ([`crate::tags`]): a
    /// statement never carries samples of two.
    pub tag: u32,
    /// It starts bucket `seq` and leaves `seq - 1`, whose fill palletd
    /// knew, with a little room ([`plan`]): that bucket is done, to be
    /// sealed early like a full one.
    pub leaves: bool,
}

impl Statement {
    /// The samples it adds to its bucket's `count`.
    pub fn count(&self) -> u32 {
        self.pushed
    }

    /// What the gateway knows of the bucket's fill after the statement was
    /// applied; `inserted` tells whether the upsert created a new bucket.
    pub fn fill_after(&self, inserted: bool) -> Option<Fill> {
        let k = Fill {
            count: self.count(),
            bytes: self.bytes,
            seq: self.seq,
        };
        match (inserted, self.base) {
            (true, _) => Some(k),
            (false, Some(b)) => Some(Fill {
                count: b.count + k.count,
                bytes: b.bytes + k.bytes,
                seq: self.seq,
            }),
            (false, None) => None,
        }
    }

    /// Its bucket is there and it does not fit (full, or sealed): it goes
    /// to the next one, whose fill is unknown.
    pub fn collided(&mut self) {
        self.seq += 1;
        self.base = None;
        self.leaves = false;
    }
}

/// Statement `i` of a sensor's plan collided ([`Statement::collided`]);
/// the plan's later statements of its window that aimed no further go to
/// its new bucket too (they would collide the same way, a round trip
/// each).
pub fn collided(plan: &mut [Statement], i: usize) {
    plan[i].collided();
    let (start, seq) = (plan[i].start_ms, plan[i].seq);
    for st in plan[i + 1..].iter_mut() {
        if st.start_ms == start && st.seq < seq {
            st.seq = seq;
            st.base = None;
        }
    }
}

impl Statement {
    /// `{q, u, upsert: true}` for the `update` command; `samples` is the run
    /// the statement was planned from.
    ///
    /// `shard_key`: `sensorId` and `startTs` go into the filter as
    /// equalities (a sharded cluster routes an upsert by its shard key and
    /// refuses one without it), else into `$setOnInsert`. The `_id` names
    /// the sensor and window either way, and the filter without them costs
    /// SecantusDB 2-30% less (`bench/probes/statement_shapes.py`: commands
    /// of 1,000 upserts of 3 fields, 2,891-3,368/s against 2,700-3,021/s).
    pub fn to_bson(
        &self,
        sensor: &str,
        samples: &Samples,
        shape: &Shape,
        shard_key: bool,
    ) -> RawDocumentBuf {
        let k = self.count();
        let start = bson::DateTime::from_millis(self.start_ms);
        let end = bson::DateTime::from_millis(self.start_ms + shape.window_ms);
        // Equalities are copied into a bucket the upsert inserts.
        let mut q = rawdoc! { "_id": bucket_id(sensor, self.start_ms, self.seq) };
        let mut on_insert = rawdoc! {};
        let key = if shard_key { &mut q } else { &mut on_insert };
        key.append("sensorId", sensor);
        key.append("startTs", start);
        on_insert.append("endTs", end);
        q.append("closed", false);
        q.append("count", rawdoc! { "$lte": (shape.max_samples - k) as i32 });
        q.append(
            "size",
            rawdoc! { "$lte": (shape.max_bytes - self.bytes) as i32 },
        );
        let mut each = RawArrayBuf::new();
        let mut min_ts = i64::MAX;
        let mut max_ts = i64::MIN;
        let mut first_lsn = u64::MAX;
        let mut last_lsn = 0;
        // Summaries per numeric field, in order of first appearance.
        let mut fields: Vec<(&str, FieldSummary)> = Vec::new();
        // The units the samples gave, the latest of each field.
        let mut units: Vec<(&str, bson::RawBsonRef<'_>)> = Vec::new();
        // Thinning: the readings the statement represents, and per thinned
        // field its rule and the points it pushes.
        let mut readings = 0i32;
        let mut thinned = false;
        let mut rules: Vec<(&str, &str, f64, i32)> = Vec::new();
        for s in self.range.clone().map(|i| samples.get(i)) {
            let (doc, sample_units) = s.stored();
            readings += !s.is_archive() as i32;
            thinned |= s.is_archive();
            for (name, kind, bound) in s.rules() {
                thinned = true;
                let pushed = doc.get(name).ok().flatten().is_some() as i32;
                match rules.iter_mut().find(|r| r.0 == name) {
                    Some(r) => *r = (name, kind, bound, r.3 + pushed),
                    None => rules.push((name, kind, bound, pushed)),
                }
            }
            if s.is_archive() {
                let fields = s.doc.iter().flatten();
                for (name, _) in fields.filter(|f| f.0 != "ts" && !f.0.starts_with('_')) {
                    match rules.iter_mut().find(|r| r.0 == name) {
                        Some(r) => r.3 += 1,
                        None => rules.push((name, "", 0.0, 1)),
                    }
                }
            }
            if s.pushes() {
                each.push(RawBson::Document(doc));
            }
            for (name, unit) in sample_units.into_iter().flat_map(|u| u.iter().flatten()) {
                match units.iter_mut().find(|u| u.0 == name) {
                    Some(u) => u.1 = unit,
                    None => units.push((name, unit)),
                }
            }
            min_ts = min_ts.min(s.ts_ms);
            max_ts = max_ts.max(s.ts_ms);
            first_lsn = first_lsn.min(s.lsn);
            last_lsn = last_lsn.max(s.lsn);
            for (name, x) in s.nums() {
                match fields.iter_mut().find(|r| r.0 == name) {
                    Some(r) => r.1.add(s.ts_ms, x),
                    None => fields.push((name, FieldSummary::of(s.ts_ms, x))),
                }
            }
        }
        let mut inc = rawdoc! { "count": k as i32, "size": self.bytes as i32 };
        let mut set = RawDocumentBuf::new();
        if thinned {
            inc.append("thinned", readings - k as i32);
            for (name, kind, bound, pushed) in rules {
                inc.append(format!("thinning.{name}.stored"), pushed);
                if !kind.is_empty() {
                    set.append(format!("thinning.{name}.kind"), kind);
                    set.append(format!("thinning.{name}.{}", bound_name(kind)), bound);
                }
            }
        }
        let mut min = rawdoc! { "minTs": bson::DateTime::from_millis(min_ts) };
        let mut max = rawdoc! { "maxTs": bson::DateTime::from_millis(max_ts) };
        for (name, f) in fields {
            inc.append(format!("sum.{name}"), f.sum);
            inc.append(format!("n.{name}"), f.n);
            min.append(format!("min.{name}"), f.min);
            max.append(format!("max.{name}"), f.max);
            min.append(format!("first.{name}"), edge(f.first));
            max.append(format!("last.{name}"), edge(f.last));
        }
        let mut push = rawdoc! { "samples": { "$each": each } };
        push.append(
            lsns_field(self.tag),
            rawdoc! { "$each": [first_lsn as i64, last_lsn as i64] },
        );
        let mut u = rawdoc! {
            "$push": push,
            "$inc": inc,
            "$min": min,
            "$max": max,
            "$setOnInsert": on_insert,
        };
        for (name, unit) in units {
            set.append(format!("units.{name}"), unit.to_raw_bson());
        }
        if !set.is_empty() {
            u.append("$set", set);
        }
        rawdoc! { "q": q, "u": u, "upsert": true }
    }
}

/// What a bucket calls a thinning rule's bound: a deadband's `band`, a
/// swinging door's `deviation`.
fn bound_name(kind: &str) -> &'static str {
    if kind == crate::thin::DEADBAND {
        "band"
    } else {
        "deviation"
    }
}

/// The field a spool's statements record their LSN ranges in:
/// `lsns.s<spool id>` (the id in hex, as in `spool.id`), an array of first
/// and last LSN pairs. Each spool has its own, so several palletd
/// instances can write one sensor.
pub fn lsns_field(spool_tag: u32) -> String {
    format!("lsns.s{spool_tag:08x}")
}

/// Whether the LSN ranges recorded in a bucket (`[first, last, ...]`, as
/// [`Statement::to_bson`] pushes them) hold `lsn`.
pub fn ranges_hold(pairs: &[u64], lsn: u64) -> bool {
    pairs.chunks_exact(2).any(|p| p[0] <= lsn && lsn <= p[1])
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One spool id for every sample.
    const ONE: Tags = Tags::new(1);

    /// 260 bytes: two small samples with their summaries fit, three do not.
    const SHAPE: Shape = Shape {
        window_ms: 1000,
        max_samples: 5,
        max_bytes: 260,
    };

    fn sample(ts_ms: i64, lsn: u64, extra: usize) -> Sample {
        let mut fields = vec![("v".to_string(), FieldValue::Num(lsn as f64))];
        if extra > 0 {
            fields.push(("pad".into(), FieldValue::Str("x".repeat(extra))));
        }
        Sample::encode(
            &Reading {
                sensor: "s".into(),
                ts_ms,
                fields,
                ..Reading::default()
            },
            lsn,
        )
    }

    fn owned(samples: impl IntoIterator<Item = Sample>) -> Samples {
        let v: Vec<Sample> = samples.into_iter().collect();
        v.iter().map(|s| s.as_ref()).collect()
    }

    /// The front of a queue within a number of statements is what
    /// [`plan`] makes of it within that number, and splitting it off keeps
    /// both parts whole and in order.
    #[test]
    fn the_front_within_some_statements_is_what_plan_makes_of_it() {
        // Windows of 1 s, at most 5 samples a bucket: windows 0, 0, 0, 1,
        // then 7 samples of window 2 (two buckets), then window 3.
        let ts = [
            0, 10, 20, 1000, 2000, 2001, 2002, 2003, 2004, 2005, 2006, 3000,
        ];
        let all = owned(ts.iter().enumerate().map(|(i, t)| sample(*t, i as u64, 0)));
        let planned = plan(&all, &mut Fills::new(), &SHAPE, &ONE).len();
        assert_eq!(all.front_within(&SHAPE, 100), (12, planned));
        assert_eq!(all.front_within(&SHAPE, 1), (3, 1));
        assert_eq!(all.front_within(&SHAPE, 2), (4, 2));
        assert_eq!(all.front_within(&SHAPE, 3), (9, 3));
        assert_eq!(all.front_within(&SHAPE, 0), (3, 1), "never nothing");
        let mut rest = all.clone();
        let front = rest.split_front(4);
        assert_eq!(
            front.keys().collect::<Vec<_>>(),
            all.keys().take(4).collect::<Vec<_>>()
        );
        assert_eq!(
            rest.keys().collect::<Vec<_>>(),
            all.keys().skip(4).collect::<Vec<_>>()
        );
        assert_eq!(front.bytes() + rest.bytes(), all.bytes());
        for (i, s) in rest.iter().enumerate() {
            assert_eq!(s.doc, all.get(i + 4).doc);
        }
        let mut whole = all.clone();
        assert_eq!(whole.split_front(12), all);
        assert!(whole.is_empty());
    }

    /// A model of the database: buckets by `_id` and the filter semantics
    /// of the upsert.
    #[derive(Default)]
    struct Db {
        buckets: Vec<B>,
    }

    struct B {
        start: i64,
        seq: u32,
        closed: bool,
        count: u32,
        size: u32,
        msgs: Vec<u64>,
    }

    impl Db {
        /// Applies a statement: `Ok(inserted)`, or `Err` for E11000 (its
        /// bucket is there and it does not fit).
        fn apply(&mut self, st: &Statement, samples: &Samples, shape: &Shape) -> Result<bool, ()> {
            let k = st.count();
            let msgs = st.range.clone().map(|i| samples.get(i).lsn);
            match self
                .buckets
                .iter_mut()
                .find(|b| (b.start, b.seq) == (st.start_ms, st.seq))
            {
                Some(b)
                    if !b.closed
                        && b.count <= shape.max_samples - k
                        && b.size <= shape.max_bytes - st.bytes =>
                {
                    b.count += k;
                    b.size += st.bytes;
                    b.msgs.extend(msgs);
                    Ok(false)
                }
                Some(_) => Err(()),
                None => {
                    self.buckets.push(B {
                        start: st.start_ms,
                        seq: st.seq,
                        closed: false,
                        count: k,
                        size: st.bytes,
                        msgs: msgs.collect(),
                    });
                    Ok(true)
                }
            }
        }

        /// Applies statement `i` of a plan as the store does, going to the
        /// next bucket on a collision ([`collided`]), and records the fill
        /// it learned. Returns the collisions.
        fn write(
            &mut self,
            plan: &mut [Statement],
            i: usize,
            samples: &Samples,
            shape: &Shape,
            memory: &mut Fills,
        ) -> u32 {
            let mut collisions = 0;
            let inserted = loop {
                match self.apply(&plan[i], samples, shape) {
                    Ok(inserted) => break inserted,
                    Err(()) => {
                        collided(plan, i);
                        collisions += 1;
                    }
                }
            };
            let st = &plan[i];
            match st.fill_after(inserted) {
                Some(f) => memory.insert(st.start_ms, f),
                None => memory.remove(&st.start_ms),
            }
            collisions
        }
    }

    /// A bucket's `_id` names its sensor, window and sequence number
    /// unambiguously, whatever the sensor id holds; another `_id` has none.
    #[test]
    fn a_bucket_id_gives_back_its_sequence_number() {
        for (sensor, start, seq) in [("s-1", 3_600_000, 0), ("a|1|2", -1000, 7), ("", 0, 42)] {
            let id = bucket_id(sensor, start, seq);
            assert_eq!(seq_of(&id), Some(seq), "{id}");
            assert!(id.starts_with(sensor));
        }
        assert_ne!(bucket_id("a|1", 2, 3), bucket_id("a", 12, 3));
        assert_eq!(seq_of("64f0c0ffee00000000000000"), None);
        assert_eq!(seq_of("a|b|c"), None);
        let samples = owned([sample(1500, 1, 0)]);
        let st = &plan(&samples, &mut Fills::new(), &SHAPE, &ONE)[0];
        let d = bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
        let q = d.get_document("q").unwrap();
        assert_eq!(
            q.get_str("_id"),
            Ok("s|1000|0"),
            "the first bucket of its window"
        );
        let mut next = st.clone();
        next.collided();
        let d =
            bson::Document::try_from(next.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
        assert_eq!(d.get_document("q").unwrap().get_str("_id"), Ok("s|1000|1"));
    }

    #[test]
    fn a_run_fills_the_open_bucket_then_starts_new_ones() {
        let mut memory = Fills::from([(
            0,
            Fill {
                count: 3,
                bytes: 60,
                seq: 0,
            },
        )]);
        let samples = owned((0..9).map(|i| sample(i, i as u64, 0)));
        let out = plan(&samples, &mut memory, &SHAPE, &ONE);
        let counts: Vec<u32> = out.iter().map(|s| s.count()).collect();
        assert_eq!(counts, vec![2, 5, 2]);
        assert_eq!(
            out[0].base,
            Some(Fill {
                count: 3,
                bytes: 60,
                seq: 0,
            })
        );
        assert_eq!(out[1].base, None);
        assert_eq!(memory.get(&0).unwrap().count, 2);
    }

    #[test]
    fn a_run_that_overflows_a_nearly_full_bucket_starts_the_next_whole() {
        let shape = Shape {
            max_samples: 16,
            max_bytes: 100_000,
            ..SHAPE
        };
        let almost = |count| {
            Fills::from([(
                0,
                Fill {
                    count,
                    bytes: count * 20,
                    seq: 3,
                },
            )])
        };
        // One of 16 left (a sixteenth): the run of 5 goes whole to bucket 4.
        let samples = owned((0..5).map(|i| sample(i, i as u64, 0)));
        let mut memory = almost(15);
        let out = plan(&samples, &mut memory, &shape, &ONE);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].seq, out[0].base, out[0].leaves), (4, None, true));
        assert_eq!(memory.get(&0).map(|f| (f.count, f.seq)), Some((5, 4)));
        // A run that fits what is left goes in, as before.
        let one = owned((0..1).map(|i| sample(i, i as u64, 0)));
        let mut memory = almost(15);
        let out = plan(&one, &mut memory, &shape, &ONE);
        assert_eq!((out.len(), out[0].seq, out[0].leaves), (1, 3, false));
        // More room than a sixteenth: filled first, then the next.
        let mut memory = almost(14);
        let out = plan(&samples, &mut memory, &shape, &ONE);
        let cut: Vec<(u32, u32, bool)> = out.iter().map(|s| (s.seq, s.count(), s.leaves)).collect();
        assert_eq!(cut, vec![(3, 2, false), (4, 3, false)]);
        // A run larger than a bucket fills the open one first.
        let many = owned((0..20).map(|i| sample(i, i as u64, 0)));
        let mut memory = almost(15);
        let out = plan(&many, &mut memory, &shape, &ONE);
        let cut: Vec<(u32, u32)> = out.iter().map(|s| (s.seq, s.count())).collect();
        assert_eq!(cut, vec![(3, 1), (4, 16), (5, 3)]);
    }

    #[test]
    fn runs_follow_arrival_order_across_windows() {
        let mut memory = Fills::new();
        let ts = [0, 10, 1500, 20, 1600];
        let samples = owned(ts.iter().enumerate().map(|(i, t)| sample(*t, i as u64, 0)));
        let roomy = Shape {
            max_bytes: 1000,
            ..SHAPE
        };
        let out = plan(&samples, &mut memory, &roomy, &ONE);
        let starts: Vec<i64> = out.iter().map(|s| s.start_ms).collect();
        assert_eq!(starts, vec![0, 1000, 0, 1000]);
        // The second run of window 0 continues the bucket the first one began.
        assert_eq!(
            out[2].base,
            Some(Fill {
                count: 2,
                bytes: out[0].bytes,
                seq: 0,
            })
        );
    }

    #[test]
    fn a_run_is_cut_where_the_spool_id_of_its_samples_changes() {
        let mut memory = Fills::new();
        let samples = owned((0..4).map(|i| sample(i, 10 + i as u64, 0)));
        let tags = Tags::with_previous(2, vec![(1, 12)]);
        let out = plan(&samples, &mut memory, &SHAPE, &tags);
        let cut: Vec<(u32, u32)> = out.iter().map(|s| (s.tag, s.count())).collect();
        assert_eq!(cut[0], (1, 2), "one window, two spool ids: {cut:?}");
        assert!(cut[1..].iter().all(|c| c.0 == 2), "{cut:?}");
        assert_eq!(cut[1..].iter().map(|c| c.1).sum::<u32>(), 2);
    }

    #[test]
    fn size_cap_cuts_statements() {
        let mut memory = Fills::new();
        // A statement costs its samples and, once, the summaries of "v".
        let one = sample(0, 0, 20).bytes();
        let v = summary_cost("v");
        assert!(v + one * 2 <= 260 && v + one * 3 > 260, "{one}");
        let samples = owned((0..5).map(|i| sample(i, i as u64, 20)));
        let out = plan(&samples, &mut memory, &SHAPE, &ONE);
        let counts: Vec<u32> = out.iter().map(|s| s.count()).collect();
        assert_eq!(counts, vec![2, 2, 1]);
    }

    #[test]
    fn a_sample_reads_back_from_its_document() {
        let s = sample(1234, 9, 3);
        let back = SampleRef::from_doc(&s.doc, 9).unwrap();
        assert_eq!(back, s.as_ref());
        let held = owned([sample(5, 1, 0), s.clone(), sample(7, 3, 9)]);
        assert_eq!(held.get(1), s.as_ref(), "compact samples read back whole");
        assert_eq!(held.len(), 3);
        assert_eq!(
            held.bytes(),
            held.iter().map(|x| x.bytes() as usize).sum::<usize>()
        );
    }

    /// MongoDB's rules for a collection sharded on `{sensorId, startTs}`
    /// (hashed or not): an upsert (`updateOne`, `upsert: true`) needs every
    /// shard key field as an equality in its filter, and no statement may
    /// change a shard key field. Then each statement goes to one shard.
    #[test]
    fn every_statement_targets_one_shard_of_a_collection_sharded_on_sensor_and_window() {
        let samples = owned([sample(100, 1, 0), sample(900, 2, 0), sample(1500, 3, 0)]);
        let mut fills = Fills::default();
        let plan = plan(&samples, &mut fills, &SHAPE, &ONE);
        assert!(plan.len() >= 2, "two windows");
        for st in &plan {
            let d = bson::Document::try_from(st.to_bson("s-1", &samples, &SHAPE, true).as_ref())
                .unwrap();
            assert_eq!(d.get_bool("upsert"), Ok(true));
            assert!(!d.get_bool("multi").unwrap_or(false), "updateOne");
            let q = d.get_document("q").unwrap();
            assert_eq!(q.get("sensorId"), Some(&bson::Bson::String("s-1".into())));
            assert!(
                matches!(q.get("startTs"), Some(bson::Bson::DateTime(_))),
                "startTs an equality, not an operator: {q}"
            );
            for (op, fields) in d.get_document("u").unwrap() {
                let fields = fields.as_document().unwrap();
                for key in ["sensorId", "startTs"] {
                    assert!(!fields.contains_key(key), "{op} writes {key}");
                }
            }
        }
    }

    /// Off a sharded cluster the filter is the `_id`, `closed` and the
    /// caps; the sensor and window go in on insert, so the bucket an upsert
    /// makes is the same either way.
    #[test]
    fn without_a_shard_key_the_sensor_and_window_are_set_on_insert() {
        let samples = owned([sample(1500, 1, 0)]);
        let plan = plan(&samples, &mut Fills::default(), &SHAPE, &ONE);
        let d = |key: bool| {
            bson::Document::try_from(plan[0].to_bson("s-1", &samples, &SHAPE, key).as_ref())
                .unwrap()
        };
        let keys = |d: &bson::Document, part: &[&str]| {
            let mut doc = d.clone();
            for p in part {
                doc = doc.get_document(p).unwrap().clone();
            }
            doc.keys().cloned().collect::<Vec<_>>()
        };
        let (routed, direct) = (d(true), d(false));
        assert_eq!(
            keys(&direct, &["q"]),
            ["_id", "closed", "count", "size"],
            "{direct}"
        );
        assert_eq!(
            keys(&direct, &["u", "$setOnInsert"]),
            ["sensorId", "startTs", "endTs"]
        );
        assert_eq!(keys(&routed, &["u", "$setOnInsert"]), ["endTs"]);
        let q = routed.get_document("q").unwrap();
        let on_insert = direct
            .get_document("u")
            .unwrap()
            .get_document("$setOnInsert")
            .unwrap();
        for k in ["sensorId", "startTs"] {
            assert_eq!(q.get(k), on_insert.get(k), "{k}");
        }
        assert_eq!(
            routed.get_document("q").unwrap().get("_id"),
            direct.get_document("q").unwrap().get("_id")
        );
    }

    /// Units ride in a sample's document to the statement, which sets
    /// them on the bucket once (the latest of each field) and pushes the
    /// samples without them.
    #[test]
    fn units_are_set_once_per_bucket_not_pushed_per_sample() {
        let reading = |ts: i64, unit: &str| Reading {
            sensor: "s".into(),
            ts_ms: ts,
            fields: vec![
                ("temp".into(), FieldValue::Num(1.0)),
                ("hum".into(), FieldValue::Num(2.0)),
            ],
            index: 0,
            units: vec![("temp".into(), unit.into()), ("hum".into(), "%RH".into())],
        };
        let samples: Samples = [
            Sample::encode(&reading(1, "Cel"), 1),
            Sample::encode(&reading(2, "K"), 2),
        ]
        .iter()
        .map(Sample::as_ref)
        .collect();
        let st = Statement {
            start_ms: 0,
            range: 0..2,
            pushed: 2,
            bytes: samples.bytes() as u32,
            base: None,
            tag: 1,
            seq: 0,
            leaves: false,
        };
        let d =
            bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, false).as_ref()).unwrap();
        let u = d.get_document("u").unwrap();
        let set = u.get_document("$set").unwrap();
        assert_eq!(set, &bson::doc! { "units.temp": "K", "units.hum": "%RH" });
        let each = u
            .get_document("$push")
            .unwrap()
            .get_document("samples")
            .unwrap()
            .get_array("$each")
            .unwrap();
        for s in each {
            let s = s.as_document().unwrap();
            assert!(!s.contains_key(UNITS), "{s}");
            assert_eq!(s.get_f64("temp"), Ok(1.0));
        }
        // Without units, no $set.
        let plain = owned([sample(1, 4, 0)]);
        let st = Statement {
            range: 0..1,
            pushed: 1,
            ..st
        };
        let d = bson::Document::try_from(st.to_bson("s", &plain, &SHAPE, false).as_ref()).unwrap();
        assert!(!d.get_document("u").unwrap().contains_key("$set"));
    }

    /// A statement pushes what thinning kept and the points it stored
    /// late, counts what it pushes against the caps, and summarises every
    /// reading, dropped or not, once.
    #[test]
    fn a_thinned_statement_pushes_the_kept_and_summarises_every_reading() {
        let r = |ts_ms: i64, t: f64| Reading {
            sensor: "s".into(),
            ts_ms,
            fields: vec![
                ("t".into(), FieldValue::Num(t)),
                ("d".into(), FieldValue::Str("x".into())),
            ],
            ..Reading::default()
        };
        let rule = |dropped| Thinned {
            field: "t",
            kind: crate::thin::SWINGING_DOOR,
            bound: 0.5,
            dropped,
        };
        let only_t = |ts_ms: i64, t: f64| Reading {
            fields: vec![("t".into(), FieldValue::Num(t))],
            ..r(ts_ms, t)
        };
        let samples = owned([
            Sample::encode_thinned(&r(1, 1.0), 1, &[rule(false)]),
            Sample::encode_thinned(&only_t(2, 2.0), 2, &[rule(true)]),
            Sample::archive(2, &[("t", 2.0)], 3),
            Sample::encode_thinned(&only_t(3, 9.0), 4, &[rule(true)]),
        ]);
        let pushes: Vec<bool> = samples.iter().map(|s| s.pushes()).collect();
        assert_eq!(pushes, [true, false, true, false]);
        // palletd's own first field (Sparkplug B's death) without thinning.
        let death = Reading {
            fields: vec![("_state".into(), FieldValue::Str("offline".into()))],
            ..r(4, 0.0)
        };
        assert!(Sample::encode(&death, 5).as_ref().pushes());
        let shape = Shape {
            max_samples: 2,
            max_bytes: 10_000,
            ..SHAPE
        };
        let plan = plan(&samples, &mut Fills::new(), &shape, &ONE);
        assert_eq!(plan.len(), 1, "two pushed fit a bucket of two: {plan:?}");
        assert_eq!((plan[0].range.clone(), plan[0].count()), (0..4, 2));
        let d = bson::Document::try_from(plan[0].to_bson("s", &samples, &shape, false).as_ref())
            .unwrap();
        let u = d.get_document("u").unwrap();
        let pushed = u
            .get_document("$push")
            .unwrap()
            .get_document("samples")
            .unwrap();
        let pushed: Vec<String> = pushed
            .get_array("$each")
            .unwrap()
            .iter()
            .map(|s| format!("{}", s.as_document().unwrap()))
            .collect();
        assert_eq!(pushed.len(), 2);
        assert!(
            pushed[0].contains("\"d\": \"x\"") && pushed[0].contains("\"t\": 1"),
            "{pushed:?}"
        );
        assert!(
            !pushed[1].contains("_archive") && pushed[1].contains("\"t\": 2 }"),
            "{pushed:?}"
        );
        let inc = u.get_document("$inc").unwrap();
        assert_eq!(inc.get_i32("count"), Ok(2));
        assert_eq!(inc.get_i32("thinned"), Ok(1), "3 readings in 2 samples");
        assert_eq!(
            inc.get_f64("sum.t"),
            Ok(12.0),
            "1 + 2 + 9, the archived 2 once"
        );
        assert_eq!(inc.get_i32("n.t"), Ok(3));
        assert_eq!(inc.get_i32("thinning.t.stored"), Ok(2));
        assert_eq!(u.get_document("$max").unwrap().get_f64("max.t"), Ok(9.0));
        let set = u.get_document("$set").unwrap();
        assert_eq!(set.get_str("thinning.t.kind"), Ok("swinging_door"));
        assert_eq!(set.get_f64("thinning.t.deviation"), Ok(0.5));
        // What the latest value shows: the whole reading.
        let whole = samples.get(3).whole();
        assert_eq!(whole.get_f64("t").unwrap(), 9.0);
        assert!(whole.get("_thin").unwrap().is_none());
    }

    #[test]
    fn statement_bson_has_caps_and_rollups() {
        let samples = owned([sample(1, 4, 0), sample(2, 2, 0)]);
        let st = Statement {
            start_ms: 0,
            range: 0..2,
            pushed: 2,
            bytes: 40,
            base: None,
            tag: 0xab,
            seq: 0,
            leaves: false,
        };
        let field = lsns_field(0xab);
        assert_eq!(field, "lsns.s000000ab");
        let d = bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
        assert_eq!(d.get_document("q").unwrap().get_str("sensorId"), Ok("s"));
        let pushed = d
            .get_document("u")
            .unwrap()
            .get_document("$push")
            .unwrap()
            .get_document(&field)
            .unwrap()
            .get_array("$each")
            .unwrap()
            .clone();
        assert_eq!(
            pushed,
            vec![bson::Bson::Int64(2), bson::Bson::Int64(4)],
            "the first and last LSN of the statement"
        );
        assert!(ranges_hold(&[2, 4, 9, 9], 3));
        assert!(ranges_hold(&[2, 4, 9, 9], 9));
        assert!(!ranges_hold(&[2, 4, 9, 9], 5));
        let q = d.get_document("q").unwrap();
        assert_eq!(q.get_document("count").unwrap().get_i32("$lte").unwrap(), 3);
        assert_eq!(
            q.get_document("size").unwrap().get_i32("$lte").unwrap(),
            220
        );
        let u = d.get_document("u").unwrap();
        assert_eq!(
            u.get_document("$inc").unwrap().get_f64("sum.v").unwrap(),
            6.0
        );
        assert_eq!(u.get_document("$inc").unwrap().get_i32("n.v").unwrap(), 2);
        assert_eq!(
            u.get_document("$min").unwrap().get_f64("min.v").unwrap(),
            2.0
        );
        assert_eq!(
            u.get_document("$max").unwrap().get_f64("max.v").unwrap(),
            4.0
        );
        let each = u
            .get_document("$push")
            .unwrap()
            .get_document("samples")
            .unwrap()
            .get_array("$each")
            .unwrap();
        assert_eq!(each.len(), 2);
        assert!(d.get_bool("upsert").unwrap());
        // First and last by time, as {t, v}: $min and $max keep them.
        let edge = |op: &str, f: &str| {
            let e = u.get_document(op).unwrap().get_document(f).unwrap();
            (
                e.get_datetime("t").unwrap().timestamp_millis(),
                e.get_f64("v").unwrap(),
            )
        };
        assert_eq!(edge("$min", "first.v"), (1, 4.0));
        assert_eq!(edge("$max", "last.v"), (2, 2.0));
    }

    /// Of readings with the same time, the smallest value is first and the
    /// largest last, as MongoDB orders `{t, v}` (the rollups' rule).
    #[test]
    fn first_and_last_break_ties_by_value() {
        let mut f = FieldSummary::of(5, 3.0);
        for (t, x) in [(5, -1.0), (9, 2.0), (9, 7.0), (5, 0.5), (9, 4.0)] {
            f.add(t, x);
        }
        assert_eq!((f.first, f.last), ((5, -1.0), (9, 7.0)));
        assert_eq!((f.n, f.sum, f.min, f.max), (6, 15.5, -1.0, 7.0));
    }

    /// A sample with numeric fields of these names.
    fn sample_with(ts_ms: i64, lsn: u64, names: &[String]) -> Sample {
        let fields = names
            .iter()
            .map(|n| (n.clone(), FieldValue::Num(lsn as f64)))
            .collect();
        Sample::encode(
            &Reading {
                sensor: "s".into(),
                ts_ms,
                fields,
                ..Reading::default()
            },
            lsn,
        )
    }

    proptest! {
        /// What a bucket really holds, its samples and a summary entry per
        /// distinct numeric name in each of its summaries, is within the
        /// size palletd counts for it, and that within `max_bytes`, however
        /// many distinct names its samples bring (before, `size` counted
        /// the samples alone, and a bucket of many names could pass 16 MB).
        #[test]
        fn a_bucket_holds_no_more_than_its_counted_size(
            batches in proptest::collection::vec(
                proptest::collection::vec((0i64..2000, proptest::collection::vec(0usize..40, 1..4)), 1..20), 1..6),
        ) {
            let shape = Shape { window_ms: 1000, max_samples: 50, max_bytes: 2000 };
            let mut db = Db::default();
            let mut memory = Fills::new();
            let mut all = std::collections::HashMap::new();
            let mut lsn = 0u64;
            for batch in &batches {
                let made: Vec<Sample> = batch.iter().map(|(ts, names)| {
                    lsn += 1;
                    let names: Vec<String> = names.iter().map(|i| format!("field_{i}_{}", "x".repeat(i % 9))).collect();
                    sample_with(*ts, lsn, &names)
                }).filter(|s| shape.check(s.as_ref()).is_ok()).collect();
                let samples = owned(made.iter().cloned());
                for s in made { all.insert(s.lsn, s); }
                let mut out = plan(&samples, &mut memory, &shape, &ONE);
                for i in 0..out.len() {
                    db.write(&mut out, i, &samples, &shape, &mut memory);
                }
            }
            for b in &db.buckets {
                let samples: Vec<&Sample> = b.msgs.iter().map(|l| &all[l]).collect();
                let names: std::collections::HashSet<&str> = samples.iter().flat_map(|s| s.as_ref().nums().map(|(n, _)| n)).collect();
                // An entry per name in each of sum, n, min, max and the
                // seal's avg, and its {t, v} in first and last, as BSON
                // writes them.
                let entry = |n: &str| bson::to_vec(&bson::doc! { n: 0.0f64 }).unwrap().len() as u32 - 5;
                let edge = |n: &str| {
                    let e = bson::doc! { n: { "t": bson::DateTime::from_millis(0), "v": 0.0f64 } };
                    bson::to_vec(&e).unwrap().len() as u32 - 5
                };
                let held = samples.iter().map(|s| s.bytes()).sum::<u32>()
                    + names.iter().map(|n| 5 * entry(n) + 2 * edge(n)).sum::<u32>();
                prop_assert!(held <= b.size, "holds {} for a counted size of {}", held, b.size);
                prop_assert!(b.size <= shape.max_bytes);
            }
        }

        /// No sample lost or duplicated, caps never exceeded, per-sensor
        /// arrival order kept within each bucket, whatever the memory knows.
        #[test]
        fn planning_keeps_every_sample_once_within_caps(
            flushes in proptest::collection::vec(
                proptest::collection::vec((0i64..4000, 0usize..80), 0..30), 1..8),
            forget in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let mut db = Db::default();
            let mut memory = Fills::new();
            let mut msg = 0u64;
            let mut sent = Vec::new();
            for (i, batch) in flushes.iter().enumerate() {
                if forget[i] { memory = Fills::new(); }
                let samples = owned(batch.iter().map(|(ts, pad)| { msg += 1; sent.push(msg); sample(*ts, msg, *pad) }));
                let known = memory.clone();
                let mut out = plan(&samples, &mut memory, &SHAPE, &ONE);
                prop_assert_eq!(out.iter().flat_map(|st| st.range.clone()).collect::<Vec<_>>(), (0..samples.len()).collect::<Vec<_>>());
                for i in 0..out.len() {
                    let st = out[i].clone();
                    prop_assert!(st.count() >= 1);
                    prop_assert!(st.range.clone().all(|i| SHAPE.window_start(samples.get(i).ts_ms) == st.start_ms));
                    let collisions = db.write(&mut out, i, &samples, &SHAPE, &mut memory);
                    // In a window palletd knows, a statement collides at
                    // most once: its bucket number is the newest, though
                    // its fill may be short (an append of unknown fill
                    // before it in the same flush), and the next is free.
                    prop_assert!(collisions <= 1 || !known.contains_key(&st.start_ms), "{} collisions", collisions);
                }
            }
            let mut stored: Vec<u64> = db.buckets.iter().flat_map(|b| b.msgs.iter().copied()).collect();
            for b in &db.buckets {
                prop_assert!(b.count <= SHAPE.max_samples && b.size <= SHAPE.max_bytes);
                prop_assert!(b.msgs.windows(2).all(|w| w[0] < w[1]), "arrival order kept");
            }
            stored.sort();
            prop_assert_eq!(stored, sent);
        }

        /// With closer runs between flushes (sealing every window that
        /// ended by a cutoff and forgetting its memory), every sample is
        /// still stored exactly once, sealed buckets are never written
        /// again, and no bucket exceeds a cap.
        #[test]
        fn closer_runs_never_lose_duplicate_or_overfill(
            flushes in proptest::collection::vec(
                (proptest::collection::vec((0i64..6000, 0usize..60), 0..20), proptest::option::of(0i64..7000)), 1..10),
        ) {
            let mut db = Db::default();
            let mut memory = Fills::new();
            let mut msg = 0u64;
            let mut sent = Vec::new();
            for (batch, closer_cutoff) in &flushes {
                let samples = owned(batch.iter().map(|(ts, pad)| { msg += 1; sent.push(msg); sample(*ts, msg, *pad) }));
                let mut out = plan(&samples, &mut memory, &SHAPE, &ONE);
                for i in 0..out.len() {
                    let sealed_before: Vec<(u32, usize)> = db.buckets.iter().filter(|b| b.closed).map(|b| (b.count, b.msgs.len())).collect();
                    db.write(&mut out, i, &samples, &SHAPE, &mut memory);
                    let sealed_after: Vec<(u32, usize)> = db.buckets.iter().filter(|b| b.closed).map(|b| (b.count, b.msgs.len())).collect();
                    prop_assert_eq!(sealed_before, sealed_after, "a sealed bucket was written");
                }
                if let Some(cutoff) = closer_cutoff {
                    for b in db.buckets.iter_mut().filter(|b| b.start + SHAPE.window_ms <= *cutoff) {
                        b.closed = true;
                    }
                    memory.retain(|start, _| start + SHAPE.window_ms > *cutoff);
                }
            }
            for b in &db.buckets {
                prop_assert!(b.count <= SHAPE.max_samples && b.size <= SHAPE.max_bytes);
            }
            let mut stored: Vec<u64> = db.buckets.iter().flat_map(|b| b.msgs.iter().copied()).collect();
            stored.sort();
            prop_assert_eq!(stored, sent);
        }
    }

    /// Two empty lookups in a row make a sensor quiet; a bucket found, or
    /// one met by a collision, ends it.
    #[test]
    fn a_sensor_is_quiet_after_two_empty_lookups_until_a_bucket_turns_up() {
        let mut f = Fills::new();
        f.looked_up(false);
        assert!(!f.quiet());
        f.looked_up(false);
        assert!(f.quiet());
        f.surprised();
        assert!(!f.quiet());
        f.looked_up(false);
        f.looked_up(true);
        f.looked_up(false);
        assert!(!f.quiet());
        f.looked_up(false);
        f.retain(|_, _| false);
        assert!(f.quiet(), "forgetting windows keeps what lookups found");
    }

    /// A window newer than every one palletd knows of a sensor is taken to
    /// be empty (no lookup at each window's start for a live sensor); an
    /// older one, or any after a collision until the next lookup, is not.
    #[test]
    fn a_window_newer_than_every_known_one_is_taken_to_be_empty() {
        let mut f = Fills::new();
        assert!(!f.assume_empty(3_600_000), "nothing known: look it up");
        f.looked_up(true);
        f.insert(3_600_000, Fill::default());
        assert!(f.assume_empty(7_200_000));
        assert!(!f.assume_empty(0), "an older window may have buckets");
        f.insert(0, Fill::default());
        assert!(f.assume_empty(7_200_000));
        assert!(!f.assume_empty(1_800_000), "between known windows");
        f.surprised();
        assert!(!f.assume_empty(7_200_000), "a collision: look up again");
        f.looked_up(true);
        assert!(f.assume_empty(7_200_000));
    }
}
