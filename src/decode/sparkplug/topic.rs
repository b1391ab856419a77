//! Sparkplug B topics: `spBv1.0/<group>/<message type>/<edge node>[/<device>]`,
//! and the message types.

use super::*;

/// The message types of a Sparkplug B topic (STATE aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    NBirth,
    NDeath,
    DBirth,
    DDeath,
    NData,
    DData,
    NCmd,
    DCmd,
}

/// Their names, as in the topic (the label values of
/// `palletd_sparkplug_messages_total{type}`).
pub const KINDS: &[&str] = &[
    "NBIRTH", "NDEATH", "DBIRTH", "DDEATH", "NDATA", "DDATA", "NCMD", "DCMD",
];

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::NBirth,
        Kind::NDeath,
        Kind::DBirth,
        Kind::DDeath,
        Kind::NData,
        Kind::DData,
        Kind::NCmd,
        Kind::DCmd,
    ];

    pub(super) fn name(self) -> &'static str {
        KINDS[self as usize]
    }

    pub(super) fn of(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A device's message (one topic level more).
    pub(super) fn of_device(self) -> bool {
        matches!(self, Kind::DBirth | Kind::DDeath | Kind::DData | Kind::DCmd)
    }
}

/// The parts of a Sparkplug topic.
#[derive(Debug, Clone, Copy)]
pub(super) struct Topic<'a> {
    pub(super) group: &'a str,
    pub(super) kind: Kind,
    pub(super) node: &'a str,
    pub(super) device: Option<&'a str>,
}

/// `None`: a STATE message (host application state, not an edge node's).
pub(super) fn parse_topic(topic: &str) -> Result<Option<Topic<'_>>, DecodeError> {
    let bad = |why: &str| {
        DecodeError::BadPayload(format!(
            "topic {:?} is not a Sparkplug B topic ({NAMESPACE}/<group>/<type>/<node>[/<device>]): {why}",
            truncate(topic, 128)
        ))
    };
    let parts: Vec<&str> = topic.split('/').collect();
    if parts.first() != Some(&NAMESPACE) {
        return Err(bad("it does not start with spBv1.0/"));
    }
    if parts.get(1) == Some(&"STATE") {
        return Ok(None);
    }
    let (Some(group), Some(kind), Some(node)) = (parts.get(1), parts.get(2), parts.get(3)) else {
        return Err(bad("too few levels"));
    };
    let Some(kind) = Kind::of(kind) else {
        return Err(bad("unknown message type"));
    };
    let device = parts.get(4).copied();
    if parts.len() > 5 || kind.of_device() != device.is_some() {
        return Err(bad(if kind.of_device() {
            "a device message needs exactly one device level"
        } else {
            "an edge node message has no device level"
        }));
    }
    if group.is_empty() || node.is_empty() || device == Some("") {
        return Err(bad("an empty id"));
    }
    Ok(Some(Topic {
        group,
        kind,
        node,
        device,
    }))
}
