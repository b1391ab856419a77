//! Which MQTT sessions palletd opens and what each subscribes ([`plan`]),
//! given what the broker holds under each client id from earlier runs
//! (`mqtt-sessions.json`, kept by the ingest task).
//!
//! With `mqtt.connections = N` palletd opens N sessions,
//! [`MqttSettings::client_id_of`] 0..N, and every subscription but a
//! Sparkplug B one joins a shared subscription group
//! ([`MqttSettings::group`]) on each of them: the broker spreads the
//! messages over the N in-flight windows. A Sparkplug B subscription, and
//! one with thinned fields, stays on the first connection alone, unshared
//! ([`Subscription::in_order`]): a node's BIRTH must be read before its
//! DATA, and thinning takes a field's points in the order they were sent
//! (over four connections a burst came to the thinning hundreds of places
//! out of order, and three in four points were stored as received).
//!
//! Shared subscriptions are verified before they are trusted: each
//! configured session also subscribes the shared probe filter
//! ([`Probe`]), palletd publishes to its topic, and the data is
//! subscribed once the broker is seen to deliver it (see
//! [`super::session`]).
//!
//! A persistent session keeps its subscriptions when palletd's
//! configuration changes; a group member left behind goes on being sent
//! its share of the messages (Mosquitto queues them for it while it is
//! offline, up to `max_queued_messages`, then drops them). So a filter no
//! longer wanted is unsubscribed after the new ones are subscribed (a few
//! milliseconds in which a message may come through both: stored twice,
//! never lost), and a client id no longer wanted (`connections` went
//! down, `client_id` changed) is *retired*: connected, unsubscribed from
//! everything, and kept until the messages its session had queued are
//! received and acknowledged ([`RETIRE_QUIET`] without one), then
//! disconnected. Its redeliveries are recognised by its client id
//! ([`super::window::session_key`]), whatever index it gets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::config::MqttSettings;
use crate::decode::Subscription;

/// A retiring session is done when nothing came for this long and every
/// message it received is acknowledged: the broker sends what it queued as
/// soon as the window has room.
pub(crate) const RETIRE_QUIET: Duration = Duration::from_secs(3);

/// Connection indexes from here on are retiring sessions (those below are
/// `mqtt.connections`' own); acknowledgements go by index.
pub(crate) const FIRST_RETIRING: usize = 64;

/// Retiring sessions opened at one start: each holds a socket and its
/// window, so a file listing more (client ids changed many times) retires
/// the rest at the following starts.
pub(crate) const MAX_RETIRING: usize = 32;

/// One session palletd opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Its index: which connection acknowledges its messages.
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
pub(crate) type Subscribed = BTreeMap<String, BTreeSet<String>>;

/// How shared delivery is proved: every configured session subscribes
/// `filter` (QoS 0), `$share/<group>/<topic>`, and palletd publishes to
/// `topic`, a topic of its own (`palletd/probe/<client id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub topic: String,
    pub filter: String,
    /// The group is palletd's own (no `mqtt.share_group`): a broker that
    /// does not deliver through it gets one unshared connection instead.
    pub own_group: bool,
}

