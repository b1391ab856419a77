//! The database's own failures, injected at the wire: the replies a
//! MongoDB replica set gives when its primary steps down, when a write
//! waits too long for the majority, when a statement hits a unique index,
//! when a command runs out of time, and a connection lost on either side
//! of the server applying a command.
//!
//! The proxy reads each MongoDB message (`OP_MSG`: a body document and
//! document sequences, folded here into the body's arrays) and, where a
//! [`Rule`] of the [`Plan`] fires for the command's name, answers with a
//! fault instead of, or after, forwarding it, so both "applied, but the
//! reply says error" and "not applied" happen against the real server
//! behind it. Other messages (and compressed ones: connect uncompressed)
//! pass through as they are. Reply bodies follow MongoDB's documented
//! error codes, code names and labels.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Pipe;

/// `OP_MSG`'s opcode.
const OP_MSG: i32 = 2013;
/// `OP_MSG` flag: a CRC-32C follows the sections.
const CHECKSUM_PRESENT: u32 = 1;
/// The largest message read (the server's 48 MB limit, and some).
const MAX_MESSAGE: usize = 64 << 20;

/// A failure a replica set produces, and what the proxy does to make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The primary stepped down before the command: not forwarded;
    /// `NotWritablePrimary` (10107) with `RetryableWriteError`.
    NotWritablePrimary,
    /// The primary stepped down while running it: forwarded (applied),
    /// then `InterruptedDueToReplStateChange` (11602) with
    /// `RetryableWriteError` instead of the reply.
    InterruptedAfterApply,
    /// Applied on the primary, but waiting for the majority timed out:
    /// forwarded, and the server's reply gets a `writeConcernError`
    /// (`WriteConcernFailed`, 64, `wtimeout: true`).
    WriteConcernTimeout,
    /// The command's first statement hits a unique index an operator
    /// added (E11000 on a key other than `_id`): it is taken out before
    /// forwarding (an ordered command stops there: nothing is forwarded)
    /// and the reply gets its write error.
    DuplicateKeyUnique,
    /// The first statement's insert raced another to the same `_id`
    /// (E11000 on `_id`), made like [`Fault::DuplicateKeyUnique`].
    DuplicateKeyId,
    /// The first statement met a concurrent write (`WriteConflict`, 112),
    /// made like [`Fault::DuplicateKeyUnique`].
    WriteConflict,
    /// Waiting for a lock or ticket took too long: not forwarded;
    /// `ExceededTimeLimit` (262).
    ExceededTimeLimit,
    /// `maxTimeMS` ran out while it ran: forwarded (applied), then
    /// `MaxTimeMSExpired` (50) instead of the reply.
    MaxTimeExpiredAfterApply,
    /// The connection breaks after the command was sent and before the
    /// reply (the server applies it).
    ResetAfterSend,
    /// The connection breaks before the command reaches the server.
    ResetBeforeSend,
    /// The reply comes, late ([`Plan::late_by`]).
    LateReply,
    /// The message is over the server's limits: not forwarded;
    /// `BSONObjectTooLarge` (10334).
    TooLarge,
}

impl Fault {
    pub const ALL: [Fault; 12] = [
        Fault::NotWritablePrimary,
        Fault::InterruptedAfterApply,
        Fault::WriteConcernTimeout,
        Fault::DuplicateKeyUnique,
        Fault::DuplicateKeyId,
        Fault::WriteConflict,
        Fault::ExceededTimeLimit,
        Fault::MaxTimeExpiredAfterApply,
        Fault::ResetAfterSend,
        Fault::ResetBeforeSend,
        Fault::LateReply,
        Fault::TooLarge,
    ];

    fn index(self) -> usize {
        Fault::ALL.iter().position(|f| *f == self).unwrap_or(0)
    }
}

/// When a fault is injected: into commands named `command` (`"update"`,
/// `"insert"`, ...), on `collection` if given, whose message holds the
/// bytes `marker` if given (say `$push`: bucket writes), every `every`-th
/// of them (1: each), then with `probability`, at most `times` times in
/// all.
#[derive(Debug, Clone)]
pub struct Rule {
    pub command: &'static str,
    pub collection: Option<&'static str>,
    pub marker: Option<&'static [u8]>,
    pub fault: Fault,
    pub every: u64,
    pub probability: f64,
    pub times: u64,
}

impl Rule {
    /// `fault` into the next `command`, once.
    pub fn once(command: &'static str, fault: Fault) -> Rule {
        Rule {
            command,
            collection: None,
            marker: None,
            fault,
            every: 1,
            probability: 1.0,
            times: 1,
        }
    }
}

