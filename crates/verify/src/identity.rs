//! Identity files (TOML): who the verifier calls as, and how it gets each token (inline, a file,
//! a command's stdout, or the client credentials grant at an authorization server); which
//! identity is "another caller" than the first ([`Other`], the one notion every module uses);
//! and the redactor every transcript and report passes through, so no token ever reaches an
//! output.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A bearer token. Its `Debug` never shows it; [`Token::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token string (trimmed).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into().trim().to_owned())
    }

    /// The token itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token([redacted])")
    }
}

/// One identity the verifier calls as.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Its name in reports (`alice`).
    pub name: String,
    /// A valid token for the target.
    pub token: Token,
    /// The tenant it belongs to, when known.
    pub tenant: Option<String>,
    /// The OAuth client it uses, when known.
    pub client: Option<String>,
    /// Its subject (`sub`), when known.
    pub subject: Option<String>,
    /// An expired token of the same identity.
    pub expired_token: Option<Token>,
    /// A token the same authorization server issued for another resource.
    pub other_resource_token: Option<Token>,
}

/// Why an identity file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read.
    #[error("identity file {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file is not a valid identity.
    #[error("identity file {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never a token).
        message: String,
    },
    /// Fewer than two identities.
    #[error("at least two identities are required (--identity FILE, twice); {0} given")]
    TooFew(usize),
    /// Two identities share a name.
    #[error("two identities are named {0:?}: names must be unique")]
    DuplicateName(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityFile {
    name: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
    token_command: Option<Vec<String>>,
    client_credentials: Option<crate::grant::ClientCredentials>,
    tenant: Option<String>,
    client: Option<String>,
    subject: Option<String>,
    expired_token: Option<String>,
    other_resource_token: Option<String>,
}

impl std::fmt::Debug for IdentityFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityFile").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads an identity file and gets its token; a relative `token_file` or
    /// `client_credentials.client_secret_file` is relative to the file's directory, and a
    /// client credentials grant asks for a token for `target` (RFC 8707) within `timeout`.
    pub async fn load(path: &Path, target: &url::Url, timeout: std::time::Duration) -> Result<Self, IdentityError> {
        let read = |message: String| IdentityError::Read { path: path.to_owned(), message };
        let invalid = |message: String| IdentityError::Invalid { path: path.to_owned(), message };
        let text = std::fs::read_to_string(path).map_err(|error| read(error.to_string()))?;
        // toml's messages quote the offending line, which may hold a token: name the problem only.
        let file: IdentityFile = toml::from_str(&text).map_err(|error| invalid(toml_message(&error)))?;
        if file.name.trim().is_empty() {
            return Err(invalid("`name` must not be empty".into()));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let sources = [
            file.token.is_some(),
            file.token_file.is_some(),
            file.token_command.is_some(),
            file.client_credentials.is_some(),
        ];
        let token = match (file.token, file.token_file, file.token_command, file.client_credentials) {
            _ if sources.iter().filter(|given| **given).count() != 1 => {
                return Err(invalid(
                    "exactly one of `token`, `token_file`, `token_command`, `[client_credentials]` is required".into(),
                ));
            }
            (Some(token), ..) => token,
            (_, Some(file), ..) => {
                let file = if file.is_relative() { dir.join(file) } else { file };
                std::fs::read_to_string(&file)
                    .map_err(|error| invalid(format!("token_file {}: {error}", file.display())))?
            }
            (_, _, Some(command), _) => run_token_command(&command).map_err(invalid)?,
            (_, _, _, Some(grant)) => {
                crate::grant::client_credentials(&grant, dir, target, timeout).await.map_err(invalid)?
            }
            (None, None, None, None) => return Err(invalid("no token".into())),
        };
        let token = Token::new(token);
        if token.expose().is_empty() || token.expose().chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("the token is empty or contains whitespace".into()));
        }
        Ok(Self {
            name: file.name,
            token,
            tenant: file.tenant,
            client: file.client,
            subject: file.subject,
            expired_token: file.expired_token.map(Token::new),
            other_resource_token: file.other_resource_token.map(Token::new),
        })
    }

    /// Every token this identity carries (for the redactor).
    fn tokens(&self) -> impl Iterator<Item = &Token> {
        std::iter::once(&self.token).chain(self.expired_token.as_ref()).chain(self.other_resource_token.as_ref())
    }
}

