//! The egress guard: the one way Palisade fetches a URL that someone else chose (a client's
//! metadata document, an issuer's JWKS; upstream servers and their credentials endpoints later),
//! so that such a URL cannot turn the server into a proxy into its own network (SSRF).
//!
//! What a fetch through [`EgressGuard::get`] is held to:
//! - **https only.** Plain http only to a loopback host (`localhost` or a loopback IP literal),
//!   and only when the policy allows loopback ([`EgressPolicy::allow_loopback`], the development
//!   flag). No user name or password in the URL; other schemes (`file:`, `javascript:`, …) are
//!   refused.
//! - **Public addresses only.** A host name is resolved once per connection, by our resolver, and
//!   refused if *any* of its addresses is in [`RANGES`] (loopback, private, link-local including
//!   the cloud metadata addresses, CGNAT, ULA, documentation, multicast, unspecified, reserved,
//!   IPv4-compatible, 6to4, Teredo, local-use NAT64). IPv4-mapped and well-known-prefix NAT64
//!   addresses are judged by the IPv4 address inside. The connection then goes to exactly the
//!   checked addresses (the resolver hands them to the HTTP client), so a second DNS answer
//!   (rebinding) cannot swap them. IP-literal hosts are checked the same way before anything is
//!   sent; the URL parser has already turned `2130706433`, `0x7f.1`, `0177.0.0.1` and `127.1`
//!   into `127.0.0.1`. Ranges are parsed by the `ipnet` crate from literal CIDR strings;
//!   exceptions are explicit ([`EgressPolicy::allow_loopback`],
//!   [`EgressPolicy::allowed_networks`]).
//! - **Redirects** are refused unless [`EgressPolicy::max_redirects`] allows some; each hop is
//!   then checked like the first URL before anything is sent to it.
//! - **Bounded.** One deadline for the whole fetch including redirects; the body is counted on
//!   the wire and refused past [`EgressPolicy::max_body_bytes`] (a lying `Content-Length` does
//!   not matter). No proxy from the environment, no cookies.
//! - **Optional egress proxy** ([`EgressPolicy::proxy`]): https requests then go through the
//!   operator's HTTP CONNECT proxy, which resolves the target name itself. The guard cannot see
//!   that address, so the proxy carries the duty of refusing internal destinations; the guard
//!   still refuses non-https URLs and IP-literal targets in a refused range before sending.
//!
//! Tests resolve names through [`EgressPolicy::resolver`]; production uses the system resolver.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

