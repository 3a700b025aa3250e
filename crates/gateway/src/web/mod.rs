//! The gateway's small web surface: a separate HTTPS listener (`[web]`) for the pages an
//! operator or a user opens in a browser, and the primitives every such page is built from.
//!
//! - [`WebSettings`]: the validated `[web]` table (loopback by default, `https` public URL).
//! - [`page`] / [`Page`], [`redirect`] / [`SeeOther`], [`error_page`]: complete responses with
//!   the surface's security headers (CSP with `frame-ancestors 'none'`, `X-Frame-Options: DENY`,
//!   `nosniff`, `no-store`, `Referrer-Policy: same-origin`).
//! - [`escape`]: HTML escaping of everything not written by this crate.
//! - [`CsrfKey`]: HMAC-SHA256 form tokens bound to a browser session and a form's purpose.
//! - [`host_cookie`], [`clear_host_cookie`], [`read_cookie`]: `__Host-` cookies only.
//! - [`Form`]: an urlencoded form body of at most [`MAX_FORM_BYTES`].
//! - [`surface`]: the routes wrapped in the guards every request passes (same-origin `Origin`
//!   on every unsafe method, the request timeout, the body limit, the headers), and the audit
//!   sink every page records its grants and refusals through ([`WebAudit`]).
//! - [`tls_config`] and [`serve_web`]: TLS (rustls, aws-lc-rs) and the accept loop.
//! - [`signin`]: operator sign-in (named tokens, attempt limits, signed session cookies), shared
//!   by the review page and the console.
//!
//! **Architecture Invariant:** every response leaves through [`surface`]'s header layer, and
//! every request whose method is not `GET` or `HEAD` is refused (403) before any handler runs
//! unless its `Origin` is the public URL's origin. Pages never carry a secret in a URL. Every
//! grant and every refusal of a page is on the audit record ([`WebAudit`]: digest-only, the
//! refusals aggregated per source and interval).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_SECURITY_POLICY, CONTENT_TYPE, COOKIE, LOCATION, ORIGIN, REFERRER_POLICY,
    SET_COOKIE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use palisade_server::surface_audit::{Grant, STAGE_WEB, SurfaceAudit};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use url::Url;

pub use palisade_base::html::escape;
pub use palisade_server::surface_audit::SurfaceAudit as Audit;

pub(crate) mod settings;
pub mod signin;

pub use settings::WebSettings;

