//! What the settings say about themselves: [`Settings::summary`] (`palisade config check`) and
//! the paths no stdio upstream of the gateway may see.

use std::path::PathBuf;

use super::Settings;
use super::auth::AuthMode;
use super::keys;
use super::killswitch::KillSwitchMode;
use super::server::AppChoice;

impl Settings {
    /// Adds the configuration file, the data directory and every key file to the paths the
    /// gateway's stdio upstreams may never see (a grant over one is refused; one under a
    /// visible system directory is masked).
    pub fn protect_from_stdio_upstreams(&mut self, config_file: Option<&std::path::Path>) {
        let mut paths: Vec<PathBuf> = self.protected_option_paths().into_iter().filter_map(|(_, path)| path).collect();
        paths.extend(config_file.map(std::path::Path::to_path_buf));
        if let Some(sqlite) = self.store.strip_prefix("sqlite://").or_else(|| self.store.strip_prefix("sqlite:")) {
            let file = sqlite.split('?').next().unwrap_or_default();
            if !file.is_empty() && file != ":memory:" {
                paths.push(PathBuf::from(file));
            }
        }
        let Some(gateway) = self.gateway.as_mut() else { return };
        gateway.protect(paths.into_iter().map(|path| std::path::absolute(&path).unwrap_or(path)));
    }
}

/// How the gateway reaches one upstream: stdio (the command, its confinement and network) or
/// Streamable HTTP (the URL, the protocol era, the credential's kind), never a secret.
fn upstream_transport(upstream: &palisade_gateway::config::UpstreamSettings) -> String {
    use palisade_gateway::credentials::CredentialConfig;
    use palisade_gateway::upstream::ProtocolChoice;
    if let Some(stdio) = &upstream.stdio {
        let mut command = stdio.command.clone();
        for arg in &stdio.args {
            command.push(' ');
            command.push_str(arg);
        }
        return format!(
            "stdio, runs {command} (confinement {}, network {}, {} process{} at most)",
            stdio.confinement.as_str(),
            if stdio.network { "on" } else { "off" },
            stdio.max_processes,
            if stdio.max_processes == 1 { "" } else { "es" }
        );
    }
    let protocol = match upstream.protocol {
        ProtocolChoice::Auto => "2026-07-28, else the 2025 session wire",
        ProtocolChoice::Modern => "2026-07-28 only",
        ProtocolChoice::Legacy => "the 2025 session wire only",
    };
    let credential = match &upstream.credential {
        CredentialConfig::None => "no credential",
        CredentialConfig::Static { .. } => "static credential",
        CredentialConfig::ClientCredentials { .. } => "OAuth client credentials",
        CredentialConfig::TokenExchange { .. } => "OAuth token exchange",
        CredentialConfig::UserOAuth { .. } => "each person's own OAuth grant",
    };
    format!("Streamable HTTP {} ({protocol}, {credential})", without_password(upstream.url.as_str()))
}

