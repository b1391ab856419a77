//! `mqtt-sessions.json` in the spool directory: what palletd has
//! subscribed under each client id at the broker, so that a changed
//! configuration undoes what the last one did ([`SessionsFile`]; which
//! sessions open and what each subscribes is [`crate::front::plan`]).
//! Until a retiring session is done the file keeps listing it, so a crash
//! meanwhile retires it again at the next start. Without the file (a spool
//! from before palletd had it), the first client id is taken to hold the
//! configured filters as the single-session palletd subscribed them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::{error, warn};

use crate::config::MqttSettings;
use crate::decode::Subscription;
use crate::front::plan::{legacy, Planned, Probe, Subscribed};

/// The file's name in the spool directory.
pub(crate) const FILE_NAME: &str = "mqtt-sessions.json";

/// `mqtt-sessions.json`: what may be subscribed under each client id.
/// Written (crash-safely) before any connection subscribes, then as the
/// broker acknowledges unsubscribes and retired sessions finish.
#[derive(Debug)]
pub(crate) struct SessionsFile {
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

    /// The file that will hold `before` and everything `plan` subscribes
    /// (the probe's filter on each configured session too), saved now:
    /// from here on a crash leaves it saying what may be subscribed. A
    /// save that fails (a full disk) is logged and palletd goes on: the
    /// file is a record for the next configuration change, and the next
    /// save (an unsubscribe done) tries again.
    pub fn start(
        dir: &Path,
        before: Subscribed,
        plan: &[Planned],
        probe: Option<&Probe>,
    ) -> SessionsFile {
        let mut held = before;
        for p in plan {
            let filters = held.entry(p.client_id.clone()).or_default();
            filters.extend(p.subscribe.iter().map(|(f, _)| f.clone()));
            if !p.retiring {
                filters.extend(probe.map(|p| p.filter.clone()));
            }
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
    pub(crate) fn subscribing(&self, client_id: &str, filters: &[String]) {
        let mut held = self.held.lock().expect("sessions");
        held.entry(client_id.to_string())
            .or_default()
            .extend(filters.iter().cloned());
        self.save_or_log(&held);
    }

    /// The broker took `filter` off `client_id`'s session.
    pub(crate) fn unsubscribed(&self, client_id: &str, filter: &str) {
        let mut held = self.held.lock().expect("sessions");
        if let Some(f) = held.get_mut(client_id) {
            f.remove(filter);
        }
        self.save_or_log(&held);
    }

    /// `client_id`'s session is retired: nothing subscribed, nothing queued.
    pub(crate) fn retired(&self, client_id: &str) {
        let mut held = self.held.lock().expect("sessions");
        held.remove(client_id);
        self.save_or_log(&held);
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
    use crate::front::plan::{plan, probe, tests as p};

    #[test]
    fn the_file_keeps_what_may_be_subscribed_until_the_broker_took_it_off() {
        let dir = tempfile::tempdir().unwrap();
        let m = p::settings(2);
        let before = SessionsFile::load(dir.path(), &m, &p::subs());
        assert_eq!(
            before,
            legacy(&m, &p::subs()),
            "no file: the single session's filters"
        );
        let planned = plan(&m, &p::subs(), &before);
        let file =
            SessionsFile::start(dir.path(), before, &planned, probe(&m, &p::subs()).as_ref());
        let read = || SessionsFile::load(dir.path(), &m, &p::subs());
        assert!(read()["box"].contains("s/+/data"));
        assert!(read()["box-1"].contains("$share/box/palletd/probe/box"));
        file.unsubscribed("box", "s/+/data");
        assert!(!read()["box"].contains("s/+/data"));
        assert!(read()["box-1"].contains("$share/box/s/+/data"));
        file.subscribing("box", &["s/+/data".to_string()]);
        assert!(read()["box"].contains("s/+/data"));
        file.retired("box-1");
        assert!(!read().contains_key("box-1"));
        std::fs::write(dir.path().join(FILE_NAME), b"{").unwrap();
        assert_eq!(read(), legacy(&m, &p::subs()));
        assert!(dir.path().join(format!("{FILE_NAME}.unreadable")).exists());
    }
}