/// What two identity files say about one attribute (`subject`, `tenant` or `client`): an
/// attribute either file leaves out is unknown, never taken as equal nor as different.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// Both declare it, equal.
    Same,
    /// Both declare it, different.
    Different,
    /// At least one does not declare it.
    Unknown,
}

impl Relation {
    /// The relation of two declared-or-not values.
    pub fn of(a: Option<&str>, b: Option<&str>) -> Self {
        match (a, b) {
            (Some(a), Some(b)) if a == b => Self::Same,
            (Some(_), Some(_)) => Self::Different,
            _ => Self::Unknown,
        }
    }

    /// Preference when several identities fit: the same first, then unknown, then different.
    fn rank(self) -> u8 {
        match self {
            Self::Same => 0,
            Self::Unknown => 1,
            Self::Different => 2,
        }
    }
}

impl Identity {
    /// How this identity's subject relates to `other`'s.
    pub fn subject_relation(&self, other: &Self) -> Relation {
        Relation::of(self.subject.as_deref(), other.subject.as_deref())
    }

    /// How this identity's tenant relates to `other`'s.
    pub fn tenant_relation(&self, other: &Self) -> Relation {
        Relation::of(self.tenant.as_deref(), other.tenant.as_deref())
    }

    /// How this identity's client relates to `other`'s.
    pub fn client_relation(&self, other: &Self) -> Relation {
        Relation::of(self.client.as_deref(), other.client.as_deref())
    }

    /// Whether `other` is another caller than this identity: their subjects differ, or their
    /// tenants do (as declared; whatever the rest declares or leaves out).
    pub fn is_other_caller(&self, other: &Self) -> bool {
        self.subject_relation(other) == Relation::Different || self.tenant_relation(other) == Relation::Different
    }
}

/// Who a cross-identity check calls as, next to the first identity (the owner of what the check
/// made). One notion for every module: two identities are two callers when their declared
/// subjects (or tenants) differ, whatever else their files declare; where a check needs the same
/// tenant, a tenant not declared is unknown, which the check's detail says, and a tenant
/// declared different is never taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Other {
    /// Any other caller ([`Identity::is_other_caller`]); one of the same tenant preferred.
    Caller,
    /// Another subject, not of a tenant known to differ (one of the same tenant, then the same
    /// client, preferred).
    Subject,
    /// Another tenant (both declared).
    Tenant,
    /// The first identity's subject (both declared) through another client (both declared), not
    /// of a tenant known to differ.
    Client,
}

/// The identity a cross-identity check calls as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherCaller {
    /// Its index among the run's identities.
    pub index: usize,
    /// What the identity files leave unknown that the check's name assumes (a tenant not
    /// declared by both), said in the check's detail.
    pub caveat: Option<String>,
}

impl Other {
    /// The identity of `identities` (after the first) a check of this kind calls as; `Err`: why
    /// none fits (the check is NOT TESTABLE).
    pub fn find(self, identities: &[Identity]) -> Result<OtherCaller, &'static str> {
        let first = identities.first().ok_or("no identity")?;
        let fits = |other: &Identity| {
            let (subject, tenant, client) =
                (first.subject_relation(other), first.tenant_relation(other), first.client_relation(other));
            match self {
                Self::Caller => first.is_other_caller(other),
                Self::Subject => subject == Relation::Different && tenant != Relation::Different,
                Self::Tenant => tenant == Relation::Different,
                Self::Client => {
                    subject == Relation::Same && client == Relation::Different && tenant != Relation::Different
                }
            }
        };
        let rank = |other: &Identity| (first.tenant_relation(other).rank(), first.client_relation(other).rank());
        let (index, other) = identities
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, other)| fits(other))
            .min_by_key(|(i, other)| (rank(other), *i))
            .ok_or_else(|| self.missing())?;
        let caveat = (matches!(self, Self::Subject | Self::Client)
            && first.tenant_relation(other) == Relation::Unknown)
            .then(|| {
                format!(
                    "the identity files of {} and {} do not both declare a `tenant`: whether they share one is unknown",
                    first.name, other.name
                )
            });
        Ok(OtherCaller { index, caveat })
    }

    /// Why no identity fits.
    fn missing(self) -> &'static str {
        match self {
            Self::Caller => {
                "no identity of another subject or tenant than the first's (the identity files' `subject`, `tenant`)"
            }
            Self::Subject => {
                "no identity of another subject than the first's, not of another tenant (the identity files' `subject`, `tenant`)"
            }
            Self::Tenant => "no identity of another tenant than the first's (the identity files' `tenant`)",
            Self::Client => {
                "no identity of the first identity's subject through another client (the identity files' `subject`, `client`)"
            }
        }
    }
}

