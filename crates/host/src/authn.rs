//! Who a caller is: the authenticator `serve` runs with (bearer tokens from the configured
//! issuers and the development issuer, the principal from the environment on stdio, or none),
//! and the development issuer's authorization server.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context as _;
use palisade_apps::AppName;
use palisade_auth::authorization_server::{DevAuthorizationServer, DevAuthorizationSettings};
use palisade_auth::dev_issuer::DevIssuer;
use palisade_auth::{IssuerConfig, JwksSource, ResourceServerConfig, TokenVerifier};
use palisade_server::auth::{Authenticator, EnvironmentPrincipal};

use crate::settings::{AppChoice, AuthMode, ConfigError, Settings};

/// The built-in application a choice names (`None`: the gateway, whose registry comes from
/// its upstreams).
pub fn app_name(choice: AppChoice) -> Option<AppName> {
    match choice {
        AppChoice::Demo => Some(AppName::Demo),
        AppChoice::Conformance => Some(AppName::Conformance),
        AppChoice::Gateway => None,
    }
}

/// The scopes the server names in its metadata: the application's, or every scope the gateway's
/// upstreams are configured to require.
pub fn scopes_supported(settings: &Settings) -> Vec<String> {
    match (app_name(settings.app), &settings.gateway) {
        (Some(app), _) => app.scopes_supported().iter().map(|s| (*s).to_owned()).collect(),
        (None, Some(gateway)) => {
            let scopes: BTreeSet<&String> = gateway
                .upstreams
                .iter()
                .flat_map(|upstream| upstream.scopes.iter().chain(upstream.tool_scopes.values().flatten()))
                .collect();
            scopes.into_iter().cloned().collect()
        }
        (None, None) => Vec::new(),
    }
}

/// The development issuer's identifier: the server's own origin plus a fixed path.
pub fn dev_issuer_id(settings: &Settings) -> String {
    let origin = settings.public_url.split("/mcp").next().unwrap_or(&settings.public_url).trim_end_matches('/');
    format!("{origin}/dev-issuer")
}

/// The authenticator of `serve` (over stdio when `stdio`), announcing an unauthenticated one.
pub fn authenticator(settings: &Settings, stdio: bool) -> anyhow::Result<Authenticator> {
    Ok(match (&settings.auth.mode, stdio) {
        (AuthMode::None, _) => {
            eprintln!(
                "WARNING: palisade is running WITHOUT AUTHENTICATION; every caller is trusted. \
                 This mode is restricted to loopback and stdio."
            );
            Authenticator::UnauthenticatedLoopback
        }
        (AuthMode::Bearer, true) => environment_authenticator()?,
        (AuthMode::Bearer, false) => bearer_authenticator(settings)?,
    })
}

fn bearer_authenticator(settings: &Settings) -> anyhow::Result<Authenticator> {
    let auth = &settings.auth;
    let mut issuers: Vec<IssuerConfig> = auth
        .issuers
        .iter()
        .map(|issuer| IssuerConfig {
            issuer: issuer.issuer.clone(),
            jwks: JwksSource::Url(issuer.jwks_url.clone()),
            algorithms: issuer.algorithms.clone(),
        })
        .collect();
    if auth.dev_issuer {
        let dev = DevIssuer::load_or_create(&settings.data_dir, &dev_issuer_id(settings))
            .context("loading the dev issuer key")?;
        issuers.push(dev.issuer_config());
    }
    let url = url::Url::parse(&settings.public_url)?;
    let origin = url.origin().ascii_serialization();
    let metadata_url =
        format!("{origin}{}{}", palisade_auth::PROTECTED_RESOURCE_WELL_KNOWN, url.path().trim_end_matches('/'));
    let mut config = ResourceServerConfig::new(settings.public_url.clone(), metadata_url, issuers);
    config.leeway_secs = auth.leeway_secs;
    config.required_typ = auth.required_typ.clone();
    config.tenant_claim = auth.tenant_claim.clone();
    config.client_claim = auth.client_claim.clone();
    config.group_claims = settings.policies.group_claims.clone();
    config.cache_capacity = auth.token_cache_capacity;
    config.jwks_allow_loopback = auth.jwks_allow_loopback;
    config.jwks_allowed_networks = auth.jwks_allowed_networks.clone();
    config.jwks_proxy = auth.jwks_proxy.clone();
    config.scopes_supported = scopes_supported(settings);
    config.resource_name = Some("Palisade".into());
    let verifier = TokenVerifier::new(config).map_err(|e| ConfigError { key: "auth".into(), reason: e.to_string() })?;
    Ok(Authenticator::Bearer(Arc::new(verifier)))
}

/// stdio with authentication on: the principal comes from the environment (seed 004).
fn environment_authenticator() -> anyhow::Result<Authenticator> {
    let env = |key: &str| std::env::var(key).ok();
    let subject = env("PALISADE_PRINCIPAL_SUBJECT").ok_or_else(|| ConfigError {
        key: "PALISADE_PRINCIPAL_SUBJECT".into(),
        reason: "stdio with authentication needs the principal from the environment".into(),
    })?;
    let scopes: BTreeSet<String> =
        env("PALISADE_PRINCIPAL_SCOPES").unwrap_or_default().split_whitespace().map(str::to_owned).collect();
    Ok(Authenticator::Environment(EnvironmentPrincipal {
        subject,
        tenant: env("PALISADE_PRINCIPAL_TENANT"),
        client_id: env("PALISADE_PRINCIPAL_CLIENT"),
        scopes,
    }))
}

/// The development issuer's authorization server, when the dev issuer is on and `serve` runs
/// over HTTP with bearer authentication. Announced on stderr: it is for development only.
pub fn dev_authorization_server(
    settings: &Settings,
    authenticator: &Authenticator,
    stdio: bool,
) -> anyhow::Result<Option<Arc<DevAuthorizationServer>>> {
    if !settings.auth.dev_issuer || stdio || authenticator.verifier().is_none() {
        return Ok(None);
    }
    let issuer = DevIssuer::load_or_create(&settings.data_dir, &dev_issuer_id(settings))
        .context("loading the dev issuer key")?;
    let scopes = scopes_supported(settings);
    let mut as_settings = DevAuthorizationSettings::new(settings.public_url.clone(), scopes);
    let dev = &settings.auth.dev_authorization;
    as_settings.auto_approve = dev.auto_approve;
    as_settings.default_subject = dev.default_subject.clone();
    as_settings.default_tenant = dev.default_tenant.clone();
    as_settings.access_token_ttl_secs = dev.access_token_ttl_secs;
    as_settings.client_metadata_egress.allow_loopback = dev.client_metadata_allow_loopback;
    if let Some(path) = &dev.client_metadata_ca_file {
        let pem = std::fs::read(path).map_err(|e| ConfigError {
            key: "auth.dev_issuer.client_metadata_ca_file".into(),
            reason: format!("{}: {e}", path.display()),
        })?;
        as_settings.client_metadata_egress.extra_roots_pem = Some(pem);
    }
    let server = DevAuthorizationServer::new(issuer, as_settings)
        .map_err(|e| ConfigError { key: "auth.dev_issuer".into(), reason: e.to_string() })?;
    eprintln!(
        "WARNING: the DEVELOPMENT authorization server is on at {} (auth.dev_issuer): whoever reaches its \
         page can authorize as any subject. For local development only{}.",
        server.issuer(),
        if dev.auto_approve { "; auto_approve: every request is approved without a page" } else { "" }
    );
    Ok(Some(Arc::new(server)))
}