/// How the guard treats addresses in one range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRule {
    /// Refused, for the reason given (unless an exception allows the address).
    Refuse(&'static str),
    /// Judged by the IPv4 address in its last 32 bits (the form is named).
    EmbedsIpv4(&'static str),
}

/// The special address ranges (IANA special-purpose registries, multicast, the IPv4 broadcast
/// address and the cloud metadata addresses), each a literal CIDR string parsed by `ipnet`. An
/// address is judged by the longest prefix that contains it; an address in no range is public.
pub const RANGES: &[(&str, RangeRule)] = &[
    ("0.0.0.0/8", RangeRule::Refuse("\"this network\" (unspecified)")),
    ("10.0.0.0/8", RangeRule::Refuse("private-use")),
    ("100.64.0.0/10", RangeRule::Refuse("shared address space (CGNAT)")),
    ("127.0.0.0/8", RangeRule::Refuse("loopback")),
    ("169.254.0.0/16", RangeRule::Refuse("link-local")),
    ("169.254.169.254/32", RangeRule::Refuse("link-local (cloud metadata service)")),
    ("172.16.0.0/12", RangeRule::Refuse("private-use")),
    ("192.0.0.0/24", RangeRule::Refuse("IETF protocol assignments")),
    ("192.0.2.0/24", RangeRule::Refuse("documentation")),
    ("192.31.196.0/24", RangeRule::Refuse("AS112")),
    ("192.52.193.0/24", RangeRule::Refuse("AMT")),
    ("192.88.99.0/24", RangeRule::Refuse("6to4 relay anycast (deprecated)")),
    ("192.168.0.0/16", RangeRule::Refuse("private-use")),
    ("192.175.48.0/24", RangeRule::Refuse("AS112")),
    ("198.18.0.0/15", RangeRule::Refuse("benchmarking")),
    ("198.51.100.0/24", RangeRule::Refuse("documentation")),
    ("203.0.113.0/24", RangeRule::Refuse("documentation")),
    ("224.0.0.0/4", RangeRule::Refuse("multicast")),
    ("240.0.0.0/4", RangeRule::Refuse("reserved")),
    ("255.255.255.255/32", RangeRule::Refuse("broadcast")),
    ("::/128", RangeRule::Refuse("unspecified")),
    ("::1/128", RangeRule::Refuse("loopback")),
    // ::a.b.c.d, deprecated (RFC 4291): refused whatever the IPv4 inside.
    ("::/96", RangeRule::Refuse("IPv4-compatible (deprecated)")),
    ("::ffff:0:0/96", RangeRule::EmbedsIpv4("IPv4-mapped")),
    ("::ffff:0:0:0/96", RangeRule::Refuse("IPv4-translated")),
    // The well-known NAT64 prefix (RFC 6052): DNS64 answers public IPv4 hosts with it.
    ("64:ff9b::/96", RangeRule::EmbedsIpv4("NAT64")),
    // Local-use NAT64 (RFC 8215): where the IPv4 sits depends on the operator's prefix length.
    ("64:ff9b:1::/48", RangeRule::Refuse("local-use NAT64")),
    ("100::/64", RangeRule::Refuse("discard-only")),
    ("2001::/23", RangeRule::Refuse("IETF protocol assignments")),
    // Teredo embeds the server's and the (obfuscated) client's IPv4 addresses.
    ("2001::/32", RangeRule::Refuse("Teredo (embeds IPv4 addresses)")),
    ("2001:db8::/32", RangeRule::Refuse("documentation")),
    // 6to4 embeds an IPv4 address in bits 16..48; relays are deprecated (RFC 7526), so the
    // range is refused whatever the IPv4 inside.
    ("2002::/16", RangeRule::Refuse("6to4 (embeds an IPv4 address)")),
    ("3fff::/20", RangeRule::Refuse("documentation")),
    ("5f00::/16", RangeRule::Refuse("segment routing (SRv6)")),
    ("fc00::/7", RangeRule::Refuse("unique local (ULA)")),
    ("fd00:ec2::254/128", RangeRule::Refuse("unique local (cloud metadata service)")),
    ("fe80::/10", RangeRule::Refuse("link-local")),
    ("fec0::/10", RangeRule::Refuse("site-local (deprecated)")),
    ("ff00::/8", RangeRule::Refuse("multicast")),
];

/// Loopback ranges, allowed only with [`EgressPolicy::allow_loopback`].
const LOOPBACK_NETWORKS: &[&str] = &["127.0.0.0/8", "::1/128"];

/// Resolves a host name to its addresses: a test's stand-in for the system resolver
/// ([`EgressPolicy::resolver`]). Called once per connection the HTTP client opens.
#[derive(Clone)]
pub struct Resolver(Arc<LookupFn>);

type LookupFn = dyn Fn(&str) -> Vec<IpAddr> + Send + Sync;

impl Resolver {
    /// A resolver answering with `lookup(host)`; an empty answer means the name did not resolve.
    pub fn new(lookup: impl Fn(&str) -> Vec<IpAddr> + Send + Sync + 'static) -> Self {
        Self(Arc::new(lookup))
    }
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver(..)")
    }
}

/// Limits and exceptions of one guard. The defaults suit fetching small documents from the
/// public internet.
#[derive(Clone)]
pub struct EgressPolicy {
    /// The development flag: allow loopback addresses, and plain http to a loopback host
    /// (`localhost` or a loopback IP literal). Tests and local development only.
    pub allow_loopback: bool,
    /// The operator's allow-list: networks that may be reached although they are in a refused
    /// range (deliberate internal deployments). Checked against the address and, for the forms
    /// that embed one, against the IPv4 address inside.
    pub allowed_networks: Vec<IpNet>,
    /// Largest body accepted, counted on the wire. Default 64 KiB.
    pub max_body_bytes: usize,
    /// Deadline of one whole fetch, redirects included. Default 5 s.
    pub timeout: Duration,
    /// Redirects followed, each re-checked. Default 0: a redirect is refused.
    pub max_redirects: u8,
    /// Extra trust anchors (PEM) besides the platform's, e.g. a test CA.
    pub extra_roots_pem: Option<Vec<u8>>,
    /// An HTTP CONNECT proxy (`http://` or `https://` URL; user and password, if any, are sent as
    /// Basic proxy credentials) for https requests. The proxy resolves the target name, so it
    /// must refuse internal destinations itself: the guard then checks only the scheme and
    /// IP-literal hosts. The proxy's own address is the operator's choice and is not checked.
    pub proxy: Option<Url>,
    /// Resolves host names instead of the system resolver (tests). `None`: the system resolver.
    pub resolver: Option<Resolver>,
}

