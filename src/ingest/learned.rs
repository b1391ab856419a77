//! What palletd learns of the broker, kept in `mqtt-broker` in the spool's
//! directory for the next start (and the spool's recovery):
//!
//! - **Its in-flight window.** MQTT 3.1.1 has no way for a broker to say
//!   how many messages it sends a session without their PUBACKs, and a
//!   resend from further back than the window palletd keeps would be
//!   taken for a new message ([`crate::front::window`]). The window starts
//!   at what the operator said (`mqtt.max_inflight`, 1,000 by default) and
//!   is raised as soon as a session holds more unacknowledged messages
//!   than that ([`crate::front::session::Session::learn`]): said once at
//!   WARN, shown as `palletd_mqtt_broker_window`.
//! - **How it numbers its resends** ([`Numbering`]): under the packet ids
//!   they had (Mosquitto, EMQX, VerneMQ, aedes), or under the new
//!   connection's (RabbitMQ). Seen on the first resumed connection whose
//!   messages show it; said at INFO (kept) or WARN (renumbered).
//!
//! ```text
//! palletd mqtt broker
//! broker mqtt.example.net:1883
//! window 1500
//! resends kept
//! ```
//!
//! What was learned of another broker (`mqtt.url` changed) is not taken.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::config::MqttSettings;
use crate::front::window::Numbering;

/// The file's name in the spool's directory.
pub(crate) const FILE_NAME: &str = "mqtt-broker";

const HEADER: &str = "palletd mqtt broker";

/// What the file says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Known {
    /// The broker's window, if one larger than configured was seen.
    pub window: Option<usize>,
    pub numbering: Numbering,
}

/// The broker's address as the file names it.
fn address(mqtt: &MqttSettings) -> String {
    format!("{}:{}", mqtt.host, mqtt.port)
}

/// What is known in `dir` of the broker at `broker` (nothing, without the
/// file, with one palletd cannot read, or of another broker: everything
/// is learned again).
pub(crate) fn load(dir: &Path, broker: &str) -> Known {
    let mut known = Known::default();
    let Ok(text) = std::fs::read_to_string(dir.join(FILE_NAME)) else {
        return known;
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return known;
    }
    for line in lines {
        match line.split_once(' ') {
            Some(("broker", b)) if b.trim() != broker => return Known::default(),
            Some(("window", n)) => known.window = n.trim().parse().ok(),
            Some(("resends", n)) => {
                known.numbering = Numbering::parse(n.trim()).unwrap_or_default()
            }
            _ => {}
        }
    }
    known
}

fn save(dir: &Path, broker: &str, known: Known) -> std::io::Result<()> {
    let mut text = format!("{HEADER}\nbroker {broker}\n");
    if let Some(w) = known.window {
        text.push_str(&format!("window {w}\n"));
    }
    text.push_str(&format!("resends {}\n", known.numbering.name()));
    crate::spool::fs::replace(&crate::spool::fs::Os, dir, FILE_NAME, text.as_bytes())
}

/// Messages kept per session to recognise redeliveries: twice the
/// broker's window, as configured or as learned before.
pub(crate) fn redelivery_window(mqtt: &MqttSettings, dir: &Path) -> usize {
    let learned = load(dir, &address(mqtt)).window.map_or(0, |w| 2 * w);
    mqtt.redelivery().window.max(learned)
}

/// What this process learned of the broker, kept as it learns.
#[derive(Debug)]
pub(crate) struct Learned {
    window: AtomicUsize,
    known: Mutex<Known>,
    dir: PathBuf,
    broker: String,
    said: AtomicBool,
}

impl Learned {
    /// Starting from `window` (the broker's, as palletd takes it) and what
    /// `dir`'s file says of `mqtt`'s broker.
    pub(crate) fn new(window: usize, dir: PathBuf, mqtt: &MqttSettings) -> Learned {
        metrics::gauge!(crate::telemetry::MQTT_BROKER_WINDOW).set(window as f64);
        let broker = address(mqtt);
        let known = load(&dir, &broker);
        show(known.numbering);
        Learned {
            window: AtomicUsize::new(window),
            known: Mutex::new(known),
            dir,
            broker,
            said: AtomicBool::new(false),
        }
    }

