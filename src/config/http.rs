//! `[http]`: the status page, metrics and API endpoint, and its credentials.

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    pub listen: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<String>,
    pub password_env: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<String>,
    pub token_env: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` (an
    /// empty `listen`) turns the endpoint off.
    pub listen: Option<std::net::SocketAddr>,
    /// Credentials the status page and `/metrics` require (`/healthz` and
    /// `/readyz` stay open for probes); both `None`: no credentials.
    pub auth: HttpAuth,
}

/// `[http]` credentials: a request passes with either.
#[derive(Debug, Clone, Default)]
pub struct HttpAuth {
    /// HTTP Basic: `username` and `password`.
    pub basic: Option<(String, Secret)>,
    /// `Authorization: Bearer <token>`.
    pub token: Option<Secret>,
}

impl HttpAuth {
    /// Whether any credentials are required.
    pub(crate) fn required(&self) -> bool {
        self.basic.is_some() || self.token.is_some()
    }
}

impl Validator {
    pub(super) fn http(&mut self, h: RawHttp, base: Option<&Path>) -> HttpSettings {
        let password = self.secret(
            "http.password",
            h.password,
            h.password_file,
            h.password_env,
            base,
        );
        let token = self.secret("http.token", h.token, h.token_file, h.token_env, base);
        let basic = match (h.username, password) {
            (Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') {
                    self.err("http.username", "must be non-empty and without ':'");
                }
                Some((user, password))
            }
            (None, Some(_)) => {
                self.err("http.username", "a password needs a username");
                None
            }
            (Some(_), None) => {
                self.err("http.password", "a username needs a password");
                None
            }
            (None, None) => None,
        };
        for (key, secret) in [
            ("http.password", basic.as_ref().map(|b| &b.1)),
            ("http.token", token.as_ref()),
        ] {
            if secret.is_some_and(|s| s.expose().is_empty()) {
                self.err(key, "must not be empty");
            }
        }
        let auth = HttpAuth { basic, token };
        let text = h.listen.unwrap_or_else(|| "127.0.0.1:9464".into());
        if text.trim().is_empty() {
            return HttpSettings { listen: None, auth };
        }
        match text.trim().parse() {
            Ok(addr) => HttpSettings {
                listen: Some(addr),
                auth,
            },
            Err(_) => {
                self.err("http.listen", format!("{text:?} is not an address:port (e.g. \"127.0.0.1:9464\"; empty to turn off)"));
                HttpSettings { listen: None, auth }
            }
        }
    }
}