impl Default for EgressPolicy {
    fn default() -> Self {
        Self {
            allow_loopback: false,
            allowed_networks: Vec::new(),
            max_body_bytes: 64 * 1024,
            timeout: Duration::from_secs(5),
            max_redirects: 0,
            extra_roots_pem: None,
            proxy: None,
            resolver: None,
        }
    }
}

impl std::fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The proxy URL may carry credentials: show only where it points.
        let proxy = self.proxy.as_ref().map(|url| format!("{}://{}", url.scheme(), url.authority_host_port()));
        f.debug_struct("EgressPolicy")
            .field("allow_loopback", &self.allow_loopback)
            .field("allowed_networks", &self.allowed_networks)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("timeout", &self.timeout)
            .field("max_redirects", &self.max_redirects)
            .field("extra_roots_pem", &self.extra_roots_pem.as_ref().map(Vec::len))
            .field("proxy", &proxy)
            .field("resolver", &self.resolver)
            .finish()
    }
}

/// An operator's allow-list entry (`10.20.0.0/16`, `fd00:1::/64`), parsed by the `ipnet`
/// library; `None` when it is not a CIDR network.
pub fn parse_network(cidr: &str) -> Option<IpNet> {
    cidr.trim().parse::<IpNet>().ok()
}

/// An operator's egress proxy URL: `http` or `https`, with a host, without user or password
/// (credentials belong in a secret, not in a configuration value); `None` otherwise.
pub fn parse_proxy(text: &str) -> Option<Url> {
    Url::parse(text).ok().filter(|url| {
        matches!(url.scheme(), "http" | "https")
            && url.host().is_some()
            && url.username().is_empty()
            && url.password().is_none()
    })
}

/// Host and port of a URL, without user or password.
trait HostPort {
    fn authority_host_port(&self) -> String;
}

impl HostPort for Url {
    fn authority_host_port(&self) -> String {
        let host = self.host_str().unwrap_or("");
        match self.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        }
    }
}

/// Why an address was refused: the range's reason, and the embedding form when the address was
/// judged by the IPv4 address inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRefusal {
    /// The refused range's reason, e.g. `"loopback"`.
    pub reason: &'static str,
    /// `Some("IPv4-mapped")` or `Some("NAT64")` when the IPv4 inside was judged.
    pub embedded_in: Option<&'static str>,
}

impl std::fmt::Display for AddressRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.embedded_in {
            Some(form) => write!(f, "{} (in an {form} address)", self.reason),
            None => f.write_str(self.reason),
        }
    }
}

/// Why a fetch was refused or failed. Messages carry no response content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// The URL is not one the guard fetches (scheme, credentials, no host).
    #[error("URL not allowed: {0}")]
    UrlNotAllowed(&'static str),
    /// The host is, or resolves to, an address the policy does not allow.
    #[error("the host's address is not allowed: {0}")]
    AddressNotAllowed(AddressRefusal),
    /// The host name did not resolve.
    #[error("the host name did not resolve")]
    Resolve,
    /// A redirect where none (or no more) is allowed.
    #[error("redirect refused")]
    RedirectRefused,
    /// The body is larger than the cap.
    #[error("response too large")]
    TooLarge,
    /// The deadline passed.
    #[error("timed out")]
    Timeout,
    /// Connecting, TLS or reading failed.
    #[error("transport error")]
    Transport,
    /// The guard could not be built (bad extra roots, bad proxy).
    #[error("egress guard configuration: {0}")]
    Config(&'static str),
}

/// A fetched response: the final URL (after allowed redirects), status, content type and body.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The URL that answered.
    pub url: Url,
    /// Its status code.
    pub status: u16,
    /// Its `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The body, at most [`EgressPolicy::max_body_bytes`].
    pub body: Vec<u8>,
}

/// Decides whether an address may be reached.
#[derive(Debug, Clone)]
struct AddressRules {
    ranges: Vec<(IpNet, RangeRule)>,
    allowed: Vec<IpNet>,
}

impl AddressRules {
    fn new(policy: &EgressPolicy) -> Self {
        let mut allowed = policy.allowed_networks.clone();
        if policy.allow_loopback {
            allowed.extend(LOOPBACK_NETWORKS.iter().filter_map(|s| IpNet::from_str(s).ok()));
        }
        let ranges = RANGES.iter().filter_map(|(cidr, rule)| Some((IpNet::from_str(cidr).ok()?, *rule))).collect();
        Self { ranges, allowed }
    }

