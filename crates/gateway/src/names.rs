//! Exposed names: how an upstream's tool and prompt names and resource URIs appear to clients
//! (`<prefix><separator><upstream name>`, `<prefix>+<uri>`), the reverse mapping, and the checks
//! that keep the mapping unambiguous across upstreams (labels, collisions, shadowed prefixes).
//!
//! **Why the mapping is unambiguous.** A prefix is a DNS-style label (`[a-z0-9-]`, checked by
//! [`check_label`]), so it contains neither separator character (`_`, `.`) nor `+`. For two
//! different prefixes `p` and `q`, `p<sep>` is therefore never a prefix of `q<sep>…`: at the
//! first position where they could overlap one holds the separator and the other a label
//! character. An exposed name or URI names at most one prefixed upstream, and its remainder is
//! the upstream's own name, whatever characters (separators included) that name has. The one
//! remaining ambiguity, an *unprefixed* upstream publishing a name or URI that looks prefixed, is
//! what [`shadows_prefix`] and [`shadows_uri_prefix`] detect: the unprefixed upstream's namer
//! ([`Namer::reserving`] the other upstreams' prefixes) refuses to expose such a name or URI and
//! never maps one back, so a read or call meant for a prefixed upstream cannot reach it.
//! [`collisions`] finds the rest.
//!
//! **MCP Apps' `ui://` URIs** keep their scheme, which hosts require of a UI resource: a prefixed
//! upstream's `ui://get-time/app.html` is exposed as `ui://<prefix>+get-time/app.html` (the
//! prefix and `+` opening the authority, the same alphabet argument as for `<prefix>+…`), every
//! other URI as `<prefix>+<uri>`. A tool's links to its UI (`_meta.ui.resourceUri` and the older
//! `_meta["ui/resourceUri"]`) go through the same mapping ([`Namer::expose_ui_link`]), so a link
//! names exactly the resource a read of it reaches.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// The longest exposed tool or prompt name: what strict clients accept.
pub const MAX_EXPOSED_NAME: usize = 64;

/// The longest exposed resource URI or URI template, in bytes.
pub const MAX_EXPOSED_URI: usize = 2048;

/// The longest upstream id or prefix.
pub const MAX_LABEL: usize = 32;

/// The longest name the MCP spec allows for a tool or prompt.
const MAX_SPEC_NAME: usize = 128;

/// How an MCP Apps UI resource URI starts (the scheme compared without regard to case).
const UI_HEAD: &str = "ui://";

/// The `_meta` key of a tool's UI link in the older, flat form.
pub const UI_LINK_FLAT_KEY: &str = "ui/resourceUri";

/// The separator between prefix and upstream name: `_` (default), `__` or `.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Separator {
    /// `_`
    #[default]
    Underscore,
    /// `__`
    DoubleUnderscore,
    /// `.`
    Dot,
}

impl Separator {
    /// The separator spelled as in the configuration (`"_"`, `"__"` or `"."`); anything else is
    /// `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "_" => Some(Self::Underscore),
            "__" => Some(Self::DoubleUnderscore),
            "." => Some(Self::Dot),
            _ => None,
        }
    }

    /// The separator's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Underscore => "_",
            Self::DoubleUnderscore => "__",
            Self::Dot => ".",
        }
    }
}

/// Checks an upstream id or prefix: DNS-label style, 1 to 32 characters of `[a-z0-9-]`, starting
/// with a letter, not ending with `-`. The error is a fixed reason, for the caller to put after
/// the key it checked.
pub fn check_label(label: &str) -> Result<(), &'static str> {
    let Some(first) = label.bytes().next() else {
        return Err("must not be empty");
    };
    if label.len() > MAX_LABEL {
        return Err("must be at most 32 characters");
    }
    if !label.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-') {
        return Err("may contain only lowercase letters a-z, digits 0-9 and '-'");
    }
    if !first.is_ascii_lowercase() {
        return Err("must start with a lowercase letter a-z");
    }
    if label.ends_with('-') {
        return Err("must not end with '-'");
    }
    Ok(())
}

/// Whether `name` is a valid tool or prompt name per the spec: 1 to 128 of
/// `A-Z a-z 0-9 _ - .`.
pub fn is_spec_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SPEC_NAME
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
}

