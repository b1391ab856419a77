//! Which MQTT sessions palletd opens and what each subscribes
//! ([`plan`]), and `mqtt-sessions.json` in the spool directory: what it
//! has subscribed under each client id at the broker, so that a changed
//! configuration undoes what the last one did ([`SessionsFile`]).
//!
//! With `mqtt.connections = N` palletd opens N sessions,
//! [`MqttSettings::client_id_of`] 0..N, and every subscription but a
//! Sparkplug B one joins a shared subscription group
//! ([`MqttSettings::group`]) on each of them: the broker spreads the
//! messages over the N in-flight windows. A Sparkplug B subscription stays
//! on the first connection alone, unshared: a node's BIRTH must be read
//! before its DATA.
//!
//! A persistent session keeps its subscriptions when palletd's
//! configuration changes; a group member left behind goes on being sent
//! its share of the messages (Mosquitto queues them for it while it is
//! offline, up to `max_queued_messages`, then drops them). So at start the
//! file says what each client id holds; a filter no longer wanted is
//! unsubscribed after the new ones are subscribed (a few milliseconds in
//! which a message may come through both: stored twice, never lost), and a
//! client id no longer wanted (`connections` went down, `client_id`
//! changed) is *retired*: connected, unsubscribed from everything, and kept
//! until the messages its session had queued are received and acknowledged
//! ([`RETIRE_QUIET`] without one), then disconnected. Until then the file
//! keeps listing it, so a crash meanwhile retires it again at the next
//! start. Without the file (a spool from before palletd had it), the first
//! client id is taken to hold the configured filters as the single-session
//! palletd subscribed them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{error, warn};

use crate::config::MqttSettings;
use crate::decode::{PayloadFormat, Subscription};

/// The file's name in the spool directory.
pub const FILE_NAME: &str = "mqtt-sessions.json";

/// A retiring session is done when nothing came for this long and every
/// message it received is acknowledged: the broker sends what it queued as
/// soon as the window has room.
pub const RETIRE_QUIET: Duration = Duration::from_secs(3);

/// Connection indexes from here on are retiring sessions (those below are
/// `mqtt.connections`' own): the index goes into the spool's message-id
/// records, so it must not be one a kept session has.
pub const FIRST_RETIRING: usize = 64;

/// Retiring sessions opened at one start: each holds a socket and 1 MiB
/// of redelivery tables, so a file listing more (client ids changed many
/// times) retires the rest at the following starts.
pub const MAX_RETIRING: usize = 32;

/// One session palletd opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Its index: the acknowledgements' and the spool records' connection.
    pub index: usize,
    pub client_id: String,
    /// What it subscribes, with the QoS.
    pub subscribe: Vec<(String, u8)>,
    /// What an earlier configuration subscribed that it no longer wants.
    pub unsubscribe: Vec<String>,
    /// A session no longer wanted: unsubscribed, drained, disconnected.
    pub retiring: bool,
}

/// Client id to the filters subscribed under it.
pub type Subscribed = BTreeMap<String, BTreeSet<String>>;

/// The filters of `subscriptions` as connection `k` subscribes them.
fn filters_of(mqtt: &MqttSettings, subscriptions: &[Subscription], k: usize) -> Vec<(String, u8)> {
    let group = mqtt.group();
    subscriptions
        .iter()
        .filter_map(|s| {
            let filter = s.pattern.filter();
            let alone = s.format == PayloadFormat::SparkplugB;
            match (&group, alone) {
                (Some(g), false) => Some((format!("$share/{g}/{filter}"), s.qos)),
                (_, true) if k == 0 => Some((filter, s.qos)),
                (None, false) if k == 0 => Some((filter, s.qos)),
                _ => None,
            }
        })
        .collect()
}