/// The largest form body a page accepts (larger: 413, before it is read).
pub const MAX_FORM_BYTES: usize = 16 * 1024;
/// One request, headers read to response started, at most this long (then 503).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The prefix of every cookie the surface sets: bound to the exact origin, `Secure`, `Path=/`.
pub const COOKIE_PREFIX: &str = "__Host-";
/// The `Content-Security-Policy` of every response, with `{form_action}` the extra
/// `form-action` sources of a page (none by default).
const CSP_BEFORE_FORM_ACTION: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'";
const CSP_AFTER_FORM_ACTION: &str = "; frame-ancestors 'none'; base-uri 'none'";
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head must arrive within this (also closes idle keep-alive connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once; further ones wait to be accepted.
const MAX_CONNECTIONS: usize = 256;
/// After shutdown, open connections get this long to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// The domain separator of a CSRF token's MAC.
const CSRF_CONTEXT: &[u8] = b"palisade-web-csrf-v1";
/// The bytes of a CSRF token's MAC (HMAC-SHA256).
const CSRF_TAG_BYTES: usize = 32;
/// The style sheet of every page (inline: the CSP allows no other source).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem;\
color:#1b1b1b;background:#fff}h1{font-size:1.5rem}h2{font-size:1.15rem;margin:0 0 .5rem}\
pre{background:#f4f4f4;padding:.75rem;overflow:auto;font-size:.85rem;max-height:32rem}\
.del{color:#9b1c1c}.add{color:#1a5e20}.item{border:1px solid #ccc;border-radius:6px;padding:1rem;margin:1rem 0}\
.warn{color:#8a4b00}.muted{color:#666}dl{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem}\
dt{font-weight:600}dd{margin:0;word-break:break-all}form.inline{display:inline-block;margin-right:1rem}\
button{font-size:1rem;padding:.3rem 1rem}input[type=text],input[type=password]{font-size:1rem;padding:.3rem;width:20rem}";

/// Why the web surface could not be set up. No variant carries key material or a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// The TLS certificate or key cannot be used.
    #[error("web TLS: {reason}")]
    Tls {
        /// What is wrong (fixed text).
        reason: &'static str,
    },
    /// A file of the configuration could not be read.
    #[error("web: {}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why (fixed text).
        reason: &'static str,
    },
    /// The system random source failed.
    #[error("web: the system random source failed")]
    Random,
    /// The listener could not be bound.
    #[error("web: cannot listen on {listen}: {reason}")]
    Bind {
        /// The configured address.
        listen: SocketAddr,
        /// The system's reason.
        reason: String,
    },
    /// A cookie name or value outside the characters RFC 6265 allows.
    #[error("web: cookie {name:?} has a name or value RFC 6265 does not allow")]
    Cookie {
        /// The cookie's name (never its value).
        name: String,
    },
    /// The operator's review token cannot be used.
    #[error("web.review_token: from {origin}: {reason}")]
    ReviewToken {
        /// Where it comes from (a file or an environment variable), never its value.
        origin: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl WebSettings {
    /// The public URL's origin, as a browser sends it in `Origin` (`https://host[:port]`).
    pub fn origin(&self) -> String {
        origin_of(&self.public_url)
    }

    /// The absolute URL of `path` (`/review`, …) under the public URL.
    pub fn url(&self, path: &str) -> String {
        self.public_url.join(path).map_or_else(|_| self.public_url.to_string(), String::from)
    }

    /// Reads the certificate and key files into the listener's TLS configuration.
    pub fn load_tls(&self) -> Result<Arc<rustls::ServerConfig>, WebError> {
        tls_config(&read_file(&self.tls_cert_file)?, &read_file(&self.tls_key_file)?)
    }
}

fn read_file(path: &Path) -> Result<zeroize::Zeroizing<Vec<u8>>, WebError> {
    std::fs::read(path)
        .map(zeroize::Zeroizing::new)
        .map_err(|_| WebError::File { path: path.to_owned(), reason: "cannot be read" })
}

/// The ASCII serialization of `url`'s origin (`https://host[:port]`, the default port
/// omitted), as browsers send it in `Origin`.
pub fn origin_of(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// The rustls server configuration of the listener from PEM: the certificate chain and its
/// private key. aws-lc-rs, TLS 1.2 and 1.3, no client certificates, HTTP/1.1.
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, WebError> {
    let tls = |reason| WebError::Tls { reason };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| tls("the certificate file is not PEM"))?;
    if chain.is_empty() {
        return Err(tls("the certificate file holds no certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| tls("the key file holds no PEM private key"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| tls("TLS versions"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|_| tls("the certificate and key do not match, or the key is unusable"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// 32 bytes of the system random source, base64url: a session id, a nonce.
pub fn random_token() -> Result<String, WebError> {
    let mut bytes = zeroize::Zeroizing::new([0_u8; 32]);
    SystemRandom::new().fill(bytes.as_mut()).map_err(|_| WebError::Random)?;
    Ok(URL_SAFE_NO_PAD.encode(bytes.as_ref()))
}

// ---------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------

/// A complete HTML page and the headers it is sent with. `body_html` is trusted markup: every
/// piece of it not written by this crate must pass through [`escape`].
#[derive(Debug)]
pub struct Page {
    status: StatusCode,
    title: String,
    body_html: String,
    form_actions: Vec<String>,
    cookies: Vec<HeaderValue>,
    style: &'static str,
}

impl Page {
    /// A page with `status`, `title` (escaped here) and `body_html`.
    pub fn new(status: StatusCode, title: &str, body_html: impl Into<String>) -> Self {
        Self {
            status,
            title: title.to_owned(),
            body_html: body_html.into(),
            form_actions: Vec::new(),
            cookies: Vec::new(),
            style: "",
        }
    }

    /// Adds `style` (a constant of this crate) after the surface's style sheet.
    pub fn style(mut self, style: &'static str) -> Self {
        self.style = style;
        self
    }

    /// Allows the page's forms to be posted to (and redirected through) `target`'s origin as
    /// well as the page's own. An opaque origin (`data:`, …) is not added: such a form is refused
    /// by the browser.
    pub fn form_action(mut self, target: &Url) -> Self {
        let origin = target.origin();
        if origin.is_tuple() {
            self.form_actions.push(origin.ascii_serialization());
        }
        self
    }

    /// Sends `cookie` ([`host_cookie`], [`clear_host_cookie`]) with the page.
    pub fn cookie(mut self, cookie: HeaderValue) -> Self {
        self.cookies.push(cookie);
        self
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let html = format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{}</title><style>{STYLE}{}</style></head><body>{}</body></html>",
            escape(&self.title),
            self.style,
            self.body_html
        );
        let mut response = (self.status, html).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        match HeaderValue::from_str(&content_security_policy(&self.form_actions)) {
            Ok(csp) => {
                headers.insert(CONTENT_SECURITY_POLICY, csp);
            }
            // Origins are ASCII without control characters; should one not be, the default
            // (stricter) policy of the header layer applies.
            Err(_) => tracing::warn!("a page's form-action sources are not a header value"),
        }
        insert_security_headers(headers);
        for cookie in self.cookies {
            headers.append(SET_COOKIE, cookie);
        }
        response
    }
}

/// The CSP with `form_actions` beside `'self'`.
fn content_security_policy(form_actions: &[String]) -> String {
    let mut csp = String::from(CSP_BEFORE_FORM_ACTION);
    for source in form_actions {
        csp.push(' ');
        csp.push_str(source);
    }
    csp.push_str(CSP_AFTER_FORM_ACTION);
    csp
}

/// The surface's headers, where a response does not set its own.
fn insert_security_headers(headers: &mut HeaderMap) {
    let defaults = [
        (X_FRAME_OPTIONS, "DENY"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (CACHE_CONTROL, "no-store"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with a form's POST, which the
        // Origin check refuses. `same-origin` still sends nothing to any other site.
        (REFERRER_POLICY, "same-origin"),
    ];
    for (name, value) in defaults {
        headers.entry(name).or_insert(HeaderValue::from_static(value));
    }
    if !headers.contains_key(CONTENT_SECURITY_POLICY)
        && let Ok(csp) = HeaderValue::from_str(&content_security_policy(&[]))
    {
        headers.insert(CONTENT_SECURITY_POLICY, csp);
    }
}

/// A complete HTML page with the surface's headers ([`Page`] for form targets and cookies).
pub fn page(status: StatusCode, title: &str, body_html: &str) -> Response {
    Page::new(status, title, body_html).into_response()
}

/// A refusal or failure as a page: `message` (escaped) in `<p id="error">`, under a heading
/// that names the status.
pub fn error_page(status: StatusCode, message: &str) -> Response {
    let heading = status.canonical_reason().unwrap_or("Refused");
    page(status, heading, &format!("<h1>{}</h1><p id=\"error\">{}</p>", escape(heading), escape(message)))
}

/// A `303 See Other` to `location` (with `Cache-Control: no-store`), and cookies to set.
#[derive(Debug)]
pub struct SeeOther {
    location: String,
    cookies: Vec<HeaderValue>,
}

impl SeeOther {
    /// A redirect to `location`: a path of this surface (`/review`) or an absolute URL.
    pub fn to(location: impl Into<String>) -> Self {
        Self { location: location.into(), cookies: Vec::new() }
    }

    /// Sends `cookie` with the redirect.
    pub fn cookie(mut self, cookie: HeaderValue) -> Self {
        self.cookies.push(cookie);
        self
    }
}

impl IntoResponse for SeeOther {
    fn into_response(self) -> Response {
        let Ok(location) = HeaderValue::from_str(&self.location) else {
            tracing::error!("a redirect's location is not a header value");
            return error_page(StatusCode::INTERNAL_SERVER_ERROR, "the page could not be answered");
        };
        let mut response = StatusCode::SEE_OTHER.into_response();
        let headers = response.headers_mut();
        headers.insert(LOCATION, location);
        insert_security_headers(headers);
        for cookie in self.cookies {
            headers.append(SET_COOKIE, cookie);
        }
        response
    }
}

/// `303 See Other` to `location`, with `Cache-Control: no-store`.
pub fn redirect(location: &str) -> Response {
    SeeOther::to(location).into_response()
}

// ---------------------------------------------------------------------------------------------
// CSRF
// ---------------------------------------------------------------------------------------------

/// The key of the surface's CSRF tokens: a token is HMAC-SHA256 (base64url) over a binding —
/// the browser session id and the form's purpose, say — so a token from one session or one
/// form is worthless in another. `Debug` shows nothing of the key.
pub struct CsrfKey {
    key: hmac::Key,
}

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(<redacted>)")
    }
}

impl CsrfKey {
    /// A key of 32 fresh random bytes (tokens die with the process).
    pub fn generate() -> Result<Self, WebError> {
        let mut bytes = zeroize::Zeroizing::new([0_u8; 32]);
        SystemRandom::new().fill(bytes.as_mut()).map_err(|_| WebError::Random)?;
        Ok(Self::from_bytes(&bytes))
    }

    /// A key from 32 bytes (derived from a longer-lived secret, for tokens that survive a
    /// restart or are shared by instances).
    pub fn from_bytes(key: &[u8; 32]) -> Self {
        Self { key: hmac::Key::new(hmac::HMAC_SHA256, key) }
    }

    /// The token of `binding`: base64url of HMAC-SHA256 over the context and each part,
    /// length-prefixed (so `["ab", "c"]` and `["a", "bc"]` differ).
    pub fn token(&self, binding: &[&str]) -> String {
        URL_SAFE_NO_PAD.encode(hmac::sign(&self.key, &csrf_message(binding)).as_ref())
    }

    /// Whether `token` is [`Self::token`] of `binding` (the MAC compared in constant time).
    pub fn check(&self, binding: &[&str], token: &str) -> bool {
        let Ok(tag) = URL_SAFE_NO_PAD.decode(token) else { return false };
        tag.len() == CSRF_TAG_BYTES && hmac::verify(&self.key, &csrf_message(binding), &tag).is_ok()
    }
}

fn csrf_message(binding: &[&str]) -> Vec<u8> {
    let mut message = Vec::with_capacity(CSRF_CONTEXT.len() + binding.iter().map(|part| part.len() + 8).sum::<usize>());
    message.extend_from_slice(CSRF_CONTEXT);
    for part in binding {
        message.extend_from_slice(&(part.len() as u64).to_be_bytes());
        message.extend_from_slice(part.as_bytes());
    }
    message
}

// ---------------------------------------------------------------------------------------------
// Cookies
// ---------------------------------------------------------------------------------------------

/// The keys of one set of pages, derived from one long-lived key: signed values (cookies that
/// carry a session or a consent, `payload.mac`, both base64url, the MAC over a purpose and the
/// payload, so a value signed for one purpose is worthless for another) and the pages' CSRF key.
pub struct PageKeys {
    key: hmac::Key,
    csrf: CsrfKey,
}

impl std::fmt::Debug for PageKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageKeys(..)")
    }
}

impl PageKeys {
    /// The keys derived from `key` (e.g. [`palisade_server::secret::ServerSecret::derive`] of a
    /// label of the pages, so every instance signs alike).
    pub fn new(key: hmac::Key) -> Self {
        let derived = hmac::sign(&key, b"csrf key");
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        bytes.copy_from_slice(derived.as_ref());
        Self { csrf: CsrfKey::from_bytes(&bytes), key }
    }

    /// The pages' CSRF key.
    pub fn csrf(&self) -> &CsrfKey {
        &self.csrf
    }

    /// `payload` signed for `purpose` (cookie-octets only).
    pub fn sign(&self, purpose: &str, payload: &[u8]) -> String {
        let mac = hmac::sign(&self.key, &[purpose.as_bytes(), b"\0", payload].concat());
        format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(mac.as_ref()))
    }

    /// The payload of `value` when it was signed for `purpose` with these keys.
    pub fn verify(&self, purpose: &str, value: &str) -> Option<Vec<u8>> {
        let (payload, mac) = value.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        hmac::verify(&self.key, &[purpose.as_bytes(), b"\0", &payload].concat(), &mac).ok()?;
        Some(payload)
    }

    /// Whether two secrets are equal, compared through their MACs in constant time (neither
    /// length nor content leaks through timing).
    pub fn same_secret(&self, given: &str, expected: &str) -> bool {
        let tag = hmac::sign(&self.key, expected.as_bytes());
        hmac::verify(&self.key, given.as_bytes(), tag.as_ref()).is_ok()
    }
}

/// An RFC 6265 cookie name (an RFC 7230 token).
fn cookie_name_ok(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

/// RFC 6265 cookie-octets (no quotes, commas, semicolons, backslashes, white space).
fn cookie_value_ok(value: &str) -> bool {
    value.bytes().all(|byte| matches!(byte, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e))
}

/// `Set-Cookie: __Host-<name>=<value>; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age=<secs>`.
/// A name or value outside RFC 6265's characters is refused.
pub fn host_cookie(name: &str, value: &str, max_age_secs: u64) -> Result<HeaderValue, WebError> {
    if !cookie_name_ok(name) || !cookie_value_ok(value) {
        return Err(WebError::Cookie { name: name.to_owned() });
    }
    HeaderValue::from_str(&format!(
        "{COOKIE_PREFIX}{name}={value}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}"
    ))
    .map_err(|_| WebError::Cookie { name: name.to_owned() })
}

/// The `Set-Cookie` that removes cookie `__Host-<name>` (empty, `Max-Age=0`).
pub fn clear_host_cookie(name: &str) -> Result<HeaderValue, WebError> {
    host_cookie(name, "", 0)
}

/// The value of cookie `__Host-<name>` in the request's `Cookie` headers; `None` when it is
/// absent, given more than once, or not made of cookie-octets.
pub fn read_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    let wanted = format!("{COOKIE_PREFIX}{name}");
    let mut found = None;
    for header in headers.get_all(COOKIE) {
        let Ok(text) = header.to_str() else { continue };
        for pair in text.split(';') {
            let Some((key, value)) = pair.trim().split_once('=') else { continue };
            if key == wanted {
                if found.is_some() {
                    return None;
                }
                found = Some(value.to_owned());
            }
        }
    }
    found.filter(|value| cookie_value_ok(value))
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// Whether the request carries exactly one `Origin` header and it is `origin`.
pub fn same_origin(headers: &HeaderMap, origin: &str) -> bool {
    let mut values = headers.get_all(ORIGIN).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => value.as_bytes() == origin.as_bytes(),
        _ => false,
    }
}

/// An `application/x-www-form-urlencoded` body of at most [`MAX_FORM_BYTES`], as an
/// extractor: another content type is 415, a larger body 413, an unreadable one 400 (each a
/// page).
#[derive(Debug, Clone, Default)]
pub struct Form {
    fields: Vec<(String, String)>,
}

impl Form {
    /// The value of field `name` when the form has it exactly once.
    pub fn one(&self, name: &str) -> Option<&str> {
        let mut values = self.fields.iter().filter(|(key, _)| key == name).map(|(_, value)| value.as_str());
        match (values.next(), values.next()) {
            (Some(value), None) => Some(value),
            _ => None,
        }
    }

    /// A form of `fields` (tests, and forms assembled in code).
    pub fn from_fields(fields: Vec<(String, String)>) -> Self {
        Self { fields }
    }
}

impl<S: Send + Sync> FromRequest<S> for Form {
    type Rejection = Response;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Response> {
        let content_type = request.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            return Err(error_page(StatusCode::UNSUPPORTED_MEDIA_TYPE, "a form must be sent urlencoded"));
        }
        let too_large = || error_page(StatusCode::PAYLOAD_TOO_LARGE, "the form is larger than 16 KiB");
        let declared = request.headers().get(CONTENT_LENGTH).and_then(|value| value.to_str().ok());
        if declared.and_then(|value| value.parse::<u64>().ok()).is_some_and(|length| length > MAX_FORM_BYTES as u64) {
            return Err(too_large());
        }
        let bytes = axum::body::to_bytes(request.into_body(), MAX_FORM_BYTES).await.map_err(|error| {
            let over =
                std::error::Error::source(&error).is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
            if over { too_large() } else { error_page(StatusCode::BAD_REQUEST, "the form could not be read") }
        })?;
        let fields = url::form_urlencoded::parse(&bytes).map(|(key, value)| (key.into_owned(), value.into_owned()));
        Ok(Self { fields: fields.collect() })
    }
}

// ---------------------------------------------------------------------------------------------
// The audit record
// ---------------------------------------------------------------------------------------------

/// The peer's address of a request, when the listener recorded it ([`serve_web`] does).
pub fn peer_of(request: &axum::http::request::Parts) -> Option<IpAddr> {
    request.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(address)| address.ip())
}

/// A page's handle on the audit record (stage `web`), as an extractor: the surface's
/// [`SurfaceAudit`] and the request's peer address. Refusals are counted per source and written
/// every interval; grants are written at once and a page grants nothing that is not on the
/// record. Only stable codes, fixed words and keyed digests are recorded.
#[derive(Clone)]
pub struct WebAudit {
    audit: Arc<SurfaceAudit>,
    peer: Option<IpAddr>,
}

impl std::fmt::Debug for WebAudit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebAudit").finish_non_exhaustive()
    }
}