/// Why a definition's name or URI cannot be exposed. The definition is held with this reason;
/// the rest of its upstream is unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameRefusal {
    /// The upstream's name is not a spec tool/prompt name.
    #[error("the upstream's name is not a valid MCP name (1 to 128 characters of A-Z a-z 0-9 _ - .)")]
    NotSpecName,
    /// The exposed name would exceed [`MAX_EXPOSED_NAME`].
    #[error(
        "the exposed name would be {len} characters, more than the 64 that strict clients accept \
         (a shorter prefix or separator may fit it)"
    )]
    TooLong {
        /// The exposed name's length.
        len: usize,
    },
    /// The URI has no scheme (`scheme:` at its start).
    #[error("the URI has no scheme (it must start with a scheme such as \"file:\" or \"https:\")")]
    UriNoScheme,
    /// The exposed URI would exceed [`MAX_EXPOSED_URI`] bytes.
    #[error("the exposed URI would be {len} bytes, more than the 2048 allowed")]
    UriTooLong {
        /// The exposed URI's length in bytes.
        len: usize,
    },
    /// The URI contains a control character.
    #[error("the URI contains a control character")]
    UriControlChar,
    /// An unprefixed upstream's name lies in a prefixed upstream's namespace.
    #[error("unprefixed name {exposed:?} lies in upstream prefix {prefix:?}'s namespace")]
    ShadowsPrefix {
        /// The name as it would be exposed.
        exposed: String,
        /// The prefix it would shadow.
        prefix: String,
    },
    /// A tool's MCP Apps UI link is unusable: not a string, not a `ui://` URI, or its two
    /// forms (`_meta.ui.resourceUri`, `_meta["ui/resourceUri"]`) name different resources.
    #[error("its MCP Apps UI link {0}")]
    UiLink(&'static str),
    /// An unprefixed upstream's resource URI or template lies in a prefixed upstream's URI
    /// namespace (`<prefix>+…`, the scheme compared without regard to case).
    #[error("unprefixed URI {exposed:?} lies in upstream prefix {prefix:?}'s namespace")]
    UriShadowsPrefix {
        /// The URI as it would be exposed.
        exposed: String,
        /// The prefix it would shadow.
        prefix: String,
    },
}

/// The namer for one upstream: its prefix (or none) and the gateway's separator.
///
/// The prefix is expected to have passed [`check_label`] (configuration validation does this);
/// the reversibility argument of the module docs rests on it.
#[derive(Debug, Clone)]
pub struct Namer {
    /// `"<prefix><separator>"` for names, `None` when unprefixed.
    name_head: Option<String>,
    /// `"<prefix>+"` for URIs, `None` when unprefixed.
    uri_head: Option<String>,
    separator: Separator,
    /// An unprefixed namer's view of the other upstreams' prefixes: names and URIs inside them
    /// are never its own (empty for a prefixed namer, whose namespace is its own by construction).
    reserved: Vec<String>,
}

impl Namer {
    /// The namer of an upstream with `prefix` (`None`: unprefixed, names pass unchanged).
    pub fn new(prefix: Option<&str>, separator: Separator) -> Self {
        Self {
            name_head: prefix.map(|prefix| format!("{prefix}{}", separator.as_str())),
            uri_head: prefix.map(|prefix| format!("{prefix}+")),
            separator,
            reserved: Vec::new(),
        }
    }

    /// This namer, kept out of the namespaces of `prefixes` (the prefixed upstreams' prefixes)
    /// when it is unprefixed: it refuses to expose a name or URI inside one
    /// ([`NameRefusal::ShadowsPrefix`], [`NameRefusal::UriShadowsPrefix`]) and never maps one
    /// back. A prefixed namer is unchanged.
    pub fn reserving(mut self, prefixes: &[String]) -> Self {
        if self.name_head.is_none() {
            self.reserved = prefixes.to_vec();
        }
        self
    }

    /// The exposed tool or prompt name for the upstream's `upstream_name`, or why it cannot be
    /// exposed.
    pub fn expose_name(&self, upstream_name: &str) -> Result<String, NameRefusal> {
        if !is_spec_name(upstream_name) {
            return Err(NameRefusal::NotSpecName);
        }
        let exposed = match &self.name_head {
            Some(head) => format!("{head}{upstream_name}"),
            None => upstream_name.to_owned(),
        };
        if exposed.len() > MAX_EXPOSED_NAME {
            return Err(NameRefusal::TooLong { len: exposed.len() });
        }
        if let Some(prefix) = shadows_prefix(&exposed, &self.reserved, self.separator) {
            return Err(NameRefusal::ShadowsPrefix { prefix: prefix.to_owned(), exposed });
        }
        Ok(exposed)
    }

