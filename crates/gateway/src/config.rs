//! The gateway's configuration: `[gateway]`, `[pins]`, `[[upstreams]]` and `[web]` as written in
//! TOML ([`RawGateway`], [`RawPins`], [`RawUpstream`], [`RawWeb`]), validated once into
//! [`GatewaySettings`], which cannot be invalid. A bad value is reported with the dotted key that holds it
//! (`upstreams[1].credential.token_url`); secrets are named by where they come from, never shown.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

pub use crate::config_error::GatewayConfigError;
use crate::config_error::bad;
pub use crate::credentials::settings::RawCredential;
use crate::credentials::{CredentialConfig, SecretSource};
use crate::names::Separator;
use crate::pins::settings::validate_pins;
pub use crate::pins::settings::{PinSettings, RawPins, RawReviewer};
use crate::upstream::settings::validate_upstream;
pub use crate::upstream::settings::{
    ClientRequests, Confinement, Grant, ProcessLimits, RESERVED_ENV, RawClientRequests, RawGrant, RawLimits,
    RawUpstream, SandboxSettings, StdioSettings, UpstreamSettings,
};
use crate::user_oauth::{UpstreamOAuth, UserOAuth, UserOAuthError, UserOAuthSettings};
pub use crate::web::settings::{RawWeb, WebSettings, validate_web};
use palisade_auth::egress::{EgressPolicy, parse_network, parse_proxy};
use palisade_base::clock::Clock;
use palisade_server::secret::ServerSecret;
use palisade_store::Store;

/// `[gateway]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGateway {
    /// Between prefix and upstream name: `_` (default), `__` or `.`.
    pub separator: Option<String>,
    /// The first uid of the sandboxed stdio processes when the gateway runs as root: each
    /// running process gets a uid of its own from here on. Default 600000.
    pub sandbox_uid_base: Option<u32>,
    /// The gid of every sandboxed stdio process when the gateway runs as root. Default 65534.
    pub sandbox_gid: Option<u32>,
    /// Development only: the gateway's OAuth fetches (upstream and authorization-server
    /// metadata, token and registration endpoints, the sign-in provider) may reach loopback
    /// addresses, over plain http there. Default false.
    pub egress_allow_loopback: Option<bool>,
    /// CIDR networks those fetches may reach although they are private or otherwise special
    /// (deliberately internal authorization servers).
    #[serde(default)]
    pub egress_allowed_networks: Vec<String>,
    /// An HTTP CONNECT proxy (`http://host:port`) for those fetches; it resolves names itself
    /// and must refuse internal destinations.
    pub egress_proxy: Option<String>,
}

/// The validated gateway settings.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// Between prefix and upstream name.
    pub separator: Separator,
    /// Pin re-checking and review.
    pub pins: PinSettings,
    /// The upstreams, in configuration order.
    pub upstreams: Vec<UpstreamSettings>,
    /// Who the sandboxed stdio processes run as.
    pub sandbox: SandboxSettings,
    /// Files and directories no stdio process may see: every secret file of the configuration
    /// (the embedding program adds its configuration file, data directory and key files).
    pub protected_paths: Vec<PathBuf>,
    /// The browser pages' listener (`[web]`), when configured.
    pub web: Option<WebSettings>,
    /// How the gateway fetches URLs that servers and documents supply (the per-user OAuth
    /// client's discovery, token and registration requests).
    pub egress: EgressPolicy,
}

