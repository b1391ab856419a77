//! `[mqtt]` and `[mqtt.tls]`: the broker, the session, credentials and TLS.

use super::*;
use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    /// Stable id: the broker keeps the persistent session (and the messages
    /// palletd has not acknowledged yet) under it.
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub keep_alive: Duration,
    /// How many unacknowledged QoS 1/2 messages the broker sends before it
    /// waits (Mosquitto: `max_inflight_messages`, default 20): bounds what
    /// it can resend ([`MqttSettings::redelivery`]); sizes the hand-off
    /// channel inside palletd. [`DEFAULT_MAX_INFLIGHT`] unless set, and
    /// raised at run time when a session holds more unacknowledged
    /// messages (`crate::ingest::learned`).
    pub max_inflight: usize,
    /// Largest MQTT packet the client accepts; a bigger one breaks the
    /// connection, so the broker's own limit should be at most this.
    pub max_packet_size: usize,
    /// Payloads larger than this go to the dead letter.
    pub max_payload_size: usize,
    /// Subscribe as `$share/<group>/<filter>`: the broker spreads messages
    /// over every client of the group (several palletd instances).
    pub share_group: Option<String>,
    /// MQTT sessions palletd opens (`mqtt.connections`, [`DEFAULT_CONNECTIONS`]
    /// unless set), each with its own in-flight window, all in one shared
    /// subscription per subscription: see [`MqttSettings::group`].
    pub connections: usize,
    /// `protocol`: "3.1.1" (the default) or "5".
    pub protocol: MqttProtocol,
    /// MQTT 5: how long the broker keeps the session (and the messages not
    /// yet acknowledged) after the connection drops; 7 days unless set,
    /// long enough for a long outage, not forever.
    pub session_expiry: Duration,
    /// MQTT 5: the client's Receive Maximum, how many unacknowledged QoS
    /// 1/2 messages the broker may send; [`DEFAULT_RECEIVE_MAXIMUM`]
    /// unless set.
    pub receive_maximum: u16,
    /// TLS for `mqtts://` URLs.
    pub tls: Option<MqttTls>,
}

/// `mqtt.connections` unless set: at the broker's default window (20) four
/// windows in flight carry palletd's group commits to the rate one
/// connection reaches with a window of 1,000 (docs/performance.md).
pub(crate) const DEFAULT_CONNECTIONS: i64 = 4;
/// More sessions than this buy nothing: the spool's group commit binds.
pub(crate) const MAX_CONNECTIONS: i64 = 32;

/// `mqtt.max_inflight` unless set: at least the windows the brokers the
/// documentation names allow (Mosquitto's default 20 and the 1,000 the
/// performance guide tells operators to set, EMQX 32, RabbitMQ's prefetch
/// 10). Larger than the broker's is safe (brokers count packet ids up); it
/// costs 26 bytes per message id kept, twice this many per session.
pub const DEFAULT_MAX_INFLIGHT: i64 = 1000;

impl MqttSettings {
    /// The client id of connection `k`: the first keeps `mqtt.client_id`
    /// (the session palletd always had), the others are
    /// `<client_id>-<k>`. Stable: connection `k` is always the same session.
    pub(crate) fn client_id_of(&self, k: usize) -> String {
        match k {
            0 => self.client_id.clone(),
            k => format!("{}-{k}", self.client_id),
        }
    }

    /// How many messages per session palletd keeps to recognise
    /// redeliveries: twice the broker's in-flight window (MQTT 5: the
    /// Receive Maximum palletd gives it; 3.1.1: `max_inflight`, which the
    /// operator sets to the broker's), see [`crate::front::window`]; and
    /// the session of each connection index under this configuration.
    pub(crate) fn redelivery(&self) -> crate::front::window::Redelivery {
        let broker = match self.protocol {
            MqttProtocol::V311 => self.max_inflight,
            MqttProtocol::V5 => usize::from(self.receive_maximum),
        };
        crate::front::window::Redelivery {
            window: 2 * broker,
            by_index: (0..self.connections.max(1))
                .map(|k| crate::front::window::session_key(&self.client_id_of(k)))
                .collect(),
        }
    }

    /// The shared subscription group the subscriptions join, if any:
    /// `mqtt.share_group`, or with several connections a group of this
    /// instance's own (named after its client id), so that the broker
    /// spreads the messages over its connections and no other client's.
    pub(crate) fn group(&self) -> Option<String> {
        match &self.share_group {
            Some(g) => Some(g.clone()),
            None if self.connections > 1 => Some(self.client_id.replace(['/', '+', '#'], "_")),
            None => None,
        }
    }
}