    /// The reverse of [`Self::expose_name`]: `Some(upstream name)` exactly when `exposed` is what
    /// this namer makes of that name. An unprefixed namer claims every valid exposed name outside
    /// the prefixes it reserves; a router consults the registry's map (or the prefixed namers
    /// first).
    pub fn upstream_name<'a>(&self, exposed: &'a str) -> Option<&'a str> {
        if exposed.len() > MAX_EXPOSED_NAME || !is_spec_name(exposed) {
            return None;
        }
        match &self.name_head {
            Some(head) => exposed.strip_prefix(head.as_str()).filter(|rest| !rest.is_empty()),
            None => shadows_prefix(exposed, &self.reserved, self.separator).is_none().then_some(exposed),
        }
    }

    /// The exposed resource URI or URI template: `"<prefix>+<uri>"` (so `file:///x` becomes
    /// `docs+file:///x`, itself a valid URI whose scheme is `docs+file`), and for an MCP Apps
    /// `ui://` URI `"ui://<prefix>+<rest>"` (the `ui` scheme kept); unprefixed, unchanged.
    /// Refuses a URI without a scheme, with a control character, or longer than
    /// [`MAX_EXPOSED_URI`] bytes once exposed, and, unprefixed, one inside a reserved prefix.
    pub fn expose_uri(&self, upstream_uri: &str) -> Result<String, NameRefusal> {
        check_uri(upstream_uri)?;
        let exposed = match (&self.uri_head, ui_rest(upstream_uri)) {
            (Some(head), Some(rest)) => format!("{}{head}{rest}", &upstream_uri[..UI_HEAD.len()]),
            (Some(head), None) => format!("{head}{upstream_uri}"),
            (None, _) => upstream_uri.to_owned(),
        };
        if exposed.len() > MAX_EXPOSED_URI {
            return Err(NameRefusal::UriTooLong { len: exposed.len() });
        }
        if let Some(prefix) = shadows_uri_prefix(&exposed, &self.reserved) {
            return Err(NameRefusal::UriShadowsPrefix { prefix: prefix.to_owned(), exposed });
        }
        Ok(exposed)
    }

    /// The reverse of [`Self::expose_uri`]: `Some(upstream URI)` exactly when `exposed` is what
    /// this namer makes of that URI (the prefix alphabet has no `+`, so the first `+` splits).
    /// An unprefixed namer never claims a URI inside a reserved prefix: a read of
    /// `<prefix>+…` (or `ui://<prefix>+…`) can only ever reach that prefix's upstream.
    pub fn upstream_uri<'a>(&self, exposed: &'a str) -> Option<Cow<'a, str>> {
        if exposed.len() > MAX_EXPOSED_URI {
            return None;
        }
        let upstream = match &self.uri_head {
            Some(head) => match ui_rest(exposed) {
                Some(rest) => Cow::Owned(format!("{}{}", &exposed[..UI_HEAD.len()], rest.strip_prefix(head.as_str())?)),
                None => Cow::Borrowed(exposed.strip_prefix(head.as_str())?),
            },
            None if shadows_uri_prefix(exposed, &self.reserved).is_some() => return None,
            None => Cow::Borrowed(exposed),
        };
        // Exactly the inverse: `<prefix>+ui://x` is not what a `ui://` URI is exposed as.
        (self.expose_uri(&upstream).ok()? == exposed).then_some(upstream)
    }

    /// Rewrites a tool definition's MCP Apps UI links (`_meta.ui.resourceUri` and the older
    /// `_meta["ui/resourceUri"]`) to the exposed URI of the resource they name; a tool without a
    /// link is unchanged. Refuses what [`ui_link`] refuses and a link that cannot be exposed.
    pub fn expose_ui_link(&self, tool: &mut Map<String, Value>) -> Result<(), NameRefusal> {
        let Some(link) = ui_link(tool)? else { return Ok(()) };
        let exposed = Value::String(self.expose_uri(link)?);
        let Some(Value::Object(meta)) = tool.get_mut("_meta") else { return Ok(()) };
        if let Some(Value::Object(ui)) = meta.get_mut("ui")
            && ui.contains_key("resourceUri")
        {
            ui.insert("resourceUri".into(), exposed.clone());
        }
        if meta.contains_key(UI_LINK_FLAT_KEY) {
            meta.insert(UI_LINK_FLAT_KEY.into(), exposed);
        }
        Ok(())
    }
}

/// The MCP Apps UI resource a tool definition links to, in its upstream's space: its
/// `_meta.ui.resourceUri` or the older `_meta["ui/resourceUri"]` (`None` without either). A link
/// that is not a string or not a `ui://` URI, or two forms naming different resources, are
/// refused: a host could follow either, and only one would be the pinned one.
pub fn ui_link(tool: &Map<String, Value>) -> Result<Option<&str>, NameRefusal> {
    let Some(Value::Object(meta)) = tool.get("_meta") else { return Ok(None) };
    let nested = meta.get("ui").and_then(|ui| ui.get("resourceUri"));
    let flat = meta.get(UI_LINK_FLAT_KEY);
    let link = match (nested, flat) {
        (None, None) => return Ok(None),
        (Some(one), None) | (None, Some(one)) => one,
        (Some(nested), Some(flat)) if nested == flat => nested,
        (Some(_), Some(_)) => return Err(NameRefusal::UiLink("names two different resources")),
    };
    let Value::String(link) = link else { return Err(NameRefusal::UiLink("is not a string")) };
    if ui_rest(link).is_none() {
        return Err(NameRefusal::UiLink("is not a ui:// URI"));
    }
    Ok(Some(link))
}

/// Whether `uri` is an MCP Apps UI resource's (`ui://…`, the scheme in any case).
pub fn is_ui_uri(uri: &str) -> bool {
    ui_rest(uri).is_some()
}