impl WebAudit {
    /// The handle of `audit` for a request from `peer`.
    pub fn new(audit: Arc<SurfaceAudit>, peer: Option<IpAddr>) -> Self {
        Self { audit, peer }
    }

    /// The peer's address.
    pub fn peer(&self) -> Option<IpAddr> {
        self.peer
    }

    /// Counts a refusal at `endpoint` (`review`, `consent`, …) for `reason`, answered `status`.
    pub fn refuse(&self, endpoint: &'static str, reason: &'static str, status: StatusCode) {
        self.audit.refuse(STAGE_WEB, endpoint, reason, status.as_u16(), self.peer);
    }

    /// [`Self::refuse`], answered with [`error_page`] of `message`.
    pub fn refused(&self, endpoint: &'static str, reason: &'static str, status: StatusCode, message: &str) -> Response {
        self.refuse(endpoint, reason, status);
        error_page(status, message)
    }

    /// Records the grant `outcome` at `endpoint` to `person` (issuer, subject) for `client`,
    /// with fixed words `detail`: `Err` (a 503 page; nothing may be granted) when it could not
    /// be made durable.
    pub async fn grant(
        &self,
        endpoint: &'static str,
        outcome: &'static str,
        person: Option<(&str, &str)>,
        client: Option<&str>,
        detail: Option<String>,
    ) -> Result<(), Response> {
        let grant = Grant {
            stage: STAGE_WEB,
            endpoint,
            outcome,
            person,
            client,
            detail,
            source: self.peer,
            ..Grant::default()
        };
        self.audit
            .grant(grant)
            .await
            .map_err(|_| error_page(StatusCode::SERVICE_UNAVAILABLE, "the audit log is unavailable; nothing was done"))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for WebAudit {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _state: &S) -> Result<Self, Response> {
        let peer = peer_of(parts);
        match parts.extensions.get::<Arc<SurfaceAudit>>() {
            Some(audit) => Ok(Self { audit: audit.clone(), peer }),
            // Only a page served outside `surface` has none: it must not run unrecorded.
            None => Err(error_page(StatusCode::INTERNAL_SERVER_ERROR, "this page is not on the audit record")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The surface
// ---------------------------------------------------------------------------------------------

/// `routes` as the surface serves them. From the outside in, every request passes:
///
/// 1. the header layer (outermost, so even a refusal of the layers below carries the
///    anti-framing and no-store headers);
/// 2. the body limit ([`MAX_FORM_BYTES`]) for any extractor that reads a body;
/// 3. the request timeout ([`REQUEST_TIMEOUT`], then 503);
/// 4. the same-origin check: a method other than `GET` or `HEAD` without `Origin` equal to
///    the public URL's origin is 403 before any handler runs (counted on `audit`:
///    `surface/origin_missing` or `surface/origin_foreign`);
/// 5. `audit` as a request extension, which pages take as [`WebAudit`].
///
/// Unknown paths answer a 404 page; `routes` should not set a fallback of their own.
pub fn surface(settings: &WebSettings, audit: Arc<SurfaceAudit>, routes: Router) -> Router {
    let origin: Arc<str> = settings.origin().into();
    routes
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(origin, require_same_origin))
        .layer(axum::Extension(audit))
        .layer(middleware::from_fn(request_timeout))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn(security_headers))
}

async fn not_found() -> Response {
    error_page(StatusCode::NOT_FOUND, "there is no page here")
}

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    insert_security_headers(response.headers_mut());
    response
}

async fn request_timeout(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => error_page(StatusCode::SERVICE_UNAVAILABLE, "the page took too long; nothing more will happen"),
    }
}

async fn require_same_origin(State(origin): State<Arc<str>>, request: Request, next: Next) -> Response {
    let safe = request.method() == Method::GET || request.method() == Method::HEAD;
    if !safe && !same_origin(request.headers(), &origin) {
        let reason = if request.headers().contains_key(ORIGIN) { "origin_foreign" } else { "origin_missing" };
        let (parts, _) = request.into_parts();
        if let Some(audit) = parts.extensions.get::<Arc<SurfaceAudit>>() {
            audit.refuse(STAGE_WEB, "surface", reason, StatusCode::FORBIDDEN.as_u16(), peer_of(&parts));
        }
        return error_page(
            StatusCode::FORBIDDEN,
            "this request did not come from this site's own pages (its Origin header is missing or another site's); nothing was done",
        );
    }
    next.run(request).await
}

/// Binds the listener of `settings`, reads its certificate and key, and serves `routes` (inside
/// [`surface`], recording on `audit`) until `shutdown` is cancelled. Returns the bound address
/// once listening.
pub async fn start(
    settings: &WebSettings,
    routes: Router,
    audit: Arc<SurfaceAudit>,
    shutdown: CancellationToken,
) -> Result<SocketAddr, WebError> {
    let tls = settings.load_tls()?;
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|error| WebError::Bind { listen: settings.listen, reason: error.to_string() })?;
    let local =
        listener.local_addr().map_err(|error| WebError::Bind { listen: settings.listen, reason: error.to_string() })?;
    tokio::spawn(serve_web(listener, tls, surface(settings, audit, routes), shutdown));
    Ok(local)
}

