//! A sample: one reading as pushed into a bucket's `samples`, borrowed
//! ([`SampleRef`]) or owned ([`Sample`]), what thinning left of it, and
//! one sensor's samples held compactly ([`Samples`]).

use super::*;
use bson::{rawdoc, RawDocument, RawDocumentBuf};

use crate::decode::{FieldValue, Reading};

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
    pub(crate) fn from_doc(doc: &'a RawDocument, lsn: u64) -> Option<SampleRef<'a>> {
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
    pub(crate) fn is_archive(&self) -> bool {
        self.second().is_some_and(|name| name == ARCHIVE)
    }

    /// Whether it sums up readings thinning left out ([`LEFT_OUT`]).
    pub(crate) fn is_left_out(&self) -> bool {
        self.second().is_some_and(|name| name == LEFT_OUT)
    }

    /// Whether it is a reading as received (not a point stored late, not
    /// readings left out): what the latest value may show.
    pub(crate) fn is_reading(&self) -> bool {
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
    pub(crate) fn pushes(&self) -> bool {
        match self.second() {
            Some(name) if !name.starts_with('_') || name == ARCHIVE => true,
            _ => self.thin().is_none(),
        }
    }

    /// The thinning rules of its fields: (field, rule kind, bound).
    pub(crate) fn rules(&self) -> impl Iterator<Item = (&'a str, &'a str, f64)> {
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
    pub(crate) fn cost(&self) -> u32 {
        self.bytes() + self.nums().map(|(name, _)| summary_cost(name)).sum::<u32>()
    }

    /// The units its payload gave (`{field: unit}`), if any.
    pub(crate) fn units(&self) -> Option<&'a RawDocument> {
        match self.doc.get(UNITS) {
            Ok(Some(bson::RawBsonRef::Document(units))) => Some(units),
            _ => None,
        }
    }

    /// Its document as stored, without the units, and the units, which a
    /// bucket keeps once ([`UNITS`]); one look for them per sample (this
    /// is on every statement's path).
    pub(crate) fn stored(&self) -> (RawDocumentBuf, Option<&'a RawDocument>) {
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
    pub(crate) fn whole(&self) -> RawDocumentBuf {
        let (mut out, _) = self.stored();
        for (name, x) in self.dropped() {
            out.append(name, x);
        }
        out
    }

    /// The values thinning dropped: summarised, not pushed.
    pub(crate) fn dropped(&self) -> impl Iterator<Item = (&'a str, f64)> {
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
    pub(crate) fn nums(&self) -> impl Iterator<Item = (&'a str, f64)> {
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
pub(crate) fn summary_cost(name: &str) -> u32 {
    let name = name.len() as u32;
    SUMMARY_ENTRIES * (name + 10) + 2 * (name + EDGE_ENTRY)
}

/// One numeric field's summary over a statement's samples: sum, count,
/// min, max, and its first and last reading as (ts, value), first and
/// last by time, ties broken by value (the smallest is first, the largest
/// last), the order in which MongoDB compares `{t, v}` documents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct FieldSummary {
    pub(super) sum: f64,
    pub(super) n: i32,
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) first: (i64, f64),
    pub(super) last: (i64, f64),
}

impl FieldSummary {
    pub(super) fn of(ts_ms: i64, x: f64) -> FieldSummary {
        FieldSummary {
            sum: x,
            n: 1,
            min: x,
            max: x,
            first: (ts_ms, x),
            last: (ts_ms, x),
        }
    }

    pub(super) fn add(&mut self, ts_ms: i64, x: f64) {
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
pub(super) fn edge((ts_ms, x): (i64, f64)) -> RawDocumentBuf {
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
pub(crate) const UNITS: &str = "_units";

/// Where a sample's document carries the thinning its fields went
/// through ([`crate::thin`]): `{field: {k: rule kind, b: bound, v: value}}`,
/// `v` only when the value was dropped (then the field is not in the
/// document: it is summarised, not pushed). A statement sets
/// `thinning.<field>` from it and counts `readings`.
pub(crate) const THIN: &str = "_thin";

/// Marks a sample that is a point thinning stored later than its reading
/// came (the swinging door's last point of a run): pushed, and not
/// summarised again (`{ts, <field>: value, _archive: true}`).
pub(crate) const ARCHIVE: &str = "_archive";

/// Marks a sample that sums up readings thinning left out, in time series
/// mode, where no bucket summarises them ([`LeftOut`]):
/// `{ts, _leftOut: {count, sum, n, min, max, first, last, thinning}}`,
/// the summaries shaped as a bucket's. Neither pushed into a bucket nor
/// a reading of its own.
pub(crate) const LEFT_OUT: &str = "_leftOut";

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

    /// The latest reading's time.
    pub(crate) fn last_ts(&self) -> Option<i64> {
        self.fields.iter().map(|f| f.1.last.0).max()
    }

    /// Heap bytes (an estimate).
    pub(crate) fn heap_bytes(&self) -> usize {
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
    pub(crate) fn archive(ts_ms: i64, fields: &[(&str, f64)], lsn: u64) -> Sample {
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
    pub(crate) fn left_out(ts_ms: i64, left: &LeftOut, lsn: u64) -> Sample {
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

    /// Makes room for `samples` more samples of `bytes` in all.
    pub(crate) fn reserve(&mut self, samples: usize, bytes: usize) {
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

    pub(crate) fn get(&self, i: usize) -> SampleRef<'_> {
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

    pub(crate) fn iter(&self) -> impl Iterator<Item = SampleRef<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }

    pub fn first(&self) -> Option<SampleRef<'_>> {
        (!self.is_empty()).then(|| self.get(0))
    }

    pub fn last(&self) -> Option<SampleRef<'_>> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    /// LSN and time of every sample.
    pub(crate) fn keys(&self) -> impl Iterator<Item = (u64, i64)> + '_ {
        self.index.iter().map(|s| (s.lsn, s.ts_ms))
    }

    /// Keeps the samples `keep` says yes to, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(SampleRef<'_>) -> bool) {
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
    pub(crate) fn split_front(&mut self, n: usize) -> Samples {
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
    pub(crate) fn front_within(&self, shape: &Shape, statements: usize) -> (usize, usize) {
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
    pub(crate) fn append(&mut self, other: &Samples) {
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