    /// The rule of the longest range containing `address`, if any.
    fn rule(&self, address: IpAddr) -> Option<RangeRule> {
        self.ranges
            .iter()
            .filter(|(net, _)| net.contains(&address))
            .max_by_key(|(net, _)| net.prefix_len())
            .map(|(_, rule)| *rule)
    }

    fn is_allowed(&self, address: IpAddr) -> bool {
        self.allowed.iter().any(|net| net.contains(&address))
    }

    fn check(&self, address: IpAddr) -> Result<(), AddressRefusal> {
        if self.is_allowed(address) {
            return Ok(());
        }
        match self.rule(address) {
            None => Ok(()),
            Some(RangeRule::Refuse(reason)) => Err(AddressRefusal { reason, embedded_in: None }),
            Some(RangeRule::EmbedsIpv4(form)) => {
                let IpAddr::V6(v6) = address else {
                    return Ok(());
                };
                // The last 32 bits (RFC 4291 §2.5.5.2, RFC 6052 §2.2 for a /96 prefix).
                let embedded = IpAddr::V4(Ipv4Addr::from_bits(v6.to_bits() as u32));
                if self.is_allowed(embedded) {
                    return Ok(());
                }
                match self.rule(embedded) {
                    Some(RangeRule::Refuse(reason)) => Err(AddressRefusal { reason, embedded_in: Some(form) }),
                    _ => Ok(()),
                }
            }
        }
    }

    #[cfg(test)]
    fn permits(&self, address: IpAddr) -> bool {
        self.check(address).is_ok()
    }
}

/// Resolves names for the HTTP client and refuses a name if any of its addresses is not allowed.
/// The proxy's own name (operator configuration) is resolved without the check.
struct GuardedResolver {
    rules: Arc<AddressRules>,
    resolver: Option<Resolver>,
    proxy_host: Option<String>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules.clone();
        let resolver = self.resolver.clone();
        let host = name.as_str().to_owned();
        let is_proxy = self.proxy_host.as_deref().is_some_and(|proxy| proxy.eq_ignore_ascii_case(&host));
        Box::pin(async move {
            let addresses: Vec<IpAddr> = match resolver {
                Some(resolver) => (resolver.0)(&host),
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.map(|a| a.ip()).collect(),
            };
            if addresses.is_empty() {
                return Err(Box::new(EgressError::Resolve) as BoxError);
            }
            if !is_proxy {
                for address in &addresses {
                    rules
                        .check(*address)
                        .map_err(|refusal| Box::new(EgressError::AddressNotAllowed(refusal)) as BoxError)?;
                }
            }
            let addresses: Vec<SocketAddr> = addresses.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The guard: an HTTP client that only fetches what [`EgressPolicy`] allows.
#[derive(Clone)]
pub struct EgressGuard {
    client: reqwest::Client,
    rules: Arc<AddressRules>,
    policy: Arc<EgressPolicy>,
}

impl std::fmt::Debug for EgressGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressGuard").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl EgressGuard {
    /// Builds the guard's HTTP client.
    pub fn new(policy: EgressPolicy) -> Result<Self, EgressError> {
        let rules = Arc::new(AddressRules::new(&policy));
        let proxy_host = match &policy.proxy {
            None => None,
            Some(proxy) => {
                if !matches!(proxy.scheme(), "http" | "https") {
                    return Err(EgressError::Config("the proxy URL must be http or https"));
                }
                Some(proxy.host_str().ok_or(EgressError::Config("the proxy URL has no host"))?.to_owned())
            }
        };
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(policy.timeout)
            .connect_timeout(policy.timeout)
            .dns_resolver(GuardedResolver { rules: rules.clone(), resolver: policy.resolver.clone(), proxy_host })
            .user_agent(concat!("palisade/", env!("CARGO_PKG_VERSION")));
        if let Some(proxy) = &policy.proxy {
            let proxy = reqwest::Proxy::https(proxy.as_str())
                .map_err(|_| EgressError::Config("the proxy URL is not usable"))?;
            builder = builder.proxy(proxy);
        }
        if let Some(pem) = &policy.extra_roots_pem {
            let roots = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|_| EgressError::Config("extra roots are not a PEM certificate bundle"))?;
            if roots.is_empty() {
                return Err(EgressError::Config("extra roots hold no certificate"));
            }
            builder = builder.tls_certs_merge(roots);
        }
        let client = builder.build().map_err(|_| EgressError::Config("HTTP client"))?;
        Ok(Self { client, rules, policy: Arc::new(policy) })
    }

    /// The policy this guard enforces.
    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    /// Whether the guard would send a request to `url` at all (scheme, credentials, and an
    /// IP-literal host's address; names are checked when resolved).
    pub fn check_url(&self, url: &Url) -> Result<(), EgressError> {
        match url.scheme() {
            "https" | "http" => {}
            _ => return Err(EgressError::UrlNotAllowed("scheme")),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressError::UrlNotAllowed("credentials in the URL"));
        }
        let host = url.host().ok_or(EgressError::UrlNotAllowed("no host"))?;
        let literal = match host {
            url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
            url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
            url::Host::Domain(_) => None,
        };
        if url.scheme() == "http" {
            let loopback = match host {
                url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
                _ => literal.is_some_and(|ip| ip.is_loopback()),
            };
            if !(self.policy.allow_loopback && loopback) {
                return Err(EgressError::UrlNotAllowed("plain http"));
            }
        }
        if let Some(ip) = literal {
            self.rules.check(ip).map_err(EgressError::AddressNotAllowed)?;
        }
        Ok(())
    }

