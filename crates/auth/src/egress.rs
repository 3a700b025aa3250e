//! The egress guard: the one way Palisade fetches a URL that someone else chose (a client's
//! metadata document today; upstream servers and their credentials endpoints later), so that
//! such a URL cannot turn the server into a proxy into its own network (SSRF).
//!
//! What a fetch through [`EgressGuard::get`] is held to:
//! - **https only.** Plain http only to a loopback host, and only when the policy allows loopback
//!   (tests). No user name or password in the URL.
//! - **Public addresses only.** Every address a host name resolves to is checked, and the name is
//!   refused if *any* of them is private, loopback, link-local, shared, documentation, multicast,
//!   reserved or otherwise special (IPv4-mapped and NAT64 IPv6 addresses are judged by the IPv4
//!   address inside). The connection then goes to exactly the checked addresses (our resolver
//!   hands them to the HTTP client), so a second DNS answer cannot swap them. IP-literal hosts are
//!   checked the same way. Ranges come from the `ipnet` crate; exceptions are explicit
//!   ([`EgressPolicy::allow_loopback`], [`EgressPolicy::allowed_networks`]).
//! - **Redirects** are refused unless [`EgressPolicy::max_redirects`] allows some; each hop is
//!   then checked like the first URL before anything is sent to it.
//! - **Bounded.** One deadline for the whole fetch including redirects; the body is counted on
//!   the wire and refused past [`EgressPolicy::max_body_bytes`] (a lying `Content-Length` does
//!   not matter). No proxy from the environment, no cookies.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

/// The address ranges no fetch may reach unless explicitly allowed (IANA special-purpose
/// registries, plus multicast and the IPv4 broadcast address).
const BLOCKED_NETWORKS: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.31.196.0/24",
    "192.52.193.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "192.175.48.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// Loopback ranges, allowed only with [`EgressPolicy::allow_loopback`].
const LOOPBACK_NETWORKS: &[&str] = &["127.0.0.0/8", "::1/128"];

/// Limits and exceptions of one guard. The defaults suit fetching small documents from the
/// public internet.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    /// Allow loopback addresses, and plain http to a loopback host. For tests only.
    pub allow_loopback: bool,
    /// Further ranges that may be reached although they are special (explicit exceptions).
    pub allowed_networks: Vec<IpNet>,
    /// Largest body accepted, counted on the wire. Default 64 KiB.
    pub max_body_bytes: usize,
    /// Deadline of one whole fetch, redirects included. Default 5 s.
    pub timeout: Duration,
    /// Redirects followed, each re-checked. Default 0: a redirect is refused.
    pub max_redirects: u8,
    /// Extra trust anchors (PEM) besides the platform's, e.g. a test CA.
    pub extra_roots_pem: Option<Vec<u8>>,
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
    #[error("the host's address is not allowed")]
    AddressNotAllowed,
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
    /// The guard could not be built (bad extra roots).
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
    blocked: Vec<IpNet>,
    allowed: Vec<IpNet>,
}

impl AddressRules {
    fn new(policy: &EgressPolicy) -> Self {
        let parse = |list: &[&str]| -> Vec<IpNet> { list.iter().filter_map(|s| IpNet::from_str(s).ok()).collect() };
        let mut allowed = policy.allowed_networks.clone();
        if policy.allow_loopback {
            allowed.extend(parse(LOOPBACK_NETWORKS));
        }
        Self { blocked: parse(BLOCKED_NETWORKS), allowed }
    }

    fn permits(&self, address: IpAddr) -> bool {
        // IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) are judged by their IPv4.
        let address = match address {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let s = v6.segments();
                    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                        let [a, b] = s[6].to_be_bytes();
                        let [c, d] = s[7].to_be_bytes();
                        IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d))
                    } else {
                        IpAddr::V6(v6)
                    }
                }
            },
            v4 => v4,
        };
        if self.allowed.iter().any(|net| net.contains(&address)) {
            return true;
        }
        !self.blocked.iter().any(|net| net.contains(&address))
    }
}