/// The probe, when subscriptions are shared.
pub(crate) fn probe(mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Option<Probe> {
    let group = mqtt.group()?;
    if subscriptions.iter().all(|s| s.in_order()) {
        return None;
    }
    let id = mqtt.client_id.replace(['/', '+', '#'], "_");
    let topic = format!("palletd/probe/{id}");
    Some(Probe {
        filter: format!("$share/{group}/{topic}"),
        topic,
        own_group: mqtt.share_group.is_none(),
    })
}

/// The filter of a shared subscription (`$share/<group>/<filter>`).
pub(crate) fn unshared(filter: &str) -> Option<&str> {
    let rest = filter.strip_prefix("$share/")?;
    rest.split_once('/').map(|(_, f)| f)
}

/// The filters of `subscriptions` as connection `k` subscribes them.
fn filters_of(mqtt: &MqttSettings, subscriptions: &[Subscription], k: usize) -> Vec<(String, u8)> {
    let group = mqtt.group();
    subscriptions
        .iter()
        .filter_map(|s| {
            let filter = s.pattern.filter();
            let alone = s.in_order();
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
pub(crate) fn legacy(mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Subscribed {
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
/// ones. The probe's filter is wanted by every configured one.
pub fn plan(
    mqtt: &MqttSettings,
    subscriptions: &[Subscription],
    before: &Subscribed,
) -> Vec<Planned> {
    let probe = probe(mqtt, subscriptions);
    let mut out = Vec::new();
    for k in 0..mqtt.connections {
        let subscribe = filters_of(mqtt, subscriptions, k);
        if k > 0 && subscribe.is_empty() {
            break;
        }
        let client_id = mqtt.client_id_of(k);
        let mut wanted: BTreeSet<&str> = subscribe.iter().map(|(f, _)| f.as_str()).collect();
        wanted.extend(probe.as_ref().map(|p| p.filter.as_str()));
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn settings(connections: usize) -> MqttSettings {
        let text = format!(
            "[mqtt]\nurl = \"mqtt://localhost\"\nclient_id = \"box\"\nconnections = {connections}\n[mongodb]\nuri = \"mongodb://localhost\"\ndatabase = \"d\"\ncollection = \"c\"\n[spool]\ndir = \"/tmp/x\"\n[[subscription]]\ntopic = \"s/{{sensor}}/data\"\nformat = \"json\"\n[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n"
        );
        crate::config::parse(&text, None)
            .map(|s| s.mqtt)
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    pub(crate) fn subs() -> Vec<Subscription> {
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
        let probe = probe(&m, &subs()).unwrap();
        assert_eq!(probe.filter, "$share/box/palletd/probe/box");
        assert!(probe.own_group);
        assert_eq!(super::probe(&settings(1), &subs()), None, "nothing shared");
    }

    #[test]
    fn fewer_connections_retire_the_sessions_left_over() {
        let subs = subs();
        let four = plan(&settings(4), &subs, &Subscribed::new());
        let mut held = Subscribed::new();
        for p in &four {
            let mut filters: BTreeSet<String> = p.subscribe.iter().map(|f| f.0.clone()).collect();
            filters.insert("$share/box/palletd/probe/box".into());
            held.insert(p.client_id.clone(), filters);
        }
        let two = plan(&settings(2), &subs, &held);
        assert_eq!(two.len(), 4);
        assert!(
            two[..2]
                .iter()
                .all(|p| !p.retiring && p.unsubscribe.is_empty()),
            "the probe's filter is wanted"
        );
        assert_eq!(
            (two[2].client_id.as_str(), two[2].retiring, two[2].index),
            ("box-2", true, FIRST_RETIRING)
        );
        assert_eq!(
            two[3].unsubscribe,
            ["$share/box/palletd/probe/box", "$share/box/s/+/data"]
        );
        // One connection: unshared again, the shared filters undone.
        let one = plan(&settings(1), &subs, &held);
        assert_eq!(one[0].subscribe.len(), 2);
        assert_eq!(
            one[0].unsubscribe,
            ["$share/box/palletd/probe/box", "$share/box/s/+/data"]
        );
        assert_eq!(one.iter().filter(|p| p.retiring).count(), 3);
    }

    #[test]
    fn only_sparkplug_opens_one_connection() {
        let subs: Vec<Subscription> = subs().into_iter().skip(1).collect();
        let p = plan(&settings(4), &subs, &Subscribed::new());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].subscribe, [("spBv1.0/#".to_string(), 1)]);
        assert_eq!(probe(&settings(4), &subs), None);
    }

    #[test]
    fn unshared_takes_the_group_off() {
        assert_eq!(unshared("$share/g/a/b/#"), Some("a/b/#"));
        assert_eq!(unshared("a/b"), None);
    }
}