/// MQTT 5's Receive Maximum unless `mqtt.receive_maximum` says: what
/// palletd takes in cheaply. It acknowledges after the spool's group
/// commit, so the messages of a window share one fsync; 1,000 of them wait
/// in its hand-off channel (1,024 places at least) and the byte-bounded
/// queue behind it, a few hundred KiB of payloads.
pub(crate) const DEFAULT_RECEIVE_MAXIMUM: i64 = 1000;

/// The MQTT protocol version palletd speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MqttProtocol {
    V311,
    V5,
}

#[derive(Debug, Clone, Default)]
pub struct MqttTls {
    /// CA certificates (PEM) that sign the broker's certificate; without it
    /// the Mozilla roots bundled with palletd are used.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the broker's certificate must carry, when it differs from
    /// the URL's host (e.g. connecting by IP address).
    pub server_name: Option<String>,
    /// Accept any certificate. Labs only; logged loudly.
    pub insecure_skip_verify: bool,
}

impl Validator {
    /// `client_id` (the persistent session's name) and `share_group`.
    fn mqtt_names(&mut self, m: &RawMqtt) {
        if m.client_id.trim().is_empty() {
            self.err(
                "mqtt.client_id",
                "must not be empty: the persistent session is kept under it",
            );
        } else if m.client_id.len() > 65535 {
            self.err("mqtt.client_id", "is too long");
        }
        if let Some(g) = &m.share_group {
            if g.is_empty() || g.contains(['/', '+', '#']) {
                self.err(
                    "mqtt.share_group",
                    "must be a non-empty name without '/', '+' or '#'",
                );
            }
        }
    }

    /// `max_packet_size` and `max_payload_size`, in bytes.
    fn mqtt_sizes(&mut self, packet: Option<RawSize>, payload: Option<RawSize>) -> (u64, u64) {
        let max_packet_size = self.size("mqtt.max_packet_size", packet, 4 << 20);
        let max_payload_size = self.size("mqtt.max_payload_size", payload, 256 << 10);
        if max_packet_size > 256 << 20 {
            self.err(
                "mqtt.max_packet_size",
                "must be at most 256MiB (the MQTT limit)",
            );
        }
        if max_payload_size == 0 || max_payload_size > max_packet_size {
            self.err(
                "mqtt.max_payload_size",
                "must be between 1 byte and mqtt.max_packet_size",
            );
        }
        (max_packet_size, max_payload_size)
    }

    pub(super) fn mqtt(&mut self, m: RawMqtt, base: Option<&Path>) -> Option<MqttSettings> {
        let (host, port, tls_url) = match parse_mqtt_url(&m.url) {
            Ok(hp) => hp,
            Err(e) => {
                self.err("mqtt.url", e);
                (String::new(), 0, false)
            }
        };
        self.mqtt_names(&m);
        let tls = match (tls_url, m.tls) {
            (true, raw) => Some(self.mqtt_tls(raw.unwrap_or_default(), base)),
            (false, Some(_)) => {
                self.err("mqtt.tls", "TLS settings need an mqtts:// URL");
                None
            }
            (false, None) => None,
        };
        let password = self.secret(
            "mqtt.password",
            m.password,
            m.password_file,
            m.password_env,
            base,
        );
        if password.is_some() && m.username.is_none() {
            self.err("mqtt.username", "a password needs a username");
        }
        let keep_alive = self.duration("mqtt.keep_alive", m.keep_alive.as_deref(), "30s");
        if keep_alive < Duration::from_secs(5) || keep_alive > Duration::from_secs(65535) {
            self.err("mqtt.keep_alive", "must be between 5s and 18h12m15s");
        }
        let protocol = match m.protocol.as_deref().unwrap_or("3.1.1") {
            "3.1.1" | "4" => MqttProtocol::V311,
            "5" | "5.0" => MqttProtocol::V5,
            other => {
                self.err(
                    "mqtt.protocol",
                    crate::decode::not_one_of(&["3.1.1", "5"], other),
                );
                MqttProtocol::V311
            }
        };
        let session_expiry =
            self.positive_duration("mqtt.session_expiry", m.session_expiry.as_deref(), "7d");
        if session_expiry > Duration::from_secs(u32::MAX as u64) {
            self.err(
                "mqtt.session_expiry",
                "must be at most 136 years (a 32-bit count of seconds)",
            );
        }
        let max_inflight = self.int_in(
            "mqtt.max_inflight",
            m.max_inflight,
            DEFAULT_MAX_INFLIGHT,
            1,
            65535,
        ) as usize;
        let connections = self.int_in(
            "mqtt.connections",
            m.connections,
            DEFAULT_CONNECTIONS,
            1,
            MAX_CONNECTIONS,
        ) as usize;
        let receive_maximum = self.int_in(
            "mqtt.receive_maximum",
            m.receive_maximum,
            DEFAULT_RECEIVE_MAXIMUM,
            1,
            65535,
        ) as u16;
        if protocol == MqttProtocol::V311 {
            for (key, set) in [
                ("session_expiry", m.session_expiry.is_some()),
                ("receive_maximum", m.receive_maximum.is_some()),
            ] {
                if set {
                    self.err(
                        format!("mqtt.{key}"),
                        "is an MQTT 5 setting: it needs mqtt.protocol = \"5\" (under 3.1.1 the broker's own settings decide)",
                    );
                }
            }
        }
        let (max_packet_size, max_payload_size) =
            self.mqtt_sizes(m.max_packet_size, m.max_payload_size);
        Some(MqttSettings {
            host,
            port,
            client_id: m.client_id,
            username: m.username,
            password,
            keep_alive,
            max_inflight,
            max_packet_size: max_packet_size as usize,
            max_payload_size: max_payload_size as usize,
            protocol,
            session_expiry,
            receive_maximum,
            share_group: m.share_group,
            connections,
            tls,
        })
    }