/// `url` with any password in it replaced (a store or Redis URL may carry one).
fn without_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("redacted"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

impl Settings {
    /// What `palisade config check` prints: what will run, on which addresses, with which
    /// issuers and upstreams, one line each (never a secret: passwords in URLs and header
    /// values are left out).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let mut line = |label: &str, value: String| out.push_str(&format!("{:<20}{value}\n", format!("{label}:")));
        let app = match self.app {
            AppChoice::Demo => "demo (the tea shop)",
            AppChoice::Conformance => "conformance (the fixture of the official conformance suite)",
            AppChoice::Gateway => "gateway",
        };
        let app = match &self.gateway {
            Some(gateway) => format!(
                "{app}, fronting {} upstream{}",
                gateway.upstreams.len(),
                if gateway.upstreams.len() == 1 { "" } else { "s" }
            ),
            None => app.to_owned(),
        };
        line("app", app);
        line("listen", format!("http://{} (public URL {})", self.listen, self.public_url));
        line("metrics", self.metrics_listen.map_or("not served".to_owned(), |a| format!("http://{a}/metrics")));
        line("store", without_password(&self.store));
        line("data directory", self.data_dir.display().to_string());
        let auth = match self.auth.mode {
            AuthMode::None => "none (loopback and stdio only)".to_owned(),
            AuthMode::Bearer if self.auth.issuers.is_empty() => "bearer".to_owned(),
            AuthMode::Bearer => format!(
                "bearer, issuers {}",
                self.auth.issuers.iter().map(|issuer| issuer.issuer.as_str()).collect::<Vec<_>>().join(", ")
            ),
        };
        line("authentication", auth);
        line("development issuer", self.auth.dev_issuer_why.to_owned());
        let killswitch = match &self.killswitch.mode {
            KillSwitchMode::Off => "off".to_owned(),
            KillSwitchMode::Dev { dir } => format!("development authority in-process ({})", dir.display()),
            KillSwitchMode::Authority(authority) => format!("authority at {}", authority.authority_url),
        };
        line("kill switch", killswitch);
        line(
            "audit",
            format!(
                "segment {}, checkpoints every {} s",
                self.audit.segment_dir.display(),
                self.audit.checkpoint_interval_secs
            ),
        );
        line("session wire", if self.legacy.enabled { self.legacy.versions.join(", ") } else { "off".to_owned() });
        line("delegation", if self.delegation.is_some() { "on" } else { "off" }.to_owned());
        line(
            "policies",
            if self.policies.enabled() { format!("{} file(s)", self.policies.files.len()) } else { "off".to_owned() },
        );
        let rules = self.rate_limits.rules.len();
        let rate_limits = match (&self.rate_limits.shared, rules) {
            (_, 0) => "none".to_owned(),
            (None, _) => format!("{rules} rule(s), counted by each instance"),
            (Some(shared), _) => format!(
                "{rules} rule(s), shared through Redis (URL not shown), {}",
                match shared.on_failure {
                    palisade_server::rate_limits::OnStoreFailure::Refuse => "refusing while it does not answer",
                    palisade_server::rate_limits::OnStoreFailure::Local => "counted locally while it does not answer",
                }
            ),
        };
        line("rate limits", rate_limits);
        let telemetry = match &self.telemetry {
            None => "off".to_owned(),
            Some(telemetry) => format!(
                "traces to {}{}",
                telemetry.traces_url,
                if telemetry.headers.0.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> = telemetry.headers.0.iter().map(|(name, _)| name.as_str()).collect();
                    format!(" with headers {} (values not shown)", names.join(", "))
                }
            ),
        };
        line("telemetry", telemetry);
        if let Some(events) = &self.events_redis {
            line("events", without_password(events));
        }
        if let Some(gateway) = &self.gateway {
            for upstream in &gateway.upstreams {
                let prefix = match &upstream.prefix {
                    Some(prefix) => format!("names {prefix}{}…", gateway.separator.as_str()),
                    None => "unprefixed".to_owned(),
                };
                line("upstream", format!("{}: {}, {prefix}", upstream.id, upstream_transport(upstream)));
            }
            match &gateway.web {
                Some(web) => {
                    let review = if web.review_token.is_some() { "review page on" } else { "review page off" };
                    let sign_in = web.sign_in.as_ref().map_or(String::new(), |s| format!(", sign-in at {}", s.issuer));
                    line("web pages", format!("https://{} as {} ({review}{sign_in})", web.listen, web.public_url));
                }
                None => line("web pages", "off (no [web] section)".to_owned()),
            }
        }
        out
    }

    /// The value of every option marked `protected` in the option table, by key (`None`: not set in
    /// this configuration). A test holds this list to the option table, so a new secret-file
    /// option cannot be left out of what stdio upstreams are kept from.
    pub fn protected_option_paths(&self) -> Vec<(&'static str, Option<PathBuf>)> {
        let authority = match &self.killswitch.mode {
            KillSwitchMode::Authority(authority) => Some(authority.as_ref()),
            KillSwitchMode::Off | KillSwitchMode::Dev { .. } => None,
        };
        vec![
            (keys::DATA_DIR, Some(self.data_dir.clone())),
            (keys::SECRET_FILE, Some(self.secret_file.clone())),
            (keys::HANDLES_SUBJECT_KEY_FILE, Some(self.handles.subject_key_file.clone())),
            (keys::AUDIT_SEGMENT_DIR, Some(self.audit.segment_dir.clone())),
            (keys::KILLSWITCH_CLIENT_KEY, authority.map(|a| a.client_key.clone())),
            (keys::KILLSWITCH_TARGET_KEY_FILE, authority.map(|a| a.target_key_file.clone())),
            (keys::KILLSWITCH_AUTHORITY_DB, authority.and_then(|a| a.authority_db.clone())),
            (keys::TELEMETRY_OTLP_HEADERS_FILE, self.telemetry_headers_file.clone()),
        ]
    }
}