/// Validates the sections (`web`: the `[web]` table, when the file has one). No upstreams is an
/// error only for `palisade gateway` (the caller decides); here it is allowed.
pub fn validate(
    gateway: RawGateway,
    pins: RawPins,
    upstreams: Vec<RawUpstream>,
    web: Option<RawWeb>,
) -> Result<GatewaySettings, GatewayConfigError> {
    let separator = match gateway.separator.as_deref() {
        None => Separator::Underscore,
        Some(text) => {
            Separator::parse(text).ok_or_else(|| bad("gateway.separator", "must be \"_\", \"__\" or \".\""))?
        }
    };
    let pins = validate_pins(pins)?;
    let sandbox = SandboxSettings {
        uid_base: gateway.sandbox_uid_base.unwrap_or(600_000),
        gid: gateway.sandbox_gid.unwrap_or(65_534),
    };
    if !(1_000..=4_000_000_000).contains(&sandbox.uid_base) {
        return Err(bad("gateway.sandbox_uid_base", "must be between 1000 and 4000000000"));
    }
    if sandbox.gid == 0 {
        return Err(bad("gateway.sandbox_gid", "must not be 0"));
    }
    let mut ids = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    let mut unprefixed = 0;
    let mut out = Vec::with_capacity(upstreams.len());
    for (index, raw) in upstreams.into_iter().enumerate() {
        let upstream = validate_upstream(index, raw)?;
        if !ids.insert(upstream.id.clone()) {
            return Err(bad(format!("upstreams[{index}].id"), "duplicate upstream id"));
        }
        match &upstream.prefix {
            None => {
                unprefixed += 1;
                if unprefixed > 1 {
                    return Err(bad(format!("upstreams[{index}].prefix"), "at most one upstream may be unprefixed"));
                }
            }
            Some(prefix) => {
                if !prefixes.insert(prefix.clone()) {
                    return Err(bad(format!("upstreams[{index}].prefix"), "duplicate prefix"));
                }
            }
        }
        out.push(upstream);
    }
    let mut protected_paths = Vec::new();
    for upstream in &out {
        if let CredentialConfig::Static { secret: SecretSource::File(path), .. }
        | CredentialConfig::ClientCredentials { client_secret: SecretSource::File(path), .. }
        | CredentialConfig::TokenExchange { client_secret: SecretSource::File(path), .. } = &upstream.credential
        {
            protected_paths.push(path.clone());
        }
        if let Some(stdio) = &upstream.stdio {
            protected_paths.extend(stdio.env_files.values().cloned());
        }
    }
    let web = web.map(validate_web).transpose()?;
    if let Some(web) = &web {
        protected_paths.push(web.tls_key_file.clone());
        protected_paths.extend(web.operators_file.clone());
        for secret in [&web.review_token, &web.sign_in.as_ref().and_then(|sign_in| sign_in.client_secret.clone())] {
            if let Some(SecretSource::File(path)) = secret {
                protected_paths.push(path.clone());
            }
        }
    }
    if let Some(index) =
        out.iter().position(|upstream| matches!(upstream.credential, CredentialConfig::UserOAuth { .. }))
        && web.as_ref().is_none_or(|web| web.sign_in.is_none())
    {
        return Err(bad(
            format!("upstreams[{index}].credential.kind"),
            "user_oauth needs the gateway's web surface with a sign-in provider ([web] with sign_in_issuer and sign_in_client_id)",
        ));
    }
    let egress = validate_egress(&gateway)?;
    let mut settings =
        GatewaySettings { separator, pins, upstreams: out, sandbox, protected_paths: Vec::new(), web, egress };
    settings.protect(protected_paths);
    Ok(settings)
}

impl GatewaySettings {
    /// Looks every stdio upstream's bare command up on `path` (the running gateway's `PATH`)
    /// instead of this process's, so that what is resolved, hashed and pinned is what that
    /// gateway runs.
    pub fn set_search_path(&mut self, path: Option<&str>) {
        for upstream in &mut self.upstreams {
            if let Some(stdio) = upstream.stdio.as_mut() {
                stdio.search_path = path.map(str::to_owned);
            }
        }
    }

    /// Adds paths no stdio upstream may see or name (the runtime adds its own secret files,
    /// data and audit directories and configuration file to the gateway's).
    pub fn protect(&mut self, paths: impl IntoIterator<Item = PathBuf>) {
        for path in paths {
            if !self.protected_paths.contains(&path) {
                self.protected_paths.push(path);
            }
        }
        for upstream in &mut self.upstreams {
            if let Some(stdio) = upstream.stdio.as_mut() {
                stdio.protected.clone_from(&self.protected_paths);
            }
        }
    }
}