/// What follows `ui://` in an MCP Apps UI URI (`None` for any other URI).
fn ui_rest(uri: &str) -> Option<&str> {
    let head = uri.get(..UI_HEAD.len())?;
    head.eq_ignore_ascii_case(UI_HEAD).then(|| &uri[UI_HEAD.len()..])
}

/// **URIs inside results.** What an upstream answers may name its resources: a tool result's or
/// prompt message's `resource_link` block (`uri`) and embedded `resource` block
/// (`resource.uri`), and a read's contents (`uri`). Those are URIs a caller acts on (reads,
/// subscribes to), so they leave in the gateway's namespace, through [`Namer::expose_uri`] like
/// the listed ones, and come back through [`Namer::upstream_uri`]. Everything else is relayed
/// untouched: text that mentions a URI, `structuredContent` (checked against the pinned
/// `outputSchema`, which a rewrite could break), `_meta`, icons and annotations, image and audio
/// blocks. A block whose URI cannot be exposed (no scheme, a control character, too long once
/// prefixed, or, from an unprefixed upstream, a URI inside another upstream's prefix) is dropped:
/// relayed as sent it could name a resource of another upstream.
impl Namer {
    /// The content `block` with its resource URI exposed (`resource_link`: `uri`; `resource`:
    /// `resource.uri`); other blocks unchanged. `None`: the block names a URI that cannot be
    /// exposed, or a `resource_link`/`resource` block names none; the caller drops it.
    pub fn expose_content(&self, mut block: Value) -> Option<Value> {
        let uri = match block.get("type").and_then(Value::as_str) {
            Some("resource_link") => block.get_mut("uri"),
            Some("resource") => block.get_mut("resource").and_then(|resource| resource.get_mut("uri")),
            _ => return Some(block),
        }?;
        let exposed = self.expose_uri(uri.as_str()?).ok()?;
        *uri = Value::String(exposed);
        Some(block)
    }

    /// [`Self::expose_content`] over a result's blocks, dropping the ones it refuses. Returns
    /// the blocks kept and how many were dropped.
    pub fn expose_contents(&self, blocks: Vec<Value>) -> (Vec<Value>, usize) {
        let total = blocks.len();
        let kept: Vec<Value> = blocks.into_iter().filter_map(|block| self.expose_content(block)).collect();
        let dropped = total - kept.len();
        (kept, dropped)
    }
}

/// A URI (or template) the gateway can map: starts with an RFC 3986 scheme and `:`, no control
/// characters. The length is checked on the exposed form.
fn check_uri(uri: &str) -> Result<(), NameRefusal> {
    if uri.chars().any(char::is_control) {
        return Err(NameRefusal::UriControlChar);
    }
    let scheme = uri.split_once(':').map(|(scheme, _)| scheme).ok_or(NameRefusal::UriNoScheme)?;
    let mut bytes = scheme.bytes();
    let starts_with_letter = bytes.next().is_some_and(|byte| byte.is_ascii_alphabetic());
    if !starts_with_letter || !bytes.all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'-' | b'.')) {
        return Err(NameRefusal::UriNoScheme);
    }
    Ok(())
}

/// The exposed names claimed more than once (within one kind: tools and prompts are separate
/// namespaces, so call this once per kind). Every definition behind such a name is held.
pub fn collisions<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut repeated = BTreeSet::new();
    for name in names {
        if !seen.insert(name) {
            repeated.insert(name.to_owned());
        }
    }
    repeated
}

/// Whether an unprefixed upstream's exposed name `exposed` lies in a prefixed upstream's
/// namespace (`<prefix><sep>…` for one of `prefixes`): such a name would shadow that upstream's
/// tools and is held. Returns the shadowed prefix.
pub fn shadows_prefix<'p>(exposed: &str, prefixes: &'p [String], sep: Separator) -> Option<&'p str> {
    prefixes
        .iter()
        .find(|prefix| exposed.strip_prefix(prefix.as_str()).is_some_and(|rest| rest.starts_with(sep.as_str())))
        .map(String::as_str)
}