/// The identities of a run: at least two, unique names.
pub fn check_identities(identities: &[Identity]) -> Result<(), IdentityError> {
    if identities.len() < 2 {
        return Err(IdentityError::TooFew(identities.len()));
    }
    for (i, identity) in identities.iter().enumerate() {
        if identities[..i].iter().any(|other| other.name == identity.name) {
            return Err(IdentityError::DuplicateName(identity.name.clone()));
        }
    }
    Ok(())
}

fn toml_message(error: &toml::de::Error) -> String {
    let span = error.span().map(|span| format!(" (bytes {}..{})", span.start, span.end)).unwrap_or_default();
    format!("not a valid identity{span}: {}", error.message())
}

/// Runs `token_command` (no shell) and returns its stdout.
fn run_token_command(command: &[String]) -> Result<String, String> {
    let (program, args) = command.split_first().ok_or("`token_command` must name a program")?;
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|error| format!("token_command {program:?}: {error}"))?;
    if !output.status.success() {
        return Err(format!("token_command {program:?} exited with {}", output.status));
    }
    String::from_utf8(output.stdout).map_err(|_| format!("token_command {program:?} printed a non-UTF-8 token"))
}

/// Replaces every token of a run in any text with `[redacted:<identity>]`.
/// Clones share the secrets added later with [`Redactor::add`] (forged tokens of a run).
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<(String, String)>,
    added: std::sync::Arc<std::sync::RwLock<Vec<(String, String)>>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for every token of `identities`.
    pub fn new(identities: &[Identity]) -> Self {
        let mut secrets: Vec<(String, String)> = identities
            .iter()
            .flat_map(|identity| identity.tokens().map(|token| (token.expose().to_owned(), identity.name.clone())))
            .flat_map(|(secret, name)| with_segments(&secret).into_iter().map(move |piece| (piece, name.clone())))
            .collect();
        // Longest first, so a token that contains another is replaced whole.
        secrets.sort_by_key(|(secret, _)| std::cmp::Reverse(secret.len()));
        Self { secrets, added: Default::default() }
    }

    /// Adds a secret made during the run (a token forged from a real one), shared by every
    /// clone of this redactor: it and each of its long dot-separated segments are redacted as
    /// `[redacted:<name>]` from now on.
    pub fn add(&self, secret: &str, name: &str) {
        let mut added = self.added.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        for piece in with_segments(secret) {
            if !added.iter().any(|(known, _)| *known == piece) {
                added.push((piece, name.to_owned()));
            }
        }
    }

    /// `text` with every token replaced.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        let added = self.added.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut secrets: Vec<&(String, String)> = self.secrets.iter().chain(added.iter()).collect();
        secrets.sort_by_key(|(secret, _)| std::cmp::Reverse(secret.len()));
        for (secret, name) in &secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), &format!("[redacted:{name}]"));
            }
        }
        // A transcript shortens long bodies and header values (ending them with `…`), and a
        // secret cut there is no longer whole: any run of its first PREFIX_REDACTED or more
        // characters goes too.
        if text.contains('…') {
            for (secret, name) in &secrets {
                text = redact_prefixes(&text, secret, name);
            }
        }
        text
    }
}

/// How many leading characters of a secret, seen without the rest, are still redacted.
const PREFIX_REDACTED: usize = 12;