impl Rule {
    /// `fault` into any `command`, with `probability`, for as long as it runs.
    pub fn sometimes(command: &'static str, fault: Fault, probability: f64) -> Rule {
        Rule {
            probability,
            times: u64::MAX,
            ..Rule::once(command, fault)
        }
    }
}

#[derive(Debug)]
struct Armed {
    rule: Rule,
    seen: u64,
    fired: u64,
}

/// The faults a proxy injects; shared with the test that sets them.
#[derive(Debug)]
pub struct Plan {
    rules: Mutex<(Vec<Armed>, rand::rngs::StdRng)>,
    injected: [AtomicU64; Fault::ALL.len()],
    late_by: Duration,
}

impl Plan {
    /// No rules yet; `seed` for the probabilities; a late reply comes
    /// `late_by` after the server's.
    pub fn new(seed: u64, late_by: Duration) -> Arc<Plan> {
        Arc::new(Plan {
            rules: Mutex::new((Vec::new(), rand::rngs::StdRng::seed_from_u64(seed))),
            injected: Default::default(),
            late_by,
        })
    }

    /// Adds a rule (checked after the ones before it).
    pub fn add(&self, rule: Rule) {
        self.lock().0.push(Armed {
            rule,
            seen: 0,
            fired: 0,
        });
    }

    /// No more faults.
    pub fn clear(&self) {
        self.lock().0.clear();
    }

    /// How many times `fault` was injected.
    pub fn injected(&self, fault: Fault) -> u64 {
        self.injected[fault.index()].load(Ordering::SeqCst)
    }

    /// Every fault injected, in all.
    pub fn injected_total(&self) -> u64 {
        Fault::ALL.iter().map(|f| self.injected(*f)).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<Armed>, rand::rngs::StdRng)> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fault for a command named `command` on `collection` in a
    /// message of `bytes`, if a rule fires.
    fn pick(&self, command: &str, collection: &str, bytes: &[u8]) -> Option<Fault> {
        let mut guard = self.lock();
        let (rules, rng) = &mut *guard;
        let fits = |rule: &Rule| {
            rule.command == command
                && rule.collection.is_none_or(|c| c == collection)
                && rule
                    .marker
                    .is_none_or(|m| bytes.windows(m.len()).any(|w| w == m))
        };
        for armed in rules.iter_mut().filter(|a| fits(&a.rule)) {
            armed.seen += 1;
            if armed.fired >= armed.rule.times
                || armed.seen % armed.rule.every.max(1) != 0
                || !rng.gen_bool(armed.rule.probability.clamp(0.0, 1.0))
            {
                continue;
            }
            armed.fired += 1;
            return Some(armed.rule.fault);
        }
        None
    }

    fn count(&self, fault: Fault) {
        self.injected[fault.index()].fetch_add(1, Ordering::SeqCst);
    }
}

/// One message: its header's ids and, for an `OP_MSG`, its command.
struct Message {
    bytes: Vec<u8>,
}

impl Message {
    fn int(&self, at: usize) -> i32 {
        i32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap_or_default())
    }

    fn request_id(&self) -> i32 {
        self.int(4)
    }

    fn response_to(&self) -> i32 {
        self.int(8)
    }

    /// The body with its document sequences folded in as arrays (`None`
    /// for anything but a well-formed `OP_MSG`).
    fn command(&self) -> Option<Document> {
        if self.int(12) != OP_MSG || self.bytes.len() < 21 {
            return None;
        }
        let flags = u32::from_le_bytes(self.bytes[16..20].try_into().ok()?);
        let end = self.bytes.len() - if flags & CHECKSUM_PRESENT != 0 { 4 } else { 0 };
        let (mut at, mut body, mut sequences) = (20, None, Vec::new());
        while at < end {
            let kind = self.bytes[at];
            at += 1;
            let size = self.int(at) as usize;
            let section = self.bytes.get(at..at + size)?;
            match kind {
                0 => body = Some(Document::from_reader(section).ok()?),
                1 => {
                    let name_end = section[4..].iter().position(|b| *b == 0)? + 4;
                    let name = std::str::from_utf8(&section[4..name_end]).ok()?;
                    let mut docs = Vec::new();
                    let mut d = name_end + 1;
                    while d < section.len() {
                        let len = i32::from_le_bytes(section.get(d..d + 4)?.try_into().ok()?);
                        let doc = Document::from_reader(section.get(d..d + len as usize)?).ok()?;
                        docs.push(Bson::Document(doc));
                        d += len as usize;
                    }
                    sequences.push((name.to_owned(), docs));
                }
                _ => return None,
            }
            at += size;
        }
        let mut body = body?;
        for (name, docs) in sequences {
            body.insert(name, docs);
        }
        Some(body)
    }

    /// An `OP_MSG` of `body` alone.
    fn of(request_id: i32, response_to: i32, body: &Document) -> Message {
        let mut doc = Vec::new();
        body.to_writer(&mut doc).unwrap_or_default();
        let len = 16 + 4 + 1 + doc.len();
        let mut bytes = Vec::with_capacity(len);
        for n in [len as i32, request_id, response_to, OP_MSG] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.push(0);
        bytes.extend_from_slice(&doc);
        Message { bytes }
    }
}