/// Resolves names for the HTTP client and refuses a name if any of its addresses is not allowed.
struct GuardedResolver {
    rules: Arc<AddressRules>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addresses.is_empty() {
                return Err(Box::new(EgressError::Resolve) as Box<dyn std::error::Error + Send + Sync>);
            }
            if addresses.iter().any(|address| !rules.permits(address.ip())) {
                return Err(Box::new(EgressError::AddressNotAllowed) as Box<dyn std::error::Error + Send + Sync>);
            }
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
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(policy.timeout)
            .connect_timeout(policy.timeout)
            .dns_resolver(GuardedResolver { rules: rules.clone() })
            .user_agent(concat!("palisade/", env!("CARGO_PKG_VERSION")));
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
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressError::UrlNotAllowed("credentials in the URL"));
        }
        let host = url.host().ok_or(EgressError::UrlNotAllowed("no host"))?;
        let literal = match host {
            url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
            url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
            url::Host::Domain(_) => None,
        };
        match url.scheme() {
            "https" => {}
            "http" => {
                let loopback = match host {
                    url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
                    _ => literal.is_some_and(|ip| ip.is_loopback()),
                };
                if !(self.policy.allow_loopback && loopback) {
                    return Err(EgressError::UrlNotAllowed("plain http"));
                }
            }
            _ => return Err(EgressError::UrlNotAllowed("scheme")),
        }
        if let Some(ip) = literal
            && !self.rules.permits(ip)
        {
            return Err(EgressError::AddressNotAllowed);
        }
        Ok(())
    }

    /// GETs `url` under the policy, with `accept` as the `Accept` header.
    pub async fn get(&self, url: &Url, accept: &str) -> Result<Fetched, EgressError> {
        match tokio::time::timeout(self.policy.timeout, self.get_inner(url.clone(), accept)).await {
            Ok(result) => result,
            Err(_) => Err(EgressError::Timeout),
        }
    }

    async fn get_inner(&self, mut url: Url, accept: &str) -> Result<Fetched, EgressError> {
        let mut redirects = 0u8;
        loop {
            self.check_url(&url)?;
            let mut response =
                self.client.get(url.clone()).header("accept", accept).send().await.map_err(classify_error)?;
            let status = response.status();
            if status.is_redirection() {
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
            return Ok(Fetched { url, status: status.as_u16(), content_type, body });
        }
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

    #[test]
    fn special_addresses_are_refused_and_public_ones_allowed() {
        let rules = AddressRules::new(&EgressPolicy::default());
        for blocked in [
            "127.0.0.1",
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
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "ff02::1",
        ] {
            assert!(!rules.permits(blocked.parse().unwrap()), "{blocked}");
        }
        for public in ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(rules.permits(public.parse().unwrap()), "{public}");
        }
        let with_loopback = AddressRules::new(&loopback_policy());
        assert!(with_loopback.permits("127.0.0.1".parse().unwrap()));
        assert!(with_loopback.permits("::1".parse().unwrap()));
        assert!(!with_loopback.permits("10.0.0.1".parse().unwrap()));
        let with_exception = AddressRules::new(&EgressPolicy {
            allowed_networks: vec!["10.9.0.0/16".parse().unwrap()],
            ..EgressPolicy::default()
        });
        assert!(with_exception.permits("10.9.1.1".parse().unwrap()));
        assert!(!with_exception.permits("10.8.1.1".parse().unwrap()));
    }

    #[test]
    fn urls_are_checked_before_any_request() {
        let strict = guard(EgressPolicy::default());
        let check = |g: &EgressGuard, url: &str| g.check_url(&Url::parse(url).unwrap());
        assert_eq!(check(&strict, "http://example.com/x"), Err(EgressError::UrlNotAllowed("plain http")));
        assert_eq!(check(&strict, "ftp://example.com/x"), Err(EgressError::UrlNotAllowed("scheme")));
        assert_eq!(
            check(&strict, "https://u:p@example.com/x"),
            Err(EgressError::UrlNotAllowed("credentials in the URL"))
        );
        assert_eq!(check(&strict, "https://127.0.0.1/x"), Err(EgressError::AddressNotAllowed));
        assert_eq!(check(&strict, "https://[::ffff:169.254.169.254]/x"), Err(EgressError::AddressNotAllowed));
        assert_eq!(check(&strict, "http://127.0.0.1:9/x"), Err(EgressError::UrlNotAllowed("plain http")));
        assert_eq!(check(&strict, "https://example.com/x"), Ok(()));
        let tests = guard(loopback_policy());
        assert_eq!(check(&tests, "http://127.0.0.1:9/x"), Ok(()));
        assert_eq!(check(&tests, "http://example.com/x"), Err(EgressError::UrlNotAllowed("plain http")));
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_connect() {
        // `localhost` is resolved by our resolver, which refuses the loopback answer.
        let server = MockServer::start().await;
        let strict = guard(EgressPolicy { allow_loopback: false, ..EgressPolicy::default() });
        let url = Url::parse(&format!("https://localhost:{}/doc", server.address().port())).unwrap();
        assert_eq!(strict.get(&url, "application/json").await.unwrap_err(), EgressError::AddressNotAllowed);
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
        assert_eq!(follows.get(&at("/to-private-https"), "*/*").await.unwrap_err(), EgressError::AddressNotAllowed);
        assert!(follows.get(&at("/to-private"), "*/*").await.is_err());
        assert_eq!(follows.get(&at("/to-self"), "*/*").await.unwrap().url.path(), "/final");
        let refuses = guard(EgressPolicy { max_redirects: 0, ..loopback_policy() });
        assert_eq!(refuses.get(&at("/to-self"), "*/*").await.unwrap_err(), EgressError::RedirectRefused);
    }
}
