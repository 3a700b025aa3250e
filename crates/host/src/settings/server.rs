//! The top-level keys: the application, the listeners, the public URL, the event fan-out, the
//! data directory, the store and the server secret.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::error::{ConfigError, bad};
use super::keys;

/// Which application to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppChoice {
    /// The demo shop.
    Demo,
    /// The conformance fixture.
    Conformance,
    /// The gateway in front of the configured `[[upstreams]]`.
    Gateway,
}

/// The application a file names (`upstreams` and no `app`: the gateway).
pub fn app(app: Option<&str>, has_upstreams: bool) -> Result<AppChoice, ConfigError> {
    // A file with upstreams and no `app` is a gateway's.
    let default_app = if has_upstreams { "gateway" } else { "demo" };
    match app.unwrap_or(default_app) {
        "demo" => Ok(AppChoice::Demo),
        "conformance" => Ok(AppChoice::Conformance),
        "gateway" => Ok(AppChoice::Gateway),
        other => Err(bad(keys::APP, format!("unknown app `{other}`; expected demo, conformance or gateway"))),
    }
}

/// The raw top-level keys validated here.
#[derive(Debug, Default)]
pub struct RawServer {
    /// `listen`
    pub listen: Option<String>,
    /// `metrics_listen`
    pub metrics_listen: Option<String>,
    /// `public_url`
    pub public_url: Option<String>,
    /// `events_redis`
    pub events_redis: Option<String>,
    /// `data_dir`
    pub data_dir: Option<PathBuf>,
    /// `store`
    pub store: Option<String>,
    /// `secret_file`
    pub secret_file: Option<PathBuf>,
}

/// Validated top-level keys.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// HTTP listen address.
    pub listen: SocketAddr,
    /// The private `/metrics` listener's address, when configured.
    pub metrics_listen: Option<SocketAddr>,
    /// Canonical resource URI.
    pub public_url: String,
    /// The Redis or Valkey URL of the event fan-out between instances, when configured.
    pub events_redis: Option<String>,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Store URL.
    pub store: String,
    /// Server secret file.
    pub secret_file: PathBuf,
}

/// Validates the listeners, URLs, data directory, store and secret file.
pub fn validate(raw: RawServer) -> Result<ServerSettings, ConfigError> {
    let listen: SocketAddr = raw
        .listen
        .as_deref()
        .unwrap_or("127.0.0.1:8080")
        .parse()
        .map_err(|_| bad(keys::LISTEN, "must be an IP address and port, e.g. 127.0.0.1:8080"))?;
    let metrics_listen = match raw.metrics_listen.as_deref() {
        None => None,
        Some(text) => {
            let address: SocketAddr = text
                .parse()
                .map_err(|_| bad(keys::METRICS_LISTEN, "must be an IP address and port, e.g. 127.0.0.1:9090"))?;
            if address == listen && address.port() != 0 {
                return Err(bad(keys::METRICS_LISTEN, "must differ from listen"));
            }
            Some(address)
        }
    };
    let public_url = raw.public_url.unwrap_or_else(|| format!("http://{listen}/mcp"));
    let events_redis = match raw.events_redis {
        None => None,
        // The URL may carry a password: the error names the key, never the value.
        Some(url) => match url::Url::parse(&url) {
            Ok(parsed) if matches!(parsed.scheme(), "redis" | "rediss") && parsed.host_str().is_some() => Some(url),
            _ => return Err(bad(keys::EVENTS_REDIS, "must be a redis:// or rediss:// URL with a host")),
        },
    };
    let parsed = url::Url::parse(&public_url).map_err(|_| bad(keys::PUBLIC_URL, "must be an absolute URL"))?;
    if parsed.fragment().is_some() || !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(keys::PUBLIC_URL, "must be an http(s) URL without a fragment"));
    }
    let data_dir = raw.data_dir.unwrap_or_else(|| PathBuf::from("palisade-data"));
    let store = raw.store.unwrap_or_else(|| format!("sqlite:{}", data_dir.join("palisade.db").display()));
    if !(store.starts_with("sqlite:") || store.starts_with("postgres://") || store.starts_with("postgresql://")) {
        return Err(bad(keys::STORE, "must be sqlite:<path> or postgres://…"));
    }
    let secret_file = raw.secret_file.unwrap_or_else(|| data_dir.join("server-secret"));
    Ok(ServerSettings { listen, metrics_listen, public_url, events_redis, data_dir, store, secret_file })
}