async fn read_message(r: &mut (impl AsyncRead + Unpin)) -> Option<Message> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let n = i32::from_le_bytes(len) as usize;
    if !(16..=MAX_MESSAGE).contains(&n) {
        return None;
    }
    let mut bytes = len.to_vec();
    bytes.resize(n, 0);
    r.read_exact(&mut bytes[4..]).await.ok()?;
    Some(Message { bytes })
}

/// A command error reply.
fn error_reply(code: i32, name: &str, msg: &str, retryable: bool) -> Document {
    let mut reply = doc! { "ok": 0.0, "errmsg": msg, "code": code, "codeName": name };
    if retryable {
        reply.insert("errorLabels", vec!["RetryableWriteError"]);
    }
    reply
}

/// The statements' array of a write command.
fn statements_key(command: &str) -> Option<&'static str> {
    match command {
        "update" => Some("updates"),
        "insert" => Some("documents"),
        "delete" => Some("deletes"),
        _ => None,
    }
}

/// The write error `fault` gives the command's first statement.
fn statement_error(fault: Fault, body: &Document, first: &Document) -> Document {
    match fault {
        Fault::WriteConflict => doc! {
            "index": 0,
            "code": 112,
            "codeName": "WriteConflict",
            "errmsg": "WriteConflict error: this operation conflicted with another operation. Please retry your operation or multi-document transaction.",
        },
        _ => duplicate_key(body, first, fault == Fault::DuplicateKeyId),
    }
}

/// The E11000 write error of the command's first statement.
fn duplicate_key(body: &Document, first: &Document, on_id: bool) -> Document {
    let coll = body
        .iter()
        .next()
        .map(|(_, v)| v.to_string())
        .unwrap_or_default();
    let db = body.get_str("$db").unwrap_or("db");
    let id = first
        .get_document("q")
        .ok()
        .and_then(|q| q.get("_id"))
        .or_else(|| first.get("_id"))
        .cloned()
        .unwrap_or(Bson::Null);
    let (index, pattern, value) = match on_id {
        true => ("_id_", doc! { "_id": 1 }, doc! { "_id": id.clone() }),
        false => (
            "site_1_unique",
            doc! { "site": 1 },
            doc! { "site": "injected" },
        ),
    };
    doc! {
        "index": 0,
        "code": 11000,
        "errmsg": format!(
            "E11000 duplicate key error collection: {db}.{} index: {index} dup key: {value}",
            coll.trim_matches('"')
        ),
        "keyPattern": pattern,
        "keyValue": value,
    }
}

/// What to do with the server's reply to a command.
enum After {
    /// Send this instead.
    Replace(Document),
    /// Add a `writeConcernError`.
    WriteConcernError,
    /// Shift its statement indexes by one and put this write error first.
    Prepend(Document),
    /// Break the connection instead.
    Reset,
    /// Send it, late.
    Delay(Duration),
}

/// What the proxy does with a command.
enum Act {
    Forward(Option<After>),
    ForwardRewritten(Document, After),
    Answer(Document),
    Reset,
}

