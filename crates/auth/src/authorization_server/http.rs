//! The authorization server's plain values: its settings and start error, and the HTTP request,
//! response and audit event it exchanges with the server crate.

use std::net::IpAddr;

use palisade_base::html::escape;
use serde_json::{Value, json};

use crate::egress::{EgressError, EgressPolicy};

/// What the authorization server is configured with.
#[derive(Debug, Clone)]
pub struct DevAuthorizationSettings {
    /// The canonical resource URI: the only acceptable `resource`, and every token's `aud`.
    pub resource: String,
    /// Scopes that may be requested and granted.
    pub scopes_supported: Vec<String>,
    /// Scopes granted when a client asks for none.
    pub default_scopes: Vec<String>,
    /// Subject pre-filled on the page (and granted by `auto_approve`).
    pub default_subject: String,
    /// Tenant pre-filled on the page (and granted by `auto_approve`).
    pub default_tenant: String,
    /// Skip the page and approve with the defaults (tests and scripts; loopback only).
    pub auto_approve: bool,
    /// Lifetime of access tokens. Default 300 s.
    pub access_token_ttl_secs: u64,
    /// Lifetime of refresh tokens. Default 8 h.
    pub refresh_token_ttl_secs: u64,
    /// Lifetime of authorization codes. Default 60 s.
    pub code_ttl_secs: u64,
    /// How client metadata documents are fetched.
    pub client_metadata_egress: EgressPolicy,
}

impl DevAuthorizationSettings {
    /// Settings for `resource` with the defaults: page shown, 5 min access tokens, 8 h refresh
    /// tokens, 60 s codes, client metadata documents of at most 5 KiB from public https hosts.
    pub fn new(resource: impl Into<String>, scopes_supported: Vec<String>) -> Self {
        Self {
            resource: resource.into(),
            default_scopes: scopes_supported.first().cloned().into_iter().collect(),
            scopes_supported,
            default_subject: "alice".into(),
            default_tenant: "acme".into(),
            auto_approve: false,
            access_token_ttl_secs: 300,
            refresh_token_ttl_secs: 8 * 3600,
            code_ttl_secs: 60,
            client_metadata_egress: EgressPolicy { max_body_bytes: 5 * 1024, ..EgressPolicy::default() },
        }
    }
}

/// Why the authorization server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DevAuthorizationError {
    /// The issuer identifier is not an absolute URL.
    #[error("the issuer is not an absolute URL")]
    Issuer,
    /// The client metadata egress guard could not be built.
    #[error("client metadata fetches: {0}")]
    Egress(EgressError),
}

/// One HTTP request, as much of it as the authorization server reads.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The raw query string, if any.
    pub query: Option<&'a str>,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The `Cookie` header.
    pub cookie: Option<&'a str>,
    /// The body.
    pub body: &'a [u8],
    /// The peer's address (registrations are limited per source; `None`: one shared source).
    pub peer: Option<IpAddr>,
}

/// What the audit record of one answer says: the server that mounts this one writes it
/// (digesting every identifier; see `palisade_server::surface_audit`). Answers of the metadata
/// and JWKS paths, and the consent page itself (nothing decided yet), carry none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditEvent {
    /// `register`, `authorize`, `consent` or `token`.
    pub endpoint: &'static str,
    /// A grant (`true`: a client registered, a code or a token issued) or a refusal.
    pub granted: bool,
    /// The stable code: of a grant (`registered`, `code_issued`, `issued`), or of a
    /// refusal (the OAuth error code, `rate_limited`, `csrf`, `redirect_uri_unregistered`, …).
    pub reason: &'static str,
    /// The client the answer concerns.
    pub client_id: Option<String>,
    /// The subject and tenant granted (a code or a token).
    pub subject: Option<String>,
    /// See `subject`.
    pub tenant: Option<String>,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// Fixed words (`grant=refresh_token`).
    pub detail: Option<&'static str>,
}

/// One HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Headers, in order.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// What the audit record of this answer says (`None`: nothing to record).
    pub audit: Option<AuditEvent>,
}

impl HttpResponse {
    pub(super) fn json(status: u16, value: &Value) -> Self {
        Self {
            audit: None,
            status,
            headers: vec![
                ("content-type", "application/json".into()),
                ("cache-control", "no-store".into()),
                ("pragma", "no-cache".into()),
            ],
            body: value.to_string().into_bytes(),
        }
    }

    pub(super) fn oauth_error(status: u16, error: &'static str, description: &str) -> Self {
        Self::json(status, &json!({ "error": error, "error_description": description })).because(error)
    }

    pub(super) fn redirect(status: u16, location: String) -> Self {
        Self {
            status,
            headers: vec![("location", location), ("cache-control", "no-store".into())],
            body: Vec::new(),
            audit: None,
        }
    }

    /// This answer as a refusal for `reason` (the record's stable code).
    pub(super) fn because(mut self, reason: &'static str) -> Self {
        self.audit = Some(AuditEvent { reason, ..AuditEvent::default() });
        self
    }

    /// This answer as the grant `event`.
    pub(super) fn granting(mut self, event: AuditEvent) -> Self {
        self.audit = Some(AuditEvent { granted: true, ..event });
        self
    }

    /// An HTML page that cannot be framed, runs no script and loads nothing.
    pub(super) fn page(status: u16, html: String, form_targets: &str, cookie: Option<String>) -> Self {
        let mut headers = vec![
            ("content-type", "text/html; charset=utf-8".to_owned()),
            ("cache-control", "no-store".to_owned()),
            ("x-frame-options", "DENY".to_owned()),
            (
                "content-security-policy",
                format!(
                    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'{form_targets}; \
                     frame-ancestors 'none'; base-uri 'none'"
                ),
            ),
            ("x-content-type-options", "nosniff".to_owned()),
            // Not `no-referrer`: under it a browser sends `Origin: null` with the consent form's
            // POST, which the listener's Origin check (DNS rebinding) refuses. `same-origin` still
            // sends nothing to the client the answer redirects to, or to any other site.
            ("referrer-policy", "same-origin".to_owned()),
        ];
        if let Some(cookie) = cookie {
            headers.push(("set-cookie", cookie));
        }
        Self { status, headers, body: html.into_bytes(), audit: None }
    }

    /// A refusal page; its audit reason by status (`csrf` for the one 403, else
    /// `invalid_request`, `content_type`, `server_error`) unless [`Self::because`] names one.
    pub(super) fn error_page(status: u16, message: &str) -> Self {
        let html = format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Authorization refused</title></head>\
             <body><h1>Authorization refused</h1><p id=\"error\">{}</p></body></html>",
            escape(message)
        );
        let reason = match status {
            403 => "csrf",
            415 => "content_type",
            500.. => "server_error",
            _ => "invalid_request",
        };
        Self::page(status, html, "", None).because(reason)
    }
}