/// What a palletd from before `mqtt-sessions.json` subscribed: one session
/// under `mqtt.client_id`, the filters shared only with `share_group`.
fn legacy(mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Subscribed {
    let filters = subscriptions
        .iter()
        .map(|s| match &mqtt.share_group {
            Some(g) => format!("$share/{g}/{}", s.pattern.filter()),
            None => s.pattern.filter(),
        })
        .collect();
    BTreeMap::from([(mqtt.client_id.clone(), filters)])
}

/// The sessions to open, given what the broker holds (`before`): the
/// configured connections first (a connection with nothing to subscribe,
/// all subscriptions being Sparkplug B, is not opened), then the retiring
/// ones.
pub fn plan(
    mqtt: &MqttSettings,
    subscriptions: &[Subscription],
    before: &Subscribed,
) -> Vec<Planned> {
    let mut out = Vec::new();
    for k in 0..mqtt.connections {
        let subscribe = filters_of(mqtt, subscriptions, k);
        if k > 0 && subscribe.is_empty() {
            break;
        }
        let client_id = mqtt.client_id_of(k);
        let wanted: BTreeSet<&str> = subscribe.iter().map(|(f, _)| f.as_str()).collect();
        let unsubscribe = before
            .get(&client_id)
            .into_iter()
            .flatten()
            .filter(|f| !wanted.contains(f.as_str()))
            .cloned()
            .collect();
        out.push(Planned {
            index: k,
            client_id,
            subscribe,
            unsubscribe,
            retiring: false,
        });
    }
    let kept: BTreeSet<String> = out.iter().map(|p| p.client_id.clone()).collect();
    let retiring = before
        .iter()
        .filter(|(id, _)| !kept.contains(*id))
        .take(MAX_RETIRING);
    for (i, (client_id, filters)) in retiring.enumerate() {
        out.push(Planned {
            index: FIRST_RETIRING + i,
            client_id: client_id.clone(),
            subscribe: Vec::new(),
            unsubscribe: filters.iter().cloned().collect(),
            retiring: true,
        });
    }
    out
}

/// `mqtt-sessions.json`: what may be subscribed under each client id.
/// Written (crash-safely) before any connection subscribes, then as the
/// broker acknowledges unsubscribes and retired sessions finish.
#[derive(Debug)]
pub struct SessionsFile {
    dir: PathBuf,
    held: Mutex<Subscribed>,
}

impl SessionsFile {
    /// Reads what the broker holds by the file (or, without one, by what a
    /// single-session palletd subscribed); an unreadable file is moved
    /// aside and the configured filters taken, as without one.
    pub fn load(dir: &Path, mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Subscribed {
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(s) => s,
                Err(e) => {
                    let aside = dir.join(format!("{FILE_NAME}.unreadable"));
                    error!(path = %path.display(), error = %e, "Cannot read what the MQTT sessions subscribed; moved aside, taking the configured subscriptions as subscribed.");
                    let _ = std::fs::rename(&path, aside);
                    legacy(mqtt, subscriptions)
                }
            },
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(path = %path.display(), error = %e, "Cannot read what the MQTT sessions subscribed; taking the configured subscriptions as subscribed.");
                }
                legacy(mqtt, subscriptions)
            }
        }
    }

    /// The file that will hold `before` and everything `plan` subscribes,
    /// saved now: from here on a crash leaves it saying what may be
    /// subscribed. A save that fails (a full disk) is logged and palletd
    /// goes on: the file is a record for the next configuration change,
    /// and the next save (an unsubscribe done) tries again.
    pub fn start(dir: &Path, before: Subscribed, plan: &[Planned]) -> SessionsFile {
        let mut held = before;
        for p in plan {
            let filters = held.entry(p.client_id.clone()).or_default();
            filters.extend(p.subscribe.iter().map(|(f, _)| f.clone()));
        }
        let file = SessionsFile {
            dir: dir.to_path_buf(),
            held: Mutex::new(held),
        };
        file.save_or_log(&file.held.lock().expect("sessions"));
        file
    }

    /// `client_id` subscribes `filters` besides what it had (the first
    /// connection's unshared fallback).
    pub fn subscribing(&self, client_id: &str, filters: &[(String, rumqttc::QoS)]) {
        let mut held = self.held.lock().expect("sessions");
        held.entry(client_id.to_string())
            .or_default()
            .extend(filters.iter().map(|f| f.0.clone()));
        self.save_or_log(&held);
    }

    /// The broker took `filter` off `client_id`'s session.
    pub fn unsubscribed(&self, client_id: &str, filter: &str) {
        let mut held = self.held.lock().expect("sessions");
        if let Some(f) = held.get_mut(client_id) {
            f.remove(filter);
        }
        self.save_or_log(&held);
    }

    /// `client_id`'s session is retired: nothing subscribed, nothing queued.
    pub fn retired(&self, client_id: &str) {
        let mut held = self.held.lock().expect("sessions");
        held.remove(client_id);
        self.save_or_log(&held);
    }

    /// What the file holds now.
    pub fn held(&self) -> Subscribed {
        self.held.lock().expect("sessions").clone()
    }

    fn save(&self, held: &Subscribed) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(held).expect("plain strings serialise");
        crate::spool::fs::replace(&crate::spool::fs::Os, &self.dir, FILE_NAME, &bytes)
    }

    /// A failed save leaves the old file: the next start undoes again what
    /// is already undone (harmless), and does not know of what this run
    /// subscribed anew (said at ERROR).
    fn save_or_log(&self, held: &Subscribed) {
        if let Err(e) = self.save(held) {
            error!(dir = %self.dir.display(), error = %e, "Cannot save what the MQTT sessions subscribed (mqtt-sessions.json); going on. Should the subscriptions change before a save succeeds, the next start may not know to undo what this run subscribed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(connections: usize) -> MqttSettings {
        let text = format!(
            "[mqtt]\nurl = \"mqtt://localhost\"\nclient_id = \"box\"\nconnections = {connections}\n[mongodb]\nuri = \"mongodb://localhost\"\ndatabase = \"d\"\ncollection = \"c\"\n[spool]\ndir = \"/tmp/x\"\n[[subscription]]\ntopic = \"s/{{sensor}}/data\"\nformat = \"json\"\n[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n"
        );
        crate::config::parse(&text, None)
            .map(|s| s.mqtt)
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    fn subs() -> Vec<Subscription> {
        let text = "[mqtt]\nurl = \"mqtt://localhost\"\nclient_id = \"box\"\n[mongodb]\nuri = \"mongodb://localhost\"\ndatabase = \"d\"\ncollection = \"c\"\n[spool]\ndir = \"/tmp/x\"\n[[subscription]]\ntopic = \"s/{sensor}/data\"\nformat = \"json\"\n[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n";
        crate::config::parse(text, None).unwrap().subscriptions
    }

    #[test]
    fn sparkplug_stays_on_the_first_connection_and_the_rest_is_shared() {
        let m = settings(3);
        let p = plan(&m, &subs(), &legacy(&settings(1), &subs()));
        let ids: Vec<&str> = p.iter().map(|p| p.client_id.as_str()).collect();
        assert_eq!(ids, ["box", "box-1", "box-2"]);
        assert_eq!(
            p[0].subscribe,
            [
                ("$share/box/s/+/data".to_string(), 1),
                ("spBv1.0/#".to_string(), 1)
            ]
        );
        assert_eq!(p[1].subscribe, [("$share/box/s/+/data".to_string(), 1)]);
        // The single session's plain filter goes once the shared one is in.
        assert_eq!(p[0].unsubscribe, ["s/+/data"]);
        assert!(p[1].unsubscribe.is_empty() && !p.iter().any(|p| p.retiring));
    }

    #[test]
    fn fewer_connections_retire_the_sessions_left_over() {
        let subs = subs();
        let four = plan(&settings(4), &subs, &Subscribed::new());
        let mut held = Subscribed::new();
        for p in &four {
            held.insert(
                p.client_id.clone(),
                p.subscribe.iter().map(|f| f.0.clone()).collect(),
            );
        }
        let two = plan(&settings(2), &subs, &held);
        assert_eq!(two.len(), 4);
        assert!(two[..2]
            .iter()
            .all(|p| !p.retiring && p.unsubscribe.is_empty()));
        assert_eq!(
            (two[2].client_id.as_str(), two[2].retiring, two[2].index),
            ("box-2", true, FIRST_RETIRING)
        );
        assert_eq!(two[3].unsubscribe, ["$share/box/s/+/data"]);
        // One connection: unshared again, the shared filter undone.
        let one = plan(&settings(1), &subs, &held);
        assert_eq!(one[0].subscribe.len(), 2);
        assert_eq!(one[0].unsubscribe, ["$share/box/s/+/data"]);
        assert_eq!(one.iter().filter(|p| p.retiring).count(), 3);
    }

    #[test]
    fn only_sparkplug_opens_one_connection() {
        let subs: Vec<Subscription> = subs().into_iter().skip(1).collect();
        let p = plan(&settings(4), &subs, &Subscribed::new());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].subscribe, [("spBv1.0/#".to_string(), 1)]);
    }

    #[test]
    fn the_file_keeps_what_may_be_subscribed_until_the_broker_took_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let m = settings(2);
        let before = SessionsFile::load(dir.path(), &m, &subs());
        assert_eq!(
            before,
            legacy(&m, &subs()),
            "no file: the single session's filters"
        );
        let p = plan(&m, &subs(), &before);
        let file = SessionsFile::start(dir.path(), before, &p);
        let read = || SessionsFile::load(dir.path(), &m, &subs());
        assert!(read()["box"].contains("s/+/data"));
        file.unsubscribed("box", "s/+/data");
        assert!(!read()["box"].contains("s/+/data"));
        assert!(read()["box-1"].contains("$share/box/s/+/data"));
        file.retired("box-1");
        assert!(!read().contains_key("box-1"));
        std::fs::write(dir.path().join(FILE_NAME), b"{").unwrap();
        assert_eq!(read(), legacy(&m, &subs()));
        assert!(dir.path().join(format!("{FILE_NAME}.unreadable")).exists());
    }
}