    /// Whether `address` may be reached under this guard's policy.
    pub fn check_address(&self, address: IpAddr) -> Result<(), AddressRefusal> {
        self.rules.check(address)
    }

    /// GETs `url` under the policy, with `accept` as the `Accept` header. Redirects are
    /// followed up to [`EgressPolicy::max_redirects`], each hop checked like the first.
    pub async fn get(&self, url: &Url, accept: &str) -> Result<Fetched, EgressError> {
        self.deadline(self.get_inner(url.clone(), accept)).await
    }

    /// POSTs `body` (of type `content_type`) to `url` under the policy, with `accept` as the
    /// `Accept` header and `headers` besides (e.g. client authentication, marked sensitive by the
    /// caller). A redirect is never followed: a token or registration endpoint that redirects is
    /// refused, so a request body (a code, a verifier, a secret) goes to the checked URL only.
    pub async fn post(
        &self,
        url: &Url,
        content_type: &str,
        body: Vec<u8>,
        accept: &str,
        headers: &[(reqwest::header::HeaderName, reqwest::header::HeaderValue)],
    ) -> Result<Fetched, EgressError> {
        self.deadline(async {
            self.check_url(url)?;
            let mut request =
                self.client.post(url.clone()).header("accept", accept).header("content-type", content_type).body(body);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let response = request.send().await.map_err(classify_error)?;
            if response.status().is_redirection() {
                return Err(EgressError::RedirectRefused);
            }
            self.read(url.clone(), response).await
        })
        .await
    }

    async fn deadline(
        &self,
        fetch: impl Future<Output = Result<Fetched, EgressError>>,
    ) -> Result<Fetched, EgressError> {
        match tokio::time::timeout(self.policy.timeout, fetch).await {
            Ok(result) => result,
            Err(_) => Err(EgressError::Timeout),
        }
    }

    async fn get_inner(&self, mut url: Url, accept: &str) -> Result<Fetched, EgressError> {
        let mut redirects = 0u8;
        loop {
            self.check_url(&url)?;
            let response =
                self.client.get(url.clone()).header("accept", accept).send().await.map_err(classify_error)?;
            if response.status().is_redirection() {
                if redirects >= self.policy.max_redirects {
                    return Err(EgressError::RedirectRefused);
                }
                let location = response
                    .headers()
                    .get("location")
                    .and_then(|value| value.to_str().ok())
                    .ok_or(EgressError::RedirectRefused)?;
                url = url.join(location).map_err(|_| EgressError::RedirectRefused)?;
                redirects += 1;
                continue;
            }
            return self.read(url, response).await;
        }
    }