/// Serves `router` ([`surface`]) over TLS on `listener` until `shutdown` is cancelled; then
/// stops accepting and lets open connections finish for a few seconds. HTTP/1.1, each request
/// head within 10 s, each TLS handshake within 10 s, at most 256 connections at once. Every
/// request carries the peer's address as [`ConnectInfo`] (see [`peer_of`]).
pub async fn serve_web(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let open = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            permit = open.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "web: accepting a connection failed");
                    // Out of file descriptors, say: pause instead of spinning.
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(tower::util::MapRequest::new(
            router.clone(),
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            },
        ));
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "web: TLS handshake refused");
                    return;
                }
                Err(_) => return,
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tls), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "web: connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!("web: connections still open {} s after shutdown began", SHUTDOWN_GRACE.as_secs());
    }
}

/// Test helpers: an audit sink over an in-memory log, and what it recorded.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::http::{HeaderMap, Request, StatusCode};
    use palisade_server::surface_audit::SurfaceAudit;
    use palisade_store::{AuditStore, AuditWriter};
    use tower::ServiceExt as _;

    /// An audit sink writing into `store`'s log (digest key of a fixed test secret).
    pub(crate) fn recording(store: Arc<dyn AuditStore>) -> Arc<SurfaceAudit> {
        let writer = Arc::new(AuditWriter::new(store, Default::default()));
        let secret = palisade_server::secret::ServerSecret::from_bytes([5; 32]);
        Arc::new(SurfaceAudit::new(Some(writer), &secret, Arc::new(palisade_base::clock::SystemClock)))
    }

    /// The web listener's origin in the pages' unit tests.
    pub(crate) const ORIGIN: &str = "https://127.0.0.1:8443";

    /// Sends `request` to `router`: status, headers and the body as text.
    pub(crate) async fn send(router: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
        let response = router.clone().oneshot(request).await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 22).await.unwrap();
        (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// A same-origin form POST of `fields`, with the session `cookie` if given.
    pub(crate) fn post(path: &str, cookie: Option<&str>, fields: &[(&str, &str)]) -> Request<Body> {
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(fields).finish();
        let mut request =
            Request::post(path).header("origin", ORIGIN).header("content-type", "application/x-www-form-urlencoded");
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.body(Body::from(body)).unwrap()
    }

    /// A GET of `path`, with the session `cookie` if given.
    pub(crate) fn get(path: &str, cookie: Option<&str>) -> Request<Body> {
        let mut request = Request::get(path);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.body(Body::empty()).unwrap()
    }

    /// An audit sink that records nothing (no log).
    pub(crate) fn none() -> Arc<SurfaceAudit> {
        let secret = palisade_server::secret::ServerSecret::from_bytes([5; 32]);
        Arc::new(SurfaceAudit::new(None, &secret, Arc::new(palisade_base::clock::SystemClock)))
    }

    /// After a flush of `audit`: every record of stage `web` in `store`, as
    /// `(decision, operation, code, detail)`, sorted.
    pub(crate) async fn records(
        audit: &SurfaceAudit,
        store: &dyn AuditStore,
    ) -> Vec<(String, String, Option<i64>, String)> {
        audit.flush().await;
        let mut found: Vec<_> = store
            .recent(1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|stored| stored.record.stage == "web")
            .map(|stored| {
                let r = stored.record;
                (format!("{:?}", r.decision).to_lowercase(), r.operation, r.code, r.detail.unwrap_or_default())
            })
            .collect();
        found.sort();
        found
    }
}

#[cfg(test)]
mod tests;