/// `text` with every run of `secret`'s first [`PREFIX_REDACTED`] characters or more replaced.
fn redact_prefixes(text: &str, secret: &str, name: &str) -> String {
    let Some(head) = secret.get(..PREFIX_REDACTED).filter(|_| secret.len() > PREFIX_REDACTED) else {
        return text.to_owned();
    };
    if !text.contains(head) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(head) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let matched = tail.bytes().zip(secret.bytes()).take_while(|(a, b)| a == b).count();
        out.push_str(&format!("[redacted:{name}]"));
        rest = &tail[matched..];
    }
    out.push_str(rest);
    out
}

/// A secret and, when it is dot-separated (a JWT), each segment of 16 characters or more: a
/// forged token reuses a real token's segments, and a server may echo one of them alone.
fn with_segments(secret: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    if !secret.is_empty() {
        pieces.push(secret.to_owned());
    }
    if secret.contains('.') {
        pieces.extend(secret.split('.').filter(|segment| segment.len() >= 16).map(str::to_owned));
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("palisade-verify-identity-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_secret_cut_short_in_a_transcript_is_redacted_too() {
        let redactor = Redactor::new(&[]);
        let id = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345";
        redactor.add(id, "task-alice");
        let text = format!("full {id} and cut ABCDEFGHIJKLMN… (900 bytes) and short ABCDEFGHIJK");
        assert_eq!(
            redactor.redact(&text),
            "full [redacted:task-alice] and cut [redacted:task-alice]… (900 bytes) and short ABCDEFGHIJK"
        );
        // Cut in a header value too (also shortened with `…`).
        assert_eq!(redactor.redact("< location: /x?id=ABCDEFGHIJKLMNOP…"), "< location: /x?id=[redacted:task-alice]…");
        assert_eq!(redactor.redact("nothing here"), "nothing here");
    }

    fn target() -> url::Url {
        url::Url::parse("http://127.0.0.1:9/mcp").unwrap()
    }

    async fn load(path: &Path) -> Result<Identity, IdentityError> {
        Identity::load(path, &target(), std::time::Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn each_token_source_loads_and_debug_hides_the_token() {
        let dir = temp_dir("sources");
        let inline = write(&dir, "a.toml", "name = \"a\"\ntoken = \"tok-inline-1\"\ntenant = \"t1\"\n");
        write(&dir, "b.token", "tok-file-2\n");
        let file = write(&dir, "b.toml", "name = \"b\"\ntoken_file = \"b.token\"\n");
        let command = write(&dir, "c.toml", "name = \"c\"\ntoken_command = [\"echo\", \"tok-cmd-3\"]\n");
        let a = load(&inline).await.unwrap();
        let b = load(&file).await.unwrap();
        let c = load(&command).await.unwrap();
        assert_eq!((a.token.expose(), a.tenant.as_deref()), ("tok-inline-1", Some("t1")));
        assert_eq!(b.token.expose(), "tok-file-2");
        assert_eq!(c.token.expose(), "tok-cmd-3");
        assert!(!format!("{a:?}{b:?}{c:?}").contains("tok-"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn bad_files_are_refused_without_quoting_the_token() {
        let dir = temp_dir("bad");
        let two = write(&dir, "two.toml", "name = \"a\"\ntoken = \"tok-secret-9\"\ntoken_file = \"x\"\n");
        let typo = write(&dir, "typo.toml", "name = \"a\"\ntoken = \"tok-secret-9\"\ntennant = \"x\"\n");
        let none = write(&dir, "none.toml", "name = \"a\"\n");
        let failing = write(&dir, "fail.toml", "name = \"a\"\ntoken_command = [\"false\"]\n");
        for path in [two, typo, none, failing] {
            let error = load(&path).await.unwrap_err().to_string();
            assert!(!error.contains("tok-secret-9"), "{error}");
            assert!(error.contains("identity file"), "{error}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A token endpoint that checks the grant as RFC 6749 §4.4 and RFC 8707 want it, answering
    /// `answer` (status, body) when they hold and 400 `invalid_request` otherwise.
    async fn token_endpoint(answer: (u16, &'static str)) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use axum::http::{HeaderMap, StatusCode};
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let log = log.clone();
                async move {
                    let basic =
                        headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                    log.lock().unwrap().push(format!("{basic} {body}"));
                    // "client:id" / "s&cret" form-encoded, then joined and base64-encoded.
                    let expected_basic = format!("Basic {}", STANDARD.encode("client%3Aid:s%26cret"));
                    let expected_body =
                        "grant_type=client_credentials&resource=http%3A%2F%2F127.0.0.1%3A9%2Fmcp&scope=shop%3Aread";
                    if basic != expected_basic || body != expected_body {
                        return (StatusCode::BAD_REQUEST, r#"{"error":"invalid_request"}"#.to_owned());
                    }
                    (StatusCode::from_u16(answer.0).unwrap(), answer.1.to_owned())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{address}/token"), seen)
    }

    fn grant_file(dir: &Path, name: &str, token_url: &str) -> PathBuf {
        write(dir, "secret", "s&cret\n");
        let text = format!(
            "name = \"{name}\"\n[client_credentials]\ntoken_url = \"{token_url}\"\nclient_id = \"client:id\"\n\
             client_secret_file = \"secret\"\nscope = \"shop:read\"\n"
        );
        write(dir, &format!("{name}.toml"), &text)
    }

    #[tokio::test]
    async fn a_client_credentials_grant_asks_for_the_target_and_fails_closed() {
        let dir = temp_dir("grant");
        let (url, seen) =
            token_endpoint((200, r#"{"access_token":"tok-granted-7","token_type":"Bearer","expires_in":60}"#)).await;
        let identity = load(&grant_file(&dir, "ok", &url)).await.unwrap();
        assert_eq!(identity.token.expose(), "tok-granted-7");
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Refused by the server, another token type, no token: errors that carry no secret.
        for (answer, expected) in [
            ((401, r#"{"error":"invalid_client","error_description":"s&cret is wrong"}"#), "HTTP 401 (invalid_client)"),
            ((200, r#"{"access_token":"tok-dpop-8","token_type":"DPoP"}"#), "of type DPoP, not Bearer"),
            ((200, r#"{"token_type":"Bearer"}"#), "has no access_token"),
            ((200, "not json"), "not a JSON token response"),
        ] {
            let (url, _) = token_endpoint(answer).await;
            let error = load(&grant_file(&dir, "bad", &url)).await.unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(!error.contains("s&cret") && !error.contains("tok-"), "{error}");
        }
        // The secret never goes to a plain-http endpoint off loopback: refused before sending.
        let error = load(&grant_file(&dir, "remote", "http://auth.example.com/token")).await.unwrap_err().to_string();
        assert!(error.contains("must be https://"), "{error}");
        // The secret is the file's, trimmed, and both or neither secret source is refused.
        let both = write(
            &dir,
            "both.toml",
            "name = \"b\"\n[client_credentials]\ntoken_url = \"https://a/t\"\nclient_id = \"c\"\nclient_secret = \"x\"\nclient_secret_file = \"secret\"\n",
        );
        assert!(load(&both).await.unwrap_err().to_string().contains("exactly one of `client_secret`"));
        let also_token = write(
            &dir,
            "tok.toml",
            "name = \"t\"\ntoken = \"tok-9\"\n[client_credentials]\ntoken_url = \"https://a/t\"\nclient_id = \"c\"\n",
        );
        assert!(load(&also_token).await.unwrap_err().to_string().contains("exactly one of"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_redactor_removes_every_token_and_two_identities_are_required() {
        let identity = |name: &str, token: &str| Identity {
            name: name.into(),
            token: Token::new(token),
            tenant: None,
            client: None,
            subject: None,
            expired_token: Some(Token::new(format!("{token}-expired"))),
            other_resource_token: None,
        };
        let identities = [identity("alice", "aaa.bbb.ccc"), identity("bob", "ddd.eee.fff")];
        let redactor = Redactor::new(&identities);
        let text = "Bearer aaa.bbb.ccc and ddd.eee.fff and aaa.bbb.ccc-expired";
        let redacted = redactor.redact(text);
        assert_eq!(redacted, "Bearer [redacted:alice] and [redacted:bob] and [redacted:alice]");
        assert!(check_identities(&identities[..1]).is_err());
        assert!(check_identities(&[identity("a", "x"), identity("a", "y")]).is_err());
        assert!(check_identities(&identities).is_ok());
    }

    fn who(name: &str, subject: Option<&str>, tenant: Option<&str>, client: Option<&str>) -> Identity {
        Identity {
            name: name.into(),
            token: Token::new(format!("tok-{name}")),
            tenant: tenant.map(str::to_owned),
            client: client.map(str::to_owned),
            subject: subject.map(str::to_owned),
            expired_token: None,
            other_resource_token: None,
        }
    }

    #[test]
    fn another_caller_is_a_declared_other_subject_or_tenant_and_an_unknown_tenant_is_said() {
        // Subject only: two subjects are two callers; the tenant is unknown, never assumed equal.
        let pair = [who("alice", Some("alice"), None, None), who("bob", Some("bob"), None, None)];
        assert_eq!(Other::Caller.find(&pair).unwrap(), OtherCaller { index: 1, caveat: None });
        let subject = Other::Subject.find(&pair).unwrap();
        assert_eq!(subject.index, 1);
        assert!(subject.caveat.unwrap().contains("whether they share one is unknown"));
        assert!(Other::Tenant.find(&pair).is_err());
        assert!(Other::Client.find(&pair).is_err());
        // Nothing declared: not known to be another caller.
        let anonymous = [who("a", None, None, None), who("b", None, None, None)];
        for kind in [Other::Caller, Other::Subject, Other::Tenant, Other::Client] {
            assert!(kind.find(&anonymous).is_err(), "{kind:?}");
        }
        // Tenants declared: the same tenant is preferred, a different one is never "another
        // subject", and another tenant is another caller whatever the subjects say.
        let many = [
            who("alice", Some("alice"), Some("t1"), Some("c1")),
            who("carol", Some("carol"), Some("t2"), Some("c2")),
            who("erin", Some("erin"), None, Some("c1")),
            who("dave", Some("dave"), Some("t1"), Some("c2")),
            who("alice-cli", Some("alice"), Some("t1"), Some("c2")),
        ];
        assert_eq!(Other::Subject.find(&many).unwrap(), OtherCaller { index: 3, caveat: None });
        assert_eq!(Other::Caller.find(&many).unwrap().index, 3);
        assert_eq!(Other::Tenant.find(&many).unwrap().index, 1);
        assert_eq!(Other::Client.find(&many).unwrap(), OtherCaller { index: 4, caveat: None });
        assert!(Other::Subject.find(&many[..2]).is_err(), "another tenant is not another subject of the tenant");
        assert_eq!(Other::Caller.find(&many[..2]).unwrap().index, 1);
        let unknown_subject = [many[0].clone(), who("x", None, Some("t2"), None)];
        assert_eq!(Other::Caller.find(&unknown_subject).unwrap().index, 1);
        assert!(Other::Subject.find(&unknown_subject).is_err());
        let same_subject = [many[0].clone(), who("alice-2", Some("alice"), Some("t1"), Some("c1"))];
        assert!(Other::Caller.find(&same_subject).is_err(), "the same subject, tenant and client");
    }

    #[test]
    fn segments_of_a_jwt_and_tokens_added_later_are_redacted_in_every_clone() {
        let header = "eyJhbGciOiJFUzI1NiJ9headerpart";
        let payload = "eyJzdWIiOiJhbGljZSJ9payloadpart";
        let real = format!("{header}.{payload}.signature-segment-0123456789");
        let alice = Identity {
            name: "alice".into(),
            token: Token::new(real.clone()),
            tenant: None,
            client: None,
            subject: None,
            expired_token: None,
            other_resource_token: None,
        };
        let redactor = Redactor::new(&[alice]);
        let clone = redactor.clone();
        // A segment alone (a server echoing the payload) is redacted too; the whole token first.
        assert_eq!(redactor.redact(&format!("got {payload}")), "got [redacted:alice]");
        assert_eq!(redactor.redact(&real), "[redacted:alice]");
        let forged = format!("eyJhbGciOiJub25lIn0forgedhead.{payload}.");
        redactor.add(&forged, "alice-forged");
        assert_eq!(clone.redact(&format!("echo {forged}!")), "echo [redacted:alice-forged]!");
        assert_eq!(clone.redact("eyJhbGciOiJub25lIn0forgedhead"), "[redacted:alice-forged]");
        // Short segments are not secrets of their own.
        redactor.add("ab.cd", "x");
        assert_eq!(clone.redact("ab and cd"), "ab and cd");
    }
}