    /// Reads a response's body under the size cap.
    async fn read(&self, url: Url, mut response: reqwest::Response) -> Result<Fetched, EgressError> {
        let status = response.status();
        let cap = self.policy.max_body_bytes;
        if response.content_length().is_some_and(|length| length > cap as u64) {
            return Err(EgressError::TooLarge);
        }
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(classify_error)? {
            if body.len() + chunk.len() > cap {
                return Err(EgressError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Fetched { url, status: status.as_u16(), content_type, body })
    }
}

/// Maps a client error to ours, keeping the resolver's verdict when that was the cause.
fn classify_error(error: reqwest::Error) -> EgressError {
    if error.is_timeout() {
        return EgressError::Timeout;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&error);
    while let Some(cause) = source {
        if let Some(ours) = cause.downcast_ref::<EgressError>() {
            return ours.clone();
        }
        source = cause.source();
    }
    EgressError::Transport
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn guard(policy: EgressPolicy) -> EgressGuard {
        EgressGuard::new(policy).unwrap()
    }

    fn loopback_policy() -> EgressPolicy {
        EgressPolicy { allow_loopback: true, max_redirects: 2, ..EgressPolicy::default() }
    }

    fn refusal(rules: &AddressRules, address: &str) -> Option<AddressRefusal> {
        rules.check(address.parse().unwrap()).err()
    }

    fn refused(reason: &'static str) -> Option<AddressRefusal> {
        Some(AddressRefusal { reason, embedded_in: None })
    }

    fn refused_inside(form: &'static str, reason: &'static str) -> Option<AddressRefusal> {
        Some(AddressRefusal { reason, embedded_in: Some(form) })
    }

    #[test]
    fn every_range_parses() {
        for (cidr, _) in RANGES {
            assert!(IpNet::from_str(cidr).is_ok(), "{cidr}");
        }
        assert_eq!(AddressRules::new(&EgressPolicy::default()).ranges.len(), RANGES.len());
    }

    #[test]
    fn special_addresses_are_refused_and_public_ones_allowed() {
        let rules = AddressRules::new(&EgressPolicy::default());
        for blocked in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "ff02::1",
            "192.0.2.1",
            "2001:db8::1",
        ] {
            assert!(!rules.permits(blocked.parse().unwrap()), "{blocked}");
        }
        for public in ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            assert!(rules.permits(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn refusals_name_their_range() {
        let rules = AddressRules::new(&EgressPolicy::default());
        // The longest prefix decides: the metadata addresses have their own rows.
        assert_eq!(refusal(&rules, "169.254.169.254"), refused("link-local (cloud metadata service)"));
        assert_eq!(refusal(&rules, "169.254.1.1"), refused("link-local"));
        assert_eq!(refusal(&rules, "fd00:ec2::254"), refused("unique local (cloud metadata service)"));
        assert_eq!(refusal(&rules, "fd12::1"), refused("unique local (ULA)"));
        assert_eq!(refusal(&rules, "100.100.100.200"), refused("shared address space (CGNAT)"));
        assert_eq!(refusal(&rules, "::"), refused("unspecified"));
        assert_eq!(refusal(&rules, "::1"), refused("loopback"));
        assert_eq!(refusal(&rules, "ff05::2"), refused("multicast"));
        assert_eq!(refusal(&rules, "3fff::1"), refused("documentation"));
    }

    #[test]
    fn ipv6_forms_embedding_an_ipv4_address() {
        let rules = AddressRules::new(&EgressPolicy::default());
        // IPv4-mapped and well-known NAT64: judged by the IPv4 inside.
        assert_eq!(refusal(&rules, "::ffff:127.0.0.1"), refused_inside("IPv4-mapped", "loopback"));
        assert_eq!(
            refusal(&rules, "::ffff:169.254.169.254"),
            refused_inside("IPv4-mapped", "link-local (cloud metadata service)")
        );
        assert_eq!(refusal(&rules, "64:ff9b::10.0.0.1"), refused_inside("NAT64", "private-use"));
        assert_eq!(refusal(&rules, "64:ff9b::127.0.0.1"), refused_inside("NAT64", "loopback"));
        assert_eq!(refusal(&rules, "::ffff:8.8.8.8"), None);
        assert_eq!(refusal(&rules, "64:ff9b::8.8.8.8"), None);
        // IPv4-compatible (deprecated): refused whatever the IPv4 inside.
        for compatible in ["::127.0.0.1", "::169.254.169.254", "::10.0.0.1", "::8.8.8.8"] {
            assert_eq!(refusal(&rules, compatible), refused("IPv4-compatible (deprecated)"), "{compatible}");
        }
        // IPv4-translated (SIIT).
        assert_eq!(refusal(&rules, "::ffff:0:127.0.0.1"), refused("IPv4-translated"));
        // Local-use NAT64: the position of the IPv4 depends on the operator's prefix.
        assert_eq!(refusal(&rules, "64:ff9b:1::7f00:1"), refused("local-use NAT64"));
        assert_eq!(refusal(&rules, "64:ff9b:1:7f00:1::"), refused("local-use NAT64"));
        // 6to4 (2002:AABB:CCDD::/48 embeds AA.BB.CC.DD): the whole range is refused, so an
        // embedded loopback, metadata or private address is refused, and a public one too.
        for six_to_four in ["2002:7f00:1::1", "2002:a9fe:a9fe::1", "2002:a00:1::1", "2002:808:808::1"] {
            assert_eq!(refusal(&rules, six_to_four), refused("6to4 (embeds an IPv4 address)"), "{six_to_four}");
        }
        // Teredo (2001:0::/32 embeds the server's and the obfuscated client's IPv4 addresses).
        for teredo in ["2001:0:7f00:1::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"] {
            assert_eq!(refusal(&rules, teredo), refused("Teredo (embeds IPv4 addresses)"), "{teredo}");
        }
        assert_eq!(refusal(&rules, "2001:2::1"), refused("IETF protocol assignments"));
    }

    #[test]
    fn exceptions_are_explicit() {
        let with_loopback = AddressRules::new(&loopback_policy());
        assert!(with_loopback.permits("127.0.0.1".parse().unwrap()));
        assert!(with_loopback.permits("::1".parse().unwrap()));
        assert!(with_loopback.permits("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!with_loopback.permits("10.0.0.1".parse().unwrap()));
        assert!(!with_loopback.permits("169.254.169.254".parse().unwrap()));
        assert!(!with_loopback.permits("::127.0.0.1".parse().unwrap()));
        let with_exception = AddressRules::new(&EgressPolicy {
            allowed_networks: vec!["10.9.0.0/16".parse().unwrap(), "fd00:1::/32".parse().unwrap()],
            ..EgressPolicy::default()
        });
        assert!(with_exception.permits("10.9.1.1".parse().unwrap()));
        assert!(with_exception.permits("::ffff:10.9.1.1".parse().unwrap()));
        assert!(with_exception.permits("fd00:1::5".parse().unwrap()));
        assert!(!with_exception.permits("10.8.1.1".parse().unwrap()));
        assert!(!with_exception.permits("fd00:2::5".parse().unwrap()));
        assert!(!with_exception.permits("127.0.0.1".parse().unwrap()));
        assert!(!with_exception.permits("169.254.169.254".parse().unwrap()));
    }

    #[test]
    fn urls_are_checked_before_any_request() {
        let strict = guard(EgressPolicy::default());
        let check = |g: &EgressGuard, url: &str| g.check_url(&Url::parse(url).unwrap());
        let loopback = Err(EgressError::AddressNotAllowed(AddressRefusal { reason: "loopback", embedded_in: None }));
        assert_eq!(check(&strict, "http://example.com/x"), Err(EgressError::UrlNotAllowed("plain http")));
        assert_eq!(check(&strict, "ftp://example.com/x"), Err(EgressError::UrlNotAllowed("scheme")));
        assert_eq!(check(&strict, "file:///etc/passwd"), Err(EgressError::UrlNotAllowed("scheme")));
        assert_eq!(check(&strict, "javascript:alert(1)"), Err(EgressError::UrlNotAllowed("scheme")));
        assert_eq!(check(&strict, "data:text/plain,x"), Err(EgressError::UrlNotAllowed("scheme")));
        assert_eq!(
            check(&strict, "https://u:p@example.com/x"),
            Err(EgressError::UrlNotAllowed("credentials in the URL"))
        );
        assert_eq!(check(&strict, "https://127.0.0.1/x"), loopback);
        assert_eq!(
            check(&strict, "https://[::ffff:169.254.169.254]/x"),
            Err(EgressError::AddressNotAllowed(AddressRefusal {
                reason: "link-local (cloud metadata service)",
                embedded_in: Some("IPv4-mapped")
            }))
        );
        assert_eq!(check(&strict, "http://127.0.0.1:9/x"), Err(EgressError::UrlNotAllowed("plain http")));
        assert_eq!(check(&strict, "https://example.com/x"), Ok(()));
        let tests = guard(loopback_policy());
        assert_eq!(check(&tests, "http://127.0.0.1:9/x"), Ok(()));
        assert_eq!(check(&tests, "http://localhost:9/x"), Ok(()));
        assert_eq!(check(&tests, "http://example.com/x"), Err(EgressError::UrlNotAllowed("plain http")));
        assert_eq!(check(&tests, "http://10.0.0.1/x"), Err(EgressError::UrlNotAllowed("plain http")));
    }

    #[test]
    fn numeric_host_forms_are_normalized_then_refused() {
        // The WHATWG URL parser turns every IPv4 spelling into the dotted form, so the guard sees
        // an IP literal (never a name the system resolver might read differently).
        let strict = guard(EgressPolicy::default());
        for (url, host) in [
            ("https://2130706433/", "127.0.0.1"),
            ("https://0x7f000001/", "127.0.0.1"),
            ("https://0x7f.1/", "127.0.0.1"),
            ("https://0177.0.0.1/", "127.0.0.1"),
            ("https://017700000001/", "127.0.0.1"),
            ("https://127.1/", "127.0.0.1"),
            ("https://127.0.0.1./", "127.0.0.1"),
            ("https://0/", "0.0.0.0"),
            ("https://[::ffff:127.0.0.1]/", "[::ffff:7f00:1]"),
            ("https://[::ffff:7f00:1]/", "[::ffff:7f00:1]"),
            ("https://[0:0:0:0:0:ffff:127.0.0.1]/", "[::ffff:7f00:1]"),
            ("https://[::127.0.0.1]/", "[::7f00:1]"),
            ("https://%31%32%37.0.0.1/", "127.0.0.1"),
            ("https://2852039166/", "169.254.169.254"),
            ("https://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"),
        ] {
            let parsed = Url::parse(url).unwrap();
            assert_eq!(parsed.host_str(), Some(host), "{url}");
            assert!(matches!(strict.check_url(&parsed), Err(EgressError::AddressNotAllowed(_))), "{url}");
            let plain = Url::parse(&url.replacen("https", "http", 1)).unwrap();
            assert_eq!(strict.check_url(&plain), Err(EgressError::UrlNotAllowed("plain http")), "{url}");
        }
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_connect() {
        // `localhost` is resolved by our resolver, which refuses the loopback answer.
        let server = MockServer::start().await;
        let strict = guard(EgressPolicy { allow_loopback: false, ..EgressPolicy::default() });
        let url = Url::parse(&format!("https://localhost:{}/doc", server.address().port())).unwrap();
        assert!(matches!(
            strict.get(&url, "application/json").await,
            Err(EgressError::AddressNotAllowed(AddressRefusal { reason: "loopback", .. }))
        ));
    }

    #[tokio::test]
    async fn fetches_within_the_caps() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/small"))
            .respond_with(
                ResponseTemplate::new(200).set_body_string("{}").insert_header("content-type", "application/json"),
            )
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/big"))
            .respond_with(ResponseTemplate::new(200).set_body_string("x".repeat(2048)))
            .mount(&server)
            .await;
        let small = guard(EgressPolicy { max_body_bytes: 1024, ..loopback_policy() });
        let fetched = small.get(&Url::parse(&format!("{}/small", server.uri())).unwrap(), "application/json").await;
        let fetched = fetched.unwrap();
        assert_eq!((fetched.status, fetched.body.as_slice()), (200, b"{}".as_slice()));
        let big = small.get(&Url::parse(&format!("{}/big", server.uri())).unwrap(), "*/*").await;
        assert_eq!(big.unwrap_err(), EgressError::TooLarge);
    }

    #[tokio::test]
    async fn every_redirect_hop_is_checked() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/to-metadata-service"))
            .respond_with(ResponseTemplate::new(302).insert_header("location", "http://169.254.169.254/latest"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/to-private"))
            .respond_with(ResponseTemplate::new(307).insert_header("location", "http://10.0.0.7/x"))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/to-self"))
            .respond_with(ResponseTemplate::new(301).insert_header("location", "/final"))
            .mount(&server)
            .await;
        Mock::given(method("GET")).and(path("/final")).respond_with(ResponseTemplate::new(200)).mount(&server).await;
        let follows = guard(loopback_policy());
        let at = |p: &str| Url::parse(&format!("{}{p}", server.uri())).unwrap();
        assert_eq!(
            follows.get(&at("/to-metadata-service"), "*/*").await.unwrap_err(),
            EgressError::UrlNotAllowed("plain http")
        );
        let https_redirect = ResponseTemplate::new(302).insert_header("location", "https://10.0.0.7/x");
        Mock::given(method("GET")).and(path("/to-private-https")).respond_with(https_redirect).mount(&server).await;
        assert!(matches!(
            follows.get(&at("/to-private-https"), "*/*").await,
            Err(EgressError::AddressNotAllowed(AddressRefusal { reason: "private-use", .. }))
        ));
        assert!(follows.get(&at("/to-private"), "*/*").await.is_err());
        assert_eq!(follows.get(&at("/to-self"), "*/*").await.unwrap().url.path(), "/final");
        let refuses = guard(EgressPolicy { max_redirects: 0, ..loopback_policy() });
        assert_eq!(refuses.get(&at("/to-self"), "*/*").await.unwrap_err(), EgressError::RedirectRefused);
    }
}