    /// How the broker numbers its resends, as known at start.
    pub(crate) fn numbering(&self) -> Numbering {
        self.lock().numbering
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, change: impl FnOnce(&mut Known)) {
        let mut known = self.lock();
        change(&mut known);
        if let Err(e) = save(&self.dir, &self.broker, *known) {
            tracing::warn!(error = %e, "Cannot keep what palletd learned of the broker in the spool's directory (mqtt-broker); the next start learns it again.");
        }
    }

    /// A session of `client_id` held `window` unacknowledged messages,
    /// more than its window: kept, said, shown, when beyond every
    /// session's. Returns the redelivery window to keep, if it grew.
    pub(crate) fn raise(&self, client_id: &str, window: usize) -> Option<usize> {
        let was = self.window.fetch_max(window, Ordering::Relaxed);
        if window <= was {
            return None;
        }
        metrics::gauge!(crate::telemetry::MQTT_BROKER_WINDOW).set(window as f64);
        self.keep(|k| k.window = Some(window));
        if !self.said.swap(true, Ordering::Relaxed) {
            tracing::warn!(%client_id, window, was, "The broker sends more messages without their PUBACKs than mqtt.max_inflight says: palletd now keeps the last {} message ids per session to recognise its resends (kept for the next start). Set mqtt.max_inflight to the broker's window (Mosquitto: max_inflight_messages).", 2 * window);
        } else {
            tracing::info!(%client_id, window, was, "The broker's window is larger again; palletd keeps more message ids per session.");
        }
        Some(2 * window)
    }

    /// A session of `client_id` saw how the broker numbers its resends.
    pub(crate) fn numbered(&self, client_id: &str, numbering: Numbering) {
        if self.lock().numbering == numbering {
            return;
        }
        self.keep(|k| k.numbering = numbering);
        show(numbering);
        match numbering {
            Numbering::Renumbered => {
                tracing::warn!(%client_id, "The broker resends unacknowledged messages under new packet ids (RabbitMQ does): palletd recognises a resend by its topic and payload and where it comes among the resends. A message whose readings carry no time of their own (a bare value, JSON without a timestamp) may then be stored twice after a reconnect; none is lost.")
            }
            _ => {
                tracing::info!(%client_id, "The broker resends unacknowledged messages under the packet ids they had: each resend is recognised by its packet id and digest.")
            }
        }
    }
}

/// Shows `numbering` in `palletd_mqtt_broker_resends`.
fn show(numbering: Numbering) {
    for n in [Numbering::Unknown, Numbering::Kept, Numbering::Renumbered] {
        let at = if n == numbering { 1.0 } else { 0.0 };
        metrics::gauge!(crate::telemetry::MQTT_BROKER_RESENDS, "numbering" => n.name()).set(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_learned_is_kept_and_a_window_only_grows() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[mqtt]\nurl = \"mqtt://localhost\"\nclient_id = \"box\"\nmax_inflight = 20\n[mongodb]\nuri = \"mongodb://localhost\"\ndatabase = \"d\"\n[spool]\ndir = \"/tmp/x\"\n[[subscription]]\ntopic = \"s/{sensor}\"\nformat = \"json\"\n";
        let settings = crate::config::parse(text, None).unwrap();
        let mqtt = &settings.mqtt;
        let here = address(mqtt);
        assert_eq!(load(dir.path(), &here), Known::default());
        let l = Learned::new(20, dir.path().to_path_buf(), mqtt);
        assert_eq!(l.raise("box", 15), None, "within");
        assert_eq!(l.raise("box", 35), Some(70));
        assert_eq!(l.raise("box-1", 30), None, "another session's smaller one");
        l.numbered("box", Numbering::Renumbered);
        let known = load(dir.path(), &here);
        assert_eq!(known.window, Some(35));
        assert_eq!(known.numbering, Numbering::Renumbered);
        let again = Learned::new(20, dir.path().to_path_buf(), mqtt);
        assert_eq!(again.numbering(), Numbering::Renumbered);
        assert_eq!(redelivery_window(mqtt, dir.path()), 70);
        assert_eq!(redelivery_window(mqtt, Path::new("/nonexistent")), 40);
        assert_eq!(
            load(dir.path(), "another.example:1883"),
            Known::default(),
            "another broker: learned again"
        );
        std::fs::write(dir.path().join(FILE_NAME), "garbage").unwrap();
        assert_eq!(
            load(dir.path(), &here),
            Known::default(),
            "unreadable: learned again"
        );
    }
}