/// The egress policy of the gateway's own fetches: public addresses only, https only, unless
/// the development flag or the allow-list says otherwise.
fn validate_egress(gateway: &RawGateway) -> Result<EgressPolicy, GatewayConfigError> {
    let allowed_networks = gateway
        .egress_allowed_networks
        .iter()
        .map(|cidr| {
            parse_network(cidr)
                .ok_or_else(|| bad("gateway.egress_allowed_networks", format!("{cidr:?} is not a CIDR network")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let proxy = match gateway.egress_proxy.as_deref() {
        None => None,
        Some(text) => Some(
            parse_proxy(text)
                .ok_or_else(|| bad("gateway.egress_proxy", "must be an http(s) URL with a host and no credentials"))?,
        ),
    };
    Ok(EgressPolicy {
        allow_loopback: gateway.egress_allow_loopback.unwrap_or(false),
        allowed_networks,
        proxy,
        ..EgressPolicy::default()
    })
}

impl UserOAuth {
    /// The client for `gateway`'s `user_oauth` upstreams (`None` when it has none): the web
    /// surface's public URL and sign-in provider, the gateway's egress policy, and per upstream
    /// its URL as the resource and its scopes (the step-up maximum is `scopes ∪ max_scopes`).
    pub fn for_gateway(
        gateway: &GatewaySettings,
        store: Arc<dyn Store>,
        secret: &ServerSecret,
        clock: Arc<dyn Clock>,
    ) -> Result<Option<Arc<Self>>, UserOAuthError> {
        let upstreams: Vec<UpstreamOAuth> = gateway
            .upstreams
            .iter()
            .filter_map(|upstream| match &upstream.credential {
                CredentialConfig::UserOAuth { scopes, max_scopes } => {
                    let scopes: BTreeSet<String> = scopes.iter().cloned().collect();
                    let mut max = scopes.clone();
                    max.extend(max_scopes.iter().cloned());
                    Some(UpstreamOAuth {
                        id: upstream.id.clone(),
                        resource: upstream.url.clone(),
                        scopes,
                        max_scopes: max,
                    })
                }
                _ => None,
            })
            .collect();
        if upstreams.is_empty() {
            return Ok(None);
        }
        let web = gateway.web.as_ref().ok_or(UserOAuthError::Settings("user_oauth needs the [web] surface"))?;
        let sign_in = web.sign_in.clone().ok_or(UserOAuthError::Settings("user_oauth needs [web] sign_in_issuer"))?;
        let settings = UserOAuthSettings {
            public_url: web.public_url.clone(),
            sign_in,
            egress: gateway.egress.clone(),
            flow_ttl_secs: web.flow_ttl_secs,
            client_name: "Palisade gateway".into(),
        };
        Self::new(settings, upstreams, store, secret, clock).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstreams(text: &str) -> Result<GatewaySettings, GatewayConfigError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            gateway: RawGateway,
            #[serde(default)]
            pins: RawPins,
            #[serde(default)]
            upstreams: Vec<RawUpstream>,
            web: Option<RawWeb>,
        }
        let file: File = toml::from_str(text).unwrap();
        validate(file.gateway, file.pins, file.upstreams, file.web)
    }

    fn key_of(text: &str) -> String {
        upstreams(text).unwrap_err().key
    }

    #[test]
    fn a_two_upstream_file_validates() {
        let settings = upstreams(
            r#"
            [[upstreams]]
            id = "files"
            url = "http://127.0.0.1:9001/mcp"
            [[upstreams]]
            id = "tickets"
            url = "https://tickets.example/mcp"
            prefix = ""
            confirm = ["close"]
            [upstreams.credential]
            kind = "client_credentials"
            token_url = "https://as.example/token"
            client_id = "gw"
            client_secret_env = "TICKETS_SECRET"
            scopes = ["tickets:read"]
            max_scopes = ["tickets:read", "tickets:write"]
            "#,
        )
        .unwrap();
        assert_eq!(settings.upstreams[0].prefix.as_deref(), Some("files"));
        assert_eq!(settings.upstreams[1].prefix, None);
        assert!(matches!(settings.upstreams[1].credential, CredentialConfig::ClientCredentials { .. }));
        assert_eq!(settings.separator, Separator::Underscore);
    }

    #[test]
    fn client_requests_default_to_elicitation_only_and_roots_are_checked() {
        let one = |extra: &str| format!("[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n{extra}");
        let plain = upstreams(&one("")).unwrap();
        let asks = &plain.upstreams[0].client_requests;
        assert!(asks.elicitation && !asks.sampling && asks.roots.is_empty(), "{asks:?}");
        let set = upstreams(&one(
            "[upstreams.client_requests]\nelicitation = false\nsampling = true\nroots = [\"file:///srv/reports\"]",
        ))
        .unwrap();
        let asks = &set.upstreams[0].client_requests;
        assert!(!asks.elicitation && asks.sampling, "{asks:?}");
        assert_eq!(asks.roots.iter().map(url::Url::as_str).collect::<Vec<_>>(), ["file:///srv/reports"]);
        for bad in ["https://x.example/", "file://host/x", "relative", "file:///x?y", "file:///a\", \"file:///a"] {
            // The last: one root listed twice.
            let text = one(&format!("[upstreams.client_requests]\nroots = [\"{bad}\"]"));
            assert_eq!(key_of(&text), "upstreams[0].client_requests.roots", "{bad}");
        }
        let both = one("[upstreams.client_requests]\nroots = [\"file:///srv\"]\ncaller_roots = true");
        assert_eq!(key_of(&both), "upstreams[0].client_requests.caller_roots");
        let relayed = upstreams(&one("[upstreams.client_requests]\ncaller_roots = true")).unwrap();
        assert!(relayed.upstreams[0].client_requests.caller_roots);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let one = |extra: &str| format!("[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n{extra}");
        assert_eq!(key_of(&one("prefix = \"A_B\"")), "upstreams[0].prefix");
        assert_eq!(key_of(&one("protocol = \"2024\"")), "upstreams[0].protocol");
        assert_eq!(key_of(&one("request_timeout_secs = 0")), "upstreams[0].request_timeout_secs");
        assert_eq!(key_of(&one("max_response_bytes = 1")), "upstreams[0].max_response_bytes");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"magic\"")), "upstreams[0].credential.kind");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"static\"")), "upstreams[0].credential.secret_file");
        assert_eq!(
            key_of(&one("[upstreams.credential]\nkind = \"none\"\ntoken_url = \"https://x\"")),
            "upstreams[0].credential.token_url"
        );
        assert_eq!(
            key_of(&one(
                "[upstreams.credential]\nkind = \"client_credentials\"\ntoken_url = \"http://as.example/t\"\nclient_id = \"x\"\nclient_secret_env = \"S\""
            )),
            "upstreams[0].credential.token_url"
        );
        assert_eq!(key_of("[[upstreams]]\nid = \"Bad_Id\"\nurl = \"http://h/mcp\""), "upstreams[0].id");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\nurl = \"http://u:p@h/mcp\""), "upstreams[0].url");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\nurl = \"ftp://h/mcp\""), "upstreams[0].url");
        let two = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\nprefix = \"\"\n[[upstreams]]\nid = \"b\"\nurl = \"http://h/mcp\"\nprefix = \"\"";
        assert_eq!(key_of(two), "upstreams[1].prefix");
        let dup = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\nprefix = \"b\"";
        assert_eq!(key_of(dup), "upstreams[1].id");
        assert_eq!(key_of("[gateway]\nseparator = \"-\""), "gateway.separator");
        assert_eq!(key_of("[pins]\nrequire_signed = true"), "pins.require_signed");
        assert_eq!(key_of("[pins]\nrelist_secs = 0"), "pins.relist_secs");
    }

    #[test]
    fn a_stdio_upstream_validates_with_its_defaults() {
        let settings = upstreams(
            r#"
            [[upstreams]]
            id = "files"
            command = "node"
            args = ["server.js", "/srv/data"]
            env = ["API_KEY"]
            env_files = { TOKEN = "/run/secrets/token" }
            cwd = "/srv/data"
            grants = [{ path = "/srv/data" }, { path = "/srv/out", rw = true }]
            "#,
        )
        .unwrap();
        let upstream = &settings.upstreams[0];
        assert_eq!(upstream.url.as_str(), "stdio:files");
        let stdio = upstream.stdio.as_ref().unwrap();
        assert_eq!(stdio.confinement, Confinement::Bubblewrap, "confined unless the operator says otherwise");
        assert!(!stdio.network && !stdio.shared);
        assert_eq!(stdio.grants[1], Grant { path: "/srv/out".into(), rw: true });
        assert!(!stdio.grants[0].rw, "read-only unless marked rw");
        assert_eq!(stdio.limits.memory_bytes, 4096 * 1024 * 1024);
        assert_eq!(settings.protected_paths, vec![PathBuf::from("/run/secrets/token")], "env_files are secrets");
        assert_eq!(settings.sandbox, SandboxSettings { uid_base: 600_000, gid: 65_534 });
    }

    #[test]
    fn each_bad_stdio_value_names_its_key() {
        let one = |extra: &str| format!("[[upstreams]]\nid = \"a\"\ncommand = \"/usr/bin/env\"\n{extra}");
        assert_eq!(key_of(&one("url = \"http://h/mcp\"")), "upstreams[0].command");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\""), "upstreams[0].url");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\ncommand = \"bin/x\""), "upstreams[0].command");
        assert_eq!(key_of("[[upstreams]]\nid = \"a\"\ncommand = \"/usr/../bin/x\""), "upstreams[0].command");
        assert_eq!(key_of(&one("env = [\"A-B\"]")), "upstreams[0].env[0]");
        assert_eq!(key_of(&one("env = [\"PATH\"]")), "upstreams[0].env[0]");
        assert_eq!(key_of(&one("env = [\"A\", \"A\"]")), "upstreams[0].env[1]");
        assert_eq!(key_of(&one("env = [\"A\"]\nenv_files = { A = \"/x\" }")), "upstreams[0].env_files.A");
        assert_eq!(key_of(&one("env_files = { A = \"rel\" }")), "upstreams[0].env_files.A");
        assert_eq!(key_of(&one("grants = [{ path = \"/\" }]")), "upstreams[0].grants[0].path");
        assert_eq!(key_of(&one("grants = [{ path = \"/a/../etc\" }]")), "upstreams[0].grants[0].path");
        assert_eq!(
            key_of(&one("grants = [{ path = \"/a\" }, { path = \"/a\", rw = true }]")),
            "upstreams[0].grants[1].path"
        );
        assert_eq!(key_of(&one("cwd = \"/srv\"")), "upstreams[0].cwd");
        assert_eq!(key_of(&one("confinement = \"docker\"")), "upstreams[0].confinement");
        assert_eq!(key_of(&one("max_processes = 0")), "upstreams[0].max_processes");
        assert_eq!(key_of(&one("[upstreams.limits]\nmemory_mib = 1")), "upstreams[0].limits.memory_mib");
        assert_eq!(key_of(&one("[upstreams.credential]\nkind = \"static\"")), "upstreams[0].credential.kind");
        let http = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n";
        assert_eq!(key_of(&format!("{http}grants = [{{ path = \"/a\" }}]")), "upstreams[0].grants");
        assert_eq!(key_of(&format!("{http}network = true")), "upstreams[0].network");
        assert_eq!(key_of("[gateway]\nsandbox_uid_base = 0"), "gateway.sandbox_uid_base");
    }

    #[test]
    fn errors_never_show_a_secret_value() {
        let text = "[[upstreams]]\nid = \"a\"\nurl = \"http://h/mcp\"\n[upstreams.credential]\nkind = \"static\"\nsecret_env = \"\"";
        let error = upstreams(text).unwrap_err();
        assert_eq!(error.key, "upstreams[0].credential.secret_env");
    }

    const WEB: &str = "[web]\npublic_url = \"https://127.0.0.1:8443/\"\ntls_cert_file = \"/etc/palisade/web.crt\"\ntls_key_file = \"/etc/palisade/web.key\"\n";

    #[test]
    fn a_web_table_validates_loopback_by_default() {
        let settings = upstreams(&format!("{WEB}review_token_file = \"/etc/palisade/review-token\"\n")).unwrap();
        let web = settings.web.unwrap();
        assert_eq!(web.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(web.origin(), "https://127.0.0.1:8443");
        assert_eq!(web.url("/review"), "https://127.0.0.1:8443/review");
        assert_eq!(web.review_token, Some(SecretSource::File("/etc/palisade/review-token".into())));
        assert!(settings.protected_paths.contains(&PathBuf::from("/etc/palisade/web.key")), "the TLS key is a secret");
        assert!(settings.protected_paths.contains(&PathBuf::from("/etc/palisade/review-token")));
        let console = upstreams(&format!("{WEB}operators_file = \"/etc/palisade/operators\"\n")).unwrap();
        assert!(console.protected_paths.contains(&PathBuf::from("/etc/palisade/operators")), "the operators' tokens");
        assert_eq!(console.web.as_ref().unwrap().console_sample_secs, 10);
        assert!(!settings.protected_paths.contains(&PathBuf::from("/etc/palisade/web.crt")));
        assert!(upstreams("").unwrap().web.is_none(), "no [web]: no listener");
        let env = upstreams(&format!("{WEB}review_token_env = \"REVIEW_TOKEN\"\n")).unwrap();
        assert_eq!(env.web.unwrap().review_token, Some(SecretSource::Env("REVIEW_TOKEN".into())));
        let remote = upstreams(&format!("{WEB}listen = \"0.0.0.0:8443\"\nallow_remote = true\n")).unwrap();
        assert_eq!(remote.web.unwrap().listen, "0.0.0.0:8443".parse().unwrap());
        assert!(upstreams(&format!("{WEB}listen = \"[::1]:9443\"\n")).is_ok(), "IPv6 loopback");
    }

    #[test]
    fn each_bad_web_value_names_its_key() {
        for (extra, key) in [
            ("listen = \"10.0.0.1:8443\"", "web.listen"),
            ("listen = \"0.0.0.0:8443\"\nallow_remote = false", "web.listen"),
            ("listen = \"localhost:8443\"", "web.listen"),
            ("review_token_env = \"\"", "web.review_token_env"),
            ("review_token_file = \"\"", "web.review_token_file"),
            ("review_token_file = \"/t\"\nreview_token_env = \"T\"", "web.review_token_file"),
            ("operators_file = \"\"", "web.operators_file"),
            ("console_sample_secs = 0", "web.console_sample_secs"),
            ("console_sample_secs = 301", "web.console_sample_secs"),
        ] {
            assert_eq!(key_of(&format!("{WEB}{extra}\n")), key, "{extra}");
        }
        let with_url =
            |url: &str| format!("[web]\npublic_url = \"{url}\"\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n");
        for url in [
            "http://127.0.0.1:8443/",
            "https://127.0.0.1:8443/review",
            "https://user@127.0.0.1:8443/",
            "https://127.0.0.1:8443/?a=b",
            "https://127.0.0.1:8443/#top",
            "not a url",
        ] {
            assert_eq!(key_of(&with_url(url)), "web.public_url", "{url}");
        }
        assert_eq!(key_of("[web]\ntls_cert_file = \"/c\"\ntls_key_file = \"/k\"\n"), "web.public_url");
        assert_eq!(key_of("[web]\npublic_url = \"https://h/\"\ntls_key_file = \"/k\"\n"), "web.tls_cert_file");
        assert_eq!(key_of("[web]\npublic_url = \"https://h/\"\ntls_cert_file = \"/c\"\n"), "web.tls_key_file");
    }

    #[test]
    fn per_tool_rules_naming_no_listed_tool_are_reported() {
        let text = "[[upstreams]]\nid = \"ops\"\nurl = \"https://ops.example/mcp\"\ndeny = [\"printEnv\", \"get-env\"]\n\
                    tasks = [\"slow\"]\nno_confirm = [\"x\"]\n";
        let settings = upstreams(text).unwrap();
        let upstream = &settings.upstreams[0];
        let unmatched = upstream.unmatched_tool_rules(["get-env", "slow"]);
        assert_eq!(unmatched.len(), 2, "{unmatched:?}");
        assert!(unmatched[0].starts_with("deny names \"printEnv\""), "{unmatched:?}");
        assert!(unmatched[1].starts_with("no_confirm names \"x\""), "{unmatched:?}");
        assert!(upstream.unmatched_tool_rules(["get-env", "slow", "printEnv", "x"]).is_empty());
    }

    #[test]
    fn launchers_that_download_the_server_at_start_are_refused_with_what_to_install() {
        let entry = |command: &str, args: &str| {
            format!("[[upstreams]]\nid = \"files\"\ncommand = \"{command}\"\nargs = [{args}]\n")
        };
        for (command, args) in [
            ("npx", "\"-y\", \"@modelcontextprotocol/server-filesystem\", \"/srv\""),
            ("/usr/local/bin/npx", "\"@modelcontextprotocol/server-filesystem\""),
            ("npm", "\"exec\", \"server\""),
            ("pnpm", "\"dlx\", \"server\""),
            ("uvx", "\"mcp-server-fetch\""),
            ("pipx", "\"run\", \"mcp-server-fetch\""),
            ("uv", "\"tool\", \"run\", \"mcp-server-fetch\""),
            ("bunx", "\"server\""),
        ] {
            let error = upstreams(&entry(command, args)).unwrap_err();
            assert_eq!(error.key, "upstreams[0].command", "{command} {args}");
            assert!(error.reason.contains("downloads the server each time it starts"), "{error}");
            assert!(error.reason.contains("install the server once"), "{error}");
        }
        for (command, args) in [
            ("/opt/mcp/bin/mcp-server-filesystem", "\"/srv\""),
            ("npm", "\"run\", \"start\""),
            ("uv", "\"run\", \"server.py\""),
        ] {
            assert!(upstreams(&entry(command, args)).is_ok(), "{command} {args}");
        }
    }
}