fn act(plan: &Plan, fault: Fault, body: &Document) -> Act {
    match fault {
        Fault::NotWritablePrimary => Act::Answer(error_reply(
            10107,
            "NotWritablePrimary",
            "not primary",
            true,
        )),
        Fault::InterruptedAfterApply => Act::Forward(Some(After::Replace(error_reply(
            11602,
            "InterruptedDueToReplStateChange",
            "operation was interrupted because of a replication state change",
            true,
        )))),
        Fault::WriteConcernTimeout => Act::Forward(Some(After::WriteConcernError)),
        Fault::DuplicateKeyUnique | Fault::DuplicateKeyId | Fault::WriteConflict => {
            let command = body.keys().next().map(String::as_str).unwrap_or("");
            let Some(key) = statements_key(command) else {
                return Act::Forward(None);
            };
            let mut body = body.clone();
            let Ok(statements) = body.get_array_mut(key) else {
                return Act::Forward(None);
            };
            let Some(Bson::Document(first)) = statements.first().cloned() else {
                return Act::Forward(None);
            };
            statements.remove(0);
            let error = statement_error(fault, &body, &first);
            let ordered = body.get_bool("ordered").unwrap_or(true);
            let rest = body.get_array(key).map_or(0, |s| s.len());
            if ordered || rest == 0 {
                // An ordered command stops at its first error: nothing of
                // it is applied.
                let mut reply = doc! { "n": 0, "writeErrors": [error], "ok": 1.0 };
                if command == "update" {
                    reply.insert("nModified", 0);
                }
                return Act::Answer(reply);
            }
            Act::ForwardRewritten(body, After::Prepend(error))
        }
        Fault::ExceededTimeLimit => Act::Answer(error_reply(
            262,
            "ExceededTimeLimit",
            "operation exceeded time limit",
            false,
        )),
        Fault::MaxTimeExpiredAfterApply => Act::Forward(Some(After::Replace(error_reply(
            50,
            "MaxTimeMSExpired",
            "operation exceeded time limit",
            false,
        )))),
        Fault::ResetAfterSend => Act::Forward(Some(After::Reset)),
        Fault::ResetBeforeSend => Act::Reset,
        Fault::LateReply => Act::Forward(Some(After::Delay(plan.late_by))),
        Fault::TooLarge => Act::Answer(error_reply(
            10334,
            "BSONObjectTooLarge",
            "BSONObj size: 16793600 (0x1004000) is invalid. Size must be between 0 and 16793600(16MB)",
            false,
        )),
    }
}

/// The server's reply, changed as `after` says (`None`: break the
/// connection; a delayed reply is the caller's).
fn amend(reply: Message, after: After) -> Option<Message> {
    let (id, to) = (reply.request_id(), reply.response_to());
    let mut body = reply.command()?;
    match after {
        After::Replace(doc) => body = doc,
        After::WriteConcernError => {
            body.insert(
                "writeConcernError",
                doc! {
                    "code": 64,
                    "codeName": "WriteConcernFailed",
                    "errmsg": "waiting for replication timed out",
                    "errInfo": { "wtimeout": true, "writeConcern": { "w": "majority", "wtimeout": 0, "provenance": "clientSupplied" } },
                },
            );
        }
        After::Prepend(error) => {
            for key in ["writeErrors", "upserted"] {
                if let Ok(items) = body.get_array_mut(key) {
                    for item in items.iter_mut() {
                        if let Bson::Document(d) = item {
                            let i = d.get_i32("index").unwrap_or(0);
                            d.insert("index", i + 1);
                        }
                    }
                }
            }
            let mut errors = body.get_array("writeErrors").cloned().unwrap_or_default();
            errors.insert(0, Bson::Document(error));
            body.insert("writeErrors", errors);
        }
        After::Reset => return None,
        After::Delay(_) => {}
    }
    Some(Message::of(id, to, &body))
}