/// The URI counterpart of [`shadows_prefix`]: whether an unprefixed upstream's URI (or template)
/// starts with `<prefix>+` for one of `prefixes` (a scheme may contain `+`), or is a `ui://` URI
/// whose authority starts so (a prefixed upstream's UI namespace). Schemes are case-insensitive
/// (RFC 3986), so `FX+file:` lies in prefix `fx`'s namespace too. Returns the shadowed prefix.
pub fn shadows_uri_prefix<'p>(exposed: &str, prefixes: &'p [String]) -> Option<&'p str> {
    let starts_with = |text: &str, prefix: &str| {
        let head = text.as_bytes().get(..prefix.len());
        head.is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
            && text.as_bytes().get(prefix.len()) == Some(&b'+')
    };
    prefixes
        .iter()
        .find(|prefix| starts_with(exposed, prefix) || ui_rest(exposed).is_some_and(|rest| starts_with(rest, prefix)))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEPARATORS: [Separator; 3] = [Separator::Underscore, Separator::DoubleUnderscore, Separator::Dot];

    #[test]
    fn separators_parse_and_print() {
        for separator in SEPARATORS {
            assert_eq!(Separator::parse(separator.as_str()), Some(separator));
        }
        assert_eq!(Separator::default(), Separator::Underscore);
        for bad in ["", "-", "___", "+", " _", "/"] {
            assert_eq!(Separator::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn names_round_trip_for_every_separator() {
        for separator in SEPARATORS {
            let namer = Namer::new(Some("x"), separator);
            let sep = separator.as_str();
            for upstream in ["echo", "a_b", "a__b", "a.b", "_", "__", ".", "-", "A-Z.09_", "x_y"] {
                let exposed = namer.expose_name(upstream).unwrap();
                assert_eq!(exposed, format!("x{sep}{upstream}"));
                assert_eq!(namer.upstream_name(&exposed), Some(upstream), "{separator:?} {upstream}");
            }
        }
        let namer = Namer::new(Some("x"), Separator::Underscore);
        assert_eq!(namer.expose_name("a_b").unwrap(), "x_a_b");
        assert_eq!(namer.upstream_name("x_a_b"), Some("a_b"));
    }

    #[test]
    fn a_namer_claims_only_its_own_names() {
        for separator in SEPARATORS {
            let sep = separator.as_str();
            let short = Namer::new(Some("a"), separator);
            let long = Namer::new(Some("ab"), separator);
            let exposed_by_long = long.expose_name(&format!("b{sep}tool")).unwrap();
            assert_eq!(short.upstream_name(&exposed_by_long), None, "{exposed_by_long}");
            let exposed_by_short = short.expose_name(&format!("b{sep}tool")).unwrap();
            assert_eq!(long.upstream_name(&exposed_by_short), None, "{exposed_by_short}");
            assert_eq!(long.upstream_name(&exposed_by_long), Some(format!("b{sep}tool").as_str()));
            // The bare prefix, the prefix with its separator only, another separator.
            assert_eq!(short.upstream_name("a"), None);
            assert_eq!(short.upstream_name(&format!("a{sep}")), None);
            assert_eq!(short.upstream_name("a+tool"), None);
            assert_eq!(short.upstream_name("b_tool"), None);
        }
        // "_" and "__" namers of the same prefix: "x__t" is "_t" under "_", "t" under "__".
        assert_eq!(Namer::new(Some("x"), Separator::Underscore).upstream_name("x__t"), Some("_t"));
        assert_eq!(Namer::new(Some("x"), Separator::DoubleUnderscore).upstream_name("x__t"), Some("t"));
        assert_eq!(Namer::new(Some("x"), Separator::DoubleUnderscore).upstream_name("x_t"), None);
    }

    #[test]
    fn exposed_names_are_at_most_64_characters() {
        let namer = Namer::new(Some("abc"), Separator::Underscore);
        let fits = "t".repeat(MAX_EXPOSED_NAME - 4);
        let exposed = namer.expose_name(&fits).unwrap();
        assert_eq!(exposed.len(), 64);
        assert_eq!(namer.upstream_name(&exposed), Some(fits.as_str()));
        let over = "t".repeat(MAX_EXPOSED_NAME - 3);
        assert_eq!(namer.expose_name(&over), Err(NameRefusal::TooLong { len: 65 }));
        assert_eq!(namer.upstream_name(&format!("abc_{over}")), None);
        let unprefixed = Namer::new(None, Separator::Dot);
        assert!(unprefixed.expose_name(&"n".repeat(64)).is_ok());
        assert_eq!(unprefixed.expose_name(&"n".repeat(65)), Err(NameRefusal::TooLong { len: 65 }));
        // Over the spec's 128 is not a spec name at all.
        assert_eq!(unprefixed.expose_name(&"n".repeat(129)), Err(NameRefusal::NotSpecName));
        assert!(NameRefusal::TooLong { len: 65 }.to_string().contains("65"));
    }

    #[test]
    fn non_spec_names_are_refused() {
        let namer = Namer::new(Some("x"), Separator::Underscore);
        for bad in ["", "has space", "slash/name", "colon:name", "plus+name", "é", "tab\t", "nul\0", "emoji🦀"] {
            assert_eq!(namer.expose_name(bad), Err(NameRefusal::NotSpecName), "{bad:?}");
            assert_eq!(namer.upstream_name(&format!("x_{bad}")), None, "{bad:?}");
        }
        assert!(is_spec_name("Az09_-."));
        assert!(is_spec_name(&"a".repeat(128)));
        assert!(!is_spec_name(&"a".repeat(129)));
    }

    #[test]
    fn the_unprefixed_namer_is_the_identity() {
        let namer = Namer::new(None, Separator::Underscore);
        for name in ["echo", "x_echo", "a.b"] {
            assert_eq!(namer.expose_name(name).unwrap(), name);
            assert_eq!(namer.upstream_name(name), Some(name));
        }
        for uri in ["file:///x", "https://h/p?q", "urn:x:y", "file:///{path}"] {
            assert_eq!(namer.expose_uri(uri).unwrap(), uri);
            assert_eq!(namer.upstream_uri(uri).as_deref(), Some(uri));
        }
        assert_eq!(namer.upstream_name("not valid"), None);
        assert_eq!(namer.upstream_uri("no-scheme").as_deref(), None);
    }

    #[test]
    fn uris_and_templates_round_trip() {
        let docs = Namer::new(Some("docs"), Separator::Dot);
        let other = Namer::new(Some("doc"), Separator::Dot);
        for uri in ["file:///x", "https://h/p?q", "urn:x:y", "file:///{path}", "a+b://plus/in/scheme", "x:"] {
            let exposed = docs.expose_uri(uri).unwrap();
            assert_eq!(exposed, format!("docs+{uri}"));
            assert_eq!(docs.upstream_uri(&exposed).as_deref(), Some(uri));
            assert_eq!(other.upstream_uri(&exposed).as_deref(), None, "{exposed}");
        }
        assert_eq!(docs.upstream_uri("file:///x").as_deref(), None, "not exposed by this namer");
        assert_eq!(docs.upstream_uri("docs+").as_deref(), None);
        assert_eq!(docs.upstream_uri("docs+no-scheme").as_deref(), None);
    }

    #[test]
    fn bad_uris_are_refused() {
        let namer = Namer::new(Some("p"), Separator::Underscore);
        for bad in ["", "no-scheme", "/abs/path", ":empty-scheme", "1http://h", "ht tp://h", "{scheme}://x"] {
            assert_eq!(namer.expose_uri(bad), Err(NameRefusal::UriNoScheme), "{bad:?}");
        }
        for bad in ["file:///a\nb", "file:///\u{0}", "file:///\u{7f}", "file:///\u{85}"] {
            assert_eq!(namer.expose_uri(bad), Err(NameRefusal::UriControlChar), "{bad:?}");
        }
        let body = "a".repeat(MAX_EXPOSED_URI - "p+file:".len());
        let fits = format!("file:{body}");
        assert_eq!(namer.expose_uri(&fits).unwrap().len(), MAX_EXPOSED_URI);
        let over = format!("file:{body}a");
        assert_eq!(namer.expose_uri(&over), Err(NameRefusal::UriTooLong { len: MAX_EXPOSED_URI + 1 }));
        assert_eq!(namer.upstream_uri(&format!("p+{over}")).as_deref(), None);
    }

    #[test]
    fn labels() {
        for good in ["a", "github", "a-b", "a1", "x0-9z", &"a".repeat(32)] {
            assert_eq!(check_label(good), Ok(()), "{good}");
        }
        for bad in ["", "A", "Github", "1abc", "-a", "a-", "a_b", "a.b", "a+b", "a b", "é", &"a".repeat(33)] {
            assert!(check_label(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_label(""), Err("must not be empty"));
        assert_eq!(check_label("a-"), Err("must not end with '-'"));
        assert_eq!(check_label("9a"), Err("must start with a lowercase letter a-z"));
    }

    #[test]
    fn collisions_are_the_names_claimed_twice() {
        let found = collisions(["a_x", "b_x", "a_x", "c", "c", "c", "C"]);
        assert_eq!(found.into_iter().collect::<Vec<_>>(), ["a_x", "c"]);
        assert!(collisions(["a", "b", "A"]).is_empty());
        assert!(collisions(std::iter::empty()).is_empty());
    }

    #[test]
    fn unprefixed_names_that_enter_a_prefixed_namespace_are_reported() {
        let prefixes = ["github".to_owned(), "git".to_owned()];
        assert_eq!(shadows_prefix("github_create_issue", &prefixes, Separator::Underscore), Some("github"));
        assert_eq!(shadows_prefix("git_log", &prefixes, Separator::Underscore), Some("git"));
        assert_eq!(shadows_prefix("gitlab_log", &prefixes, Separator::Underscore), None);
        assert_eq!(shadows_prefix("github", &prefixes, Separator::Underscore), None);
        assert_eq!(shadows_prefix("github.x", &prefixes, Separator::Underscore), None);
        assert_eq!(shadows_prefix("github.x", &prefixes, Separator::Dot), Some("github"));
        assert_eq!(shadows_prefix("github_x", &prefixes, Separator::DoubleUnderscore), None);
        assert_eq!(shadows_prefix("github__x", &prefixes, Separator::DoubleUnderscore), Some("github"));
        assert_eq!(shadows_prefix("echo", &[], Separator::Underscore), None);
        assert_eq!(shadows_uri_prefix("github+https://h", &prefixes), Some("github"));
        assert_eq!(shadows_uri_prefix("git+ssh://h", &prefixes), Some("git"));
        assert_eq!(shadows_uri_prefix("https://github+x", &prefixes), None);
        assert_eq!(shadows_uri_prefix("svn+ssh://h", &prefixes), None);
        assert_eq!(shadows_uri_prefix("GitHub+https://h", &prefixes), Some("github"), "schemes ignore case");
        assert_eq!(shadows_uri_prefix("github", &prefixes), None);
        assert_eq!(shadows_uri_prefix("gi+x:", &prefixes), None);
        assert_eq!(shadows_uri_prefix("é+x:", &["e".to_owned()]), None, "no panic inside a character");
    }

    #[test]
    fn an_unprefixed_namer_keeps_out_of_the_reserved_namespaces() {
        let prefixes = ["fx".to_owned(), "git".to_owned()];
        let root = Namer::new(None, Separator::Underscore).reserving(&prefixes);
        assert_eq!(
            root.expose_name("fx_echo"),
            Err(NameRefusal::ShadowsPrefix { exposed: "fx_echo".into(), prefix: "fx".into() })
        );
        assert_eq!(root.upstream_name("fx_echo"), None);
        assert_eq!(root.expose_name("fxecho").unwrap(), "fxecho");
        assert_eq!(root.upstream_name("git.log"), Some("git.log"), "another separator is not the namespace");
        for uri in ["fx+file:///docs/secret.txt", "fx+file:///{dir}/{name}", "FX+file:///docs/secret.txt"] {
            assert_eq!(
                root.expose_uri(uri),
                Err(NameRefusal::UriShadowsPrefix { exposed: uri.into(), prefix: "fx".into() }),
                "{uri}"
            );
            assert_eq!(root.upstream_uri(uri).as_deref(), None, "{uri}");
        }
        assert_eq!(root.expose_uri("file:///fx+x").unwrap(), "file:///fx+x");
        assert_eq!(root.upstream_uri("fxx+file:///a").as_deref(), Some("fxx+file:///a"));
        let reason = root.expose_uri("fx+file:///a").unwrap_err().to_string();
        assert_eq!(reason, "unprefixed URI \"fx+file:///a\" lies in upstream prefix \"fx\"'s namespace");
        // A prefixed namer's namespace is its own: reserving changes nothing.
        let fx = Namer::new(Some("fx"), Separator::Underscore).reserving(&prefixes);
        assert_eq!(fx.expose_uri("file:///a").unwrap(), "fx+file:///a");
        assert_eq!(fx.upstream_uri("fx+file:///a").as_deref(), Some("file:///a"));
        assert_eq!(fx.expose_name("git_x").unwrap(), "fx_git_x");
    }

    #[test]
    fn resource_blocks_in_results_are_exposed_and_the_rest_is_untouched() {
        let every = Namer::new(Some("everything"), Separator::Underscore);
        let link = serde_json::json!({"type": "resource_link", "uri": "demo://resource/dynamic/blob/1", "name": "b"});
        let exposed = every.expose_content(link).unwrap();
        assert_eq!(exposed["uri"], "everything+demo://resource/dynamic/blob/1");
        assert_eq!(
            every.upstream_uri(exposed["uri"].as_str().unwrap()).as_deref(),
            Some("demo://resource/dynamic/blob/1")
        );
        let embedded =
            serde_json::json!({"type": "resource", "resource": {"uri": "file:///a", "text": "see file:///b"}});
        let exposed = every.expose_content(embedded).unwrap();
        assert_eq!(exposed["resource"]["uri"], "everything+file:///a");
        assert_eq!(exposed["resource"]["text"], "see file:///b", "text that mentions a URI is not rewritten");
        let text = serde_json::json!({"type": "text", "text": "demo://resource/static/1", "_meta": {"uri": "x:y"}});
        assert_eq!(every.expose_content(text.clone()), Some(text));
        let image = serde_json::json!({"type": "image", "data": "AA==", "mimeType": "image/png"});
        assert_eq!(every.expose_content(image.clone()), Some(image));
        // Unmappable: no scheme, a control character, no URI at all, a URI that is not a string.
        for bad in [
            serde_json::json!({"type": "resource_link", "uri": "relative/path", "name": "r"}),
            serde_json::json!({"type": "resource_link", "uri": "file:///a\nb", "name": "r"}),
            serde_json::json!({"type": "resource_link", "name": "r"}),
            serde_json::json!({"type": "resource", "resource": {"uri": 7, "text": "t"}}),
            serde_json::json!({"type": "resource", "text": "t"}),
        ] {
            assert_eq!(every.expose_content(bad.clone()), None, "{bad}");
        }
        // An unprefixed upstream cannot point a caller at another upstream's resource.
        let root = Namer::new(None, Separator::Underscore).reserving(&["everything".to_owned()]);
        let foreign = serde_json::json!({"type": "resource_link", "uri": "everything+demo://x", "name": "x"});
        assert_eq!(root.expose_content(foreign.clone()), None);
        let own = serde_json::json!({"type": "resource_link", "uri": "demo://x", "name": "x"});
        let (kept, dropped) =
            root.expose_contents(vec![foreign, own.clone(), serde_json::json!({"type": "text", "text": "t"})]);
        assert_eq!((kept.len(), dropped), (2, 1));
        assert_eq!(kept[0], own, "unprefixed: the URI is its own");
    }

    #[test]
    fn ui_uris_keep_their_scheme_and_round_trip() {
        let apps = Namer::new(Some("apps"), Separator::Underscore);
        for (uri, exposed) in [
            ("ui://get-time/mcp-app.html", "ui://apps+get-time/mcp-app.html"),
            ("UI://Weather/view", "UI://apps+Weather/view"),
            ("ui:///no-authority", "ui://apps+/no-authority"),
            ("ui://{app}/view.html", "ui://apps+{app}/view.html"),
        ] {
            assert_eq!(apps.expose_uri(uri).unwrap(), exposed);
            assert_eq!(apps.upstream_uri(exposed).as_deref(), Some(uri), "{exposed}");
        }
        // Not what a ui:// URI is exposed as, nor another prefix's.
        assert_eq!(apps.upstream_uri("apps+ui://get-time/mcp-app.html"), None);
        assert_eq!(apps.upstream_uri("ui://get-time/mcp-app.html"), None);
        assert_eq!(Namer::new(Some("app"), Separator::Underscore).upstream_uri("ui://apps+x/y"), None);
        // `ui:` without `//` is any other URI.
        assert_eq!(apps.expose_uri("ui:opaque").unwrap(), "apps+ui:opaque");
        assert_eq!(apps.upstream_uri("apps+ui:opaque").as_deref(), Some("ui:opaque"));
        // An unprefixed upstream's UI cannot enter a prefixed upstream's UI namespace.
        let root = Namer::new(None, Separator::Underscore).reserving(&["apps".to_owned()]);
        for uri in ["ui://apps+get-time/mcp-app.html", "UI://APPS+x/y"] {
            assert!(matches!(root.expose_uri(uri), Err(NameRefusal::UriShadowsPrefix { .. })), "{uri}");
            assert_eq!(root.upstream_uri(uri), None, "{uri}");
        }
        assert_eq!(root.expose_uri("ui://get-time/a").unwrap(), "ui://get-time/a");
        assert_eq!(root.upstream_uri("ui://appsx+y/a").as_deref(), Some("ui://appsx+y/a"));
    }

    #[test]
    fn ui_links_are_found_and_exposed_in_both_forms() {
        let apps = Namer::new(Some("apps"), Separator::Underscore);
        let tool = |meta: Value| match serde_json::json!({ "name": "t", "_meta": meta }) {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let mut both = tool(serde_json::json!({
            "ui": { "resourceUri": "ui://get-time/mcp-app.html", "visibility": ["model", "app"] },
            "ui/resourceUri": "ui://get-time/mcp-app.html",
            "other": "kept"
        }));
        assert_eq!(ui_link(&both).unwrap(), Some("ui://get-time/mcp-app.html"));
        apps.expose_ui_link(&mut both).unwrap();
        assert_eq!(
            Value::Object(both),
            serde_json::json!({ "name": "t", "_meta": {
                "ui": { "resourceUri": "ui://apps+get-time/mcp-app.html", "visibility": ["model", "app"] },
                "ui/resourceUri": "ui://apps+get-time/mcp-app.html",
                "other": "kept"
            } })
        );
        let mut flat = tool(serde_json::json!({ "ui/resourceUri": "ui://a/b" }));
        apps.expose_ui_link(&mut flat).unwrap();
        assert_eq!(flat["_meta"], serde_json::json!({ "ui/resourceUri": "ui://apps+a/b" }));
        let mut none = tool(serde_json::json!({ "ui": { "visibility": ["app"] } }));
        assert_eq!(ui_link(&none).unwrap(), None);
        apps.expose_ui_link(&mut none).unwrap();
        assert_eq!(none["_meta"], serde_json::json!({ "ui": { "visibility": ["app"] } }));
        for (meta, reason) in [
            (
                serde_json::json!({ "ui": { "resourceUri": "ui://a/b" }, "ui/resourceUri": "ui://a/c" }),
                "names two different resources",
            ),
            (serde_json::json!({ "ui": { "resourceUri": "https://evil.example/app.html" } }), "is not a ui:// URI"),
            (serde_json::json!({ "ui/resourceUri": 7 }), "is not a string"),
        ] {
            let mut refused = tool(meta);
            assert_eq!(ui_link(&refused), Err(NameRefusal::UiLink(reason)));
            let before = refused.clone();
            assert_eq!(apps.expose_ui_link(&mut refused), Err(NameRefusal::UiLink(reason)));
            assert_eq!(refused, before, "a refused link changes nothing");
        }
        assert_eq!(NameRefusal::UiLink("is not a string").to_string(), "its MCP Apps UI link is not a string");
    }
}
