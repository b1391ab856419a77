//! The Sparkplug B state's snapshot (`sparkplug.json` in the spool
//! directory): written a chunk at a time, and loaded back at start.

use super::*;

/// The first line of a snapshot (`sparkplug.json`): the LSN from which
/// the spool's changes are replayed onto it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) palletd_sparkplug_snapshot: u32,
    pub(super) lsn: u64,
}

/// A line of a snapshot after the first: an edge node without its
/// devices, or one device of the node whose line came before it. A line
/// holds one alias map at most, so a snapshot is made in small pieces
/// however many devices a node has.
#[derive(Serialize, Deserialize)]
pub(super) struct Line<'a> {
    #[serde(borrow)]
    pub(super) key: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none", borrow)]
    pub(super) device: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) bd_seq: Option<u64>,
    pub(super) online: bool,
    pub(super) aliases: std::borrow::Cow<'a, Aliases>,
}

/// Where a snapshot goes on: after this node's own line and, if named,
/// after this device of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotAt {
    pub(super) key: String,
    pub(super) device: Option<String>,
}

/// The first line of a snapshot whose replay starts at `lsn`.
pub(crate) fn snapshot_header(lsn: u64) -> Vec<u8> {
    let mut out = serde_json::to_vec(&Header {
        palletd_sparkplug_snapshot: 1,
        lsn,
    })
    .expect("a header serializes");
    out.push(b'\n');
    out
}

impl State {
    /// Appends the state's lines from `at` on (from the first when `None`)
    /// to `out` until it holds `max_bytes`; where to go on, `None` once the
    /// last is written. The nodes may change between two calls: a snapshot
    /// so made holds each node and device as it was when written, and
    /// replaying every change from the snapshot's first LSN on makes it
    /// the state of the end (each change sets what it names).
    pub fn snapshot_lines(
        &self,
        at: Option<&SnapshotAt>,
        out: &mut Vec<u8>,
        max_bytes: usize,
    ) -> Option<SnapshotAt> {
        use std::borrow::Cow;
        use std::ops::Bound;
        let line = |out: &mut Vec<u8>, l: &Line<'_>| {
            serde_json::to_writer(&mut *out, l).expect("a line serializes");
            out.push(b'\n');
        };
        // A node whose own line is written, its devices after this one.
        let mut within: Option<(&str, Option<&str>)> = None;
        let first = match at {
            Some(a) if self.nodes.contains_key(a.key.as_str()) => {
                within = Some((a.key.as_str(), a.device.as_deref()));
                Bound::Excluded(a.key.as_str())
            }
            Some(a) => Bound::Excluded(a.key.as_str()),
            None => Bound::Unbounded,
        };
        let rest = self.nodes.range::<str, _>((first, Bound::Unbounded));
        let nodes = within
            .map(|(k, _)| (k, &self.nodes[k]))
            .into_iter()
            .map(|(k, n)| (k, n, true))
            .chain(rest.map(|(k, n)| (k.as_str(), n, false)));
        for (key, node, started) in nodes {
            if !started {
                line(
                    out,
                    &Line {
                        key: Cow::Borrowed(key),
                        device: None,
                        bd_seq: node.bd_seq,
                        online: node.online,
                        aliases: Cow::Borrowed(&node.aliases),
                    },
                );
                if out.len() >= max_bytes {
                    return Some(SnapshotAt {
                        key: key.to_string(),
                        device: None,
                    });
                }
            }
            let after = match within {
                Some((_, Some(d))) if started => Bound::Excluded(d),
                _ => Bound::Unbounded,
            };
            for (name, d) in node.devices.range::<str, _>((after, Bound::Unbounded)) {
                line(
                    out,
                    &Line {
                        key: Cow::Borrowed(key),
                        device: Some(Cow::Borrowed(name)),
                        bd_seq: None,
                        online: d.online,
                        aliases: Cow::Borrowed(&d.aliases),
                    },
                );
                if out.len() >= max_bytes {
                    return Some(SnapshotAt {
                        key: key.to_string(),
                        device: Some(name.clone()),
                    });
                }
            }
        }
        None
    }
}

/// The whole state as a snapshot whose replay starts at `lsn` (the tests
/// and the fuzz target).
pub fn snapshot(state: &State, lsn: u64) -> Vec<u8> {
    let mut out = snapshot_header(lsn);
    state.snapshot_lines(None, &mut out, usize::MAX);
    out
}

/// A saved state, and the LSN its replay starts at: `None` for a file of
/// palletd before snapshots (one JSON object, saved before any of its
/// changes was acknowledged: nothing to replay).
pub fn load(bytes: &[u8]) -> Result<(State, Option<u64>), String> {
    let mut lines = bytes.split(|b| *b == b'\n');
    let first = lines.next().unwrap_or_default();
    let (mut state, lsn) = match serde_json::from_slice::<Header>(first) {
        Ok(header) => {
            let mut state = State::default();
            for (i, line) in lines.enumerate().filter(|(_, l)| !l.is_empty()) {
                let l: Line<'_> =
                    serde_json::from_slice(line).map_err(|e| format!("line {}: {e}", i + 2))?;
                let node = state.nodes.entry(l.key.into_owned()).or_default();
                match l.device {
                    None => {
                        node.bd_seq = l.bd_seq;
                        node.online = l.online;
                        node.aliases = l.aliases.into_owned();
                    }
                    Some(device) => {
                        node.devices.insert(
                            device.into_owned(),
                            Device {
                                online: l.online,
                                aliases: l.aliases.into_owned(),
                            },
                        );
                    }
                }
            }
            (state, Some(header.lsn))
        }
        Err(_) => (
            serde_json::from_slice(bytes).map_err(|e| e.to_string())?,
            None,
        ),
    };
    state.recount();
    Ok((state, lsn))
}