    pub(super) fn mqtt_tls(&mut self, t: RawMqttTls, base: Option<&Path>) -> MqttTls {
        let file = |v: &mut Validator, key: &str, f: Option<String>| -> Option<PathBuf> {
            let p = resolve(base, &f?);
            if let Err(e) = std::fs::metadata(&p) {
                v.err(
                    format!("mqtt.tls.{key}"),
                    format!("cannot read {}: {e}", p.display()),
                );
            }
            Some(p)
        };
        let ca_file = file(self, "ca_file", t.ca_file);
        let cert_file = file(self, "cert_file", t.cert_file);
        let key_file = file(self, "key_file", t.key_file);
        if let Some(k) = &key_file {
            self.warn_if_readable_by_others("mqtt.tls.key_file", k);
        }
        if cert_file.is_some() != key_file.is_some() {
            self.err(
                "mqtt.tls.key_file",
                "a client certificate needs both cert_file and key_file",
            );
        }
        if let Some(name) = &t.server_name {
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                self.err(
                    "mqtt.tls.server_name",
                    format!("{name:?} is not a DNS name or IP address"),
                );
            }
        }
        let insecure_skip_verify = t.insecure_skip_verify.unwrap_or(false);
        if insecure_skip_verify {
            self.warnings.push(
                "mqtt.tls.insecure_skip_verify = true: the broker's certificate is NOT checked; anyone on the path can read and change the traffic. For labs only.".into(),
            );
        }
        MqttTls {
            ca_file,
            cert_file,
            key_file,
            server_name: t.server_name,
            insecure_skip_verify,
        }
    }
}

/// `mqtt://host:port` (port 1883 by default) or `mqtts://host:port` (TLS,
/// port 8883 by default): (host, port, tls). Errors never repeat the URL,
/// which might carry a password.
pub fn parse_mqtt_url(text: &str) -> Result<(String, u16, bool), String> {
    let url = url::Url::parse(text).map_err(|e| format!("invalid URL: {e}"))?;
    let (tls, default_port) = match url.scheme() {
        "mqtt" | "tcp" => (false, 1883),
        "mqtts" | "ssl" => (true, 8883),
        other => {
            return Err(format!(
                "unsupported scheme {other:?}: use mqtt://host:port or mqtts://host:port"
            ))
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "put credentials in mqtt.username and mqtt.password_file, not in the URL".into(),
        );
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("no host in the URL")?;
    if url.path() != "" && url.path() != "/" {
        return Err(format!("unexpected path {:?} in the URL", url.path()));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, url.port().unwrap_or(default_port), tls))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMqtt {
    pub url: String,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<String>,
    pub password_env: Option<String>,
    pub keep_alive: Option<String>,
    pub max_inflight: Option<i64>,
    pub max_packet_size: Option<RawSize>,
    pub max_payload_size: Option<RawSize>,
    pub share_group: Option<String>,
    pub connections: Option<i64>,
    pub protocol: Option<String>,
    pub session_expiry: Option<String>,
    pub receive_maximum: Option<i64>,
    pub tls: Option<RawMqttTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMqttTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub server_name: Option<String>,
    pub insecure_skip_verify: Option<bool>,
}