/// Carries one connection, injecting what `plan` says; counts the bytes
/// each way in `up` and `down`.
pub(super) async fn carry(
    client: TcpStream,
    server: TcpStream,
    plan: Arc<Plan>,
    up: &Pipe,
    down: &Pipe,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // What the client gets, in order; `None` breaks the connection.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Option<Message>>();
    let waiting: Mutex<HashMap<i32, After>> = Mutex::new(HashMap::new());
    let ids = AtomicU64::new(1 << 30);
    let requests = async {
        while let Some(msg) = read_message(&mut cr).await {
            up.count(msg.bytes.len());
            let fault = msg.command().and_then(|body| {
                let (name, target) = body.iter().next()?;
                let fault = plan.pick(name, target.as_str().unwrap_or(""), &msg.bytes)?;
                Some((fault, act(&plan, fault, &body)))
            });
            let Some((fault, act)) = fault else {
                if sw.write_all(&msg.bytes).await.is_err() {
                    return;
                }
                continue;
            };
            // (A statement fault on a command without statements is none.)
            if !matches!(act, Act::Forward(None)) {
                plan.count(fault);
            }
            let forward = match act {
                Act::Answer(reply) => {
                    let id = ids.fetch_add(1, Ordering::Relaxed) as i32;
                    let _ = tx.send(Some(Message::of(id, msg.request_id(), &reply)));
                    continue;
                }
                Act::Reset => {
                    let _ = tx.send(None);
                    return;
                }
                Act::Forward(after) => {
                    if let Some(after) = after {
                        lock(&waiting).insert(msg.request_id(), after);
                    }
                    msg
                }
                Act::ForwardRewritten(body, after) => {
                    lock(&waiting).insert(msg.request_id(), after);
                    Message::of(msg.request_id(), 0, &body)
                }
            };
            if sw.write_all(&forward.bytes).await.is_err() {
                return;
            }
        }
    };
    let replies = async {
        while let Some(msg) = read_message(&mut sr).await {
            down.count(msg.bytes.len());
            let after = lock(&waiting).remove(&msg.response_to());
            match after {
                None => {
                    let _ = tx.send(Some(msg));
                }
                Some(After::Delay(d)) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        let _ = tx.send(Some(msg));
                    });
                }
                Some(after) => {
                    let amended = amend(msg, after);
                    let stop = amended.is_none();
                    let _ = tx.send(amended);
                    if stop {
                        return;
                    }
                }
            }
        }
    };
    let writer = async {
        while let Some(Some(msg)) = rx.recv().await {
            if cw.write_all(&msg.bytes).await.is_err() {
                return;
            }
        }
    };
    // Whichever side ends first ends the connection (both sockets close).
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
        _ = writer => {}
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_msg_with_a_document_sequence_reads_as_one_command() {
        let body = doc! { "update": "readings", "ordered": true, "$db": "palletd" };
        let statements = [doc! { "q": { "_id": "a" }, "u": { "$inc": { "n": 1 } } }];
        let mut seq = Vec::new();
        seq.extend_from_slice(b"updates\0");
        for s in &statements {
            s.to_writer(&mut seq).unwrap();
        }
        let mut bytes = Message::of(7, 0, &body).bytes;
        bytes.push(1);
        bytes.extend_from_slice(&((seq.len() + 4) as i32).to_le_bytes());
        bytes.extend_from_slice(&seq);
        let len = bytes.len() as i32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
        let msg = Message { bytes };
        assert_eq!(msg.request_id(), 7);
        let command = msg.command().unwrap();
        assert_eq!(command.keys().next().unwrap(), "update");
        assert_eq!(command.get_array("updates").unwrap().len(), 1);
    }

    #[test]
    fn a_duplicate_key_takes_out_the_first_statement_and_shifts_the_reply() {
        let plan = Plan::new(1, Duration::ZERO);
        let body = doc! {
            "insert": "readings", "ordered": false, "$db": "palletd",
            "documents": [{ "_id": 1 }, { "_id": 2 }, { "_id": 3 }],
        };
        let Act::ForwardRewritten(sent, after) = act(&plan, Fault::DuplicateKeyUnique, &body)
        else {
            panic!("an unordered insert is forwarded without its first statement");
        };
        assert_eq!(sent.get_array("documents").unwrap().len(), 2);
        let reply =
            doc! { "n": 1, "ok": 1.0, "writeErrors": [{ "index": 1, "code": 2, "errmsg": "x" }] };
        let amended = amend(Message::of(9, 5, &reply), after).unwrap();
        assert_eq!(amended.response_to(), 5);
        let errors = amended
            .command()
            .unwrap()
            .get_array("writeErrors")
            .unwrap()
            .clone();
        let codes: Vec<(i32, i32)> = errors
            .iter()
            .map(|e| {
                let e = e.as_document().unwrap();
                (e.get_i32("index").unwrap(), e.get_i32("code").unwrap())
            })
            .collect();
        assert_eq!(codes, [(0, 11000), (2, 2)]);
        // Ordered: answered at once, nothing forwarded.
        let ordered = doc! { "update": "b", "updates": [{ "q": { "_id": "x" } }], "$db": "d" };
        let Act::Answer(reply) = act(&plan, Fault::DuplicateKeyId, &ordered) else {
            panic!("ordered: nothing forwarded");
        };
        let error = reply.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(
            error.get_document("keyPattern").unwrap(),
            &doc! { "_id": 1 }
        );
        assert!(error.get_str("errmsg").unwrap().contains("index: _id_"));
    }

    #[test]
    fn rules_fire_every_nth_command_up_to_their_count() {
        let plan = Plan::new(1, Duration::ZERO);
        plan.add(Rule {
            command: "update",
            collection: Some("readings"),
            marker: Some(b"$push"),
            fault: Fault::ResetAfterSend,
            every: 3,
            probability: 1.0,
            times: 2,
        });
        let fired: Vec<bool> = (0..12)
            .map(|_| plan.pick("update", "readings", b"..$push..").is_some())
            .collect();
        assert_eq!(
            fired,
            [false, false, true, false, false, true, false, false, false, false, false, false]
        );
        assert_eq!(plan.pick("update", "readings", b"$set"), None, "no marker");
        assert_eq!(plan.pick("update", "others", b"$push"), None);
        assert_eq!(plan.pick("find", "readings", b"$push"), None);
    }
}
