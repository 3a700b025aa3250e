//! MCP Apps (the `io.modelcontextprotocol/ui` extension) through the gateway: what a tool's UI
//! resource must be to be pinned with its tool and served, the digest of its contents, and the
//! checks on the Content-Security-Policy and permissions it declares, which are relayed exactly
//! as declared and never widened.
//!
//! A tool linking to a UI (`_meta.ui.resourceUri`, [`crate::names::ui_link`]) is pinned with
//! that UI: listing reads the resource as the gateway, and the tool's pinned definition carries,
//! under [`PIN_MEMBER`], the resource's URI, MIME type, declared `_meta` (CSP, permissions,
//! domain) and the SHA-256 of its contents ([`UiResource::pinned`]). A changed page, CSP or
//! permission is a changed tool definition, held until approved again; a read of the UI
//! through the gateway is relayed only while its contents are the approved ones.
//!
//! The CSP (`_meta.ui.csp`: `connectDomains`, `resourceDomains`, `frameDomains`,
//! `baseUriDomains`) is a list of origins a host turns into policy directives. An entry that is
//! not a plain origin (`https://api.example.com`, `https://*.example.com`, `wss://h:8443`, with
//! an optional path) could add a directive of its own (`https://a.example; script-src *`) or
//! allow everything (`*`, `'unsafe-inline'`): such a UI is refused, as is an unknown CSP member.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use crate::pins::definition_digest;

/// The MIME type of an MCP Apps UI resource.
pub const UI_MIME_TYPE: &str = "text/html;profile=mcp-app";

/// The member of a tool's pinned definition that holds its UI resource (never sent to clients).
pub const PIN_MEMBER: &str = "palisade/uiResource";

/// The CSP members the extension defines, each a list of origins.
const CSP_LISTS: [&str; 4] = ["connectDomains", "resourceDomains", "frameDomains", "baseUriDomains"];

/// The permissions the extension defines (each an empty object when requested).
const PERMISSIONS: [&str; 4] = ["camera", "microphone", "geolocation", "clipboardWrite"];

/// At most this many entries in one CSP list.
const MAX_CSP_ENTRIES: usize = 64;

/// The longest CSP entry or `domain`, in bytes.
const MAX_CSP_ENTRY: usize = 512;

/// A CSP source the gateway relays: a web or socket scheme, a host (optionally `*.`-prefixed),
/// an optional port (or `*`), an optional path without spaces, quotes, `;` or `,`.
static ORIGIN: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used, reason = "a fixed pattern, checked by the tests")]
    Regex::new(r"^(?:https?|wss?)://(?:\*\.)?[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::(?:[0-9]{1,5}|\*))?(?:/[^\s;,'\x22\\]*)?$")
        .expect("origin pattern")
});

/// A tool's UI resource as listing read it.
#[derive(Debug, Clone, PartialEq)]
pub struct UiResource {
    /// SHA-256 (hex) of its contents as sent ([`contents_digest`]).
    pub digest: String,
    /// What the tool's pin holds of it, under [`PIN_MEMBER`].
    pub pinned: Value,
}

/// Checks the `resources/read` result of the UI resource `uri` (in the upstream's space): one
/// content item, of that URI, of [`UI_MIME_TYPE`], with a text or blob body and a `_meta` that
/// passes [`check_ui_meta`]. The error is a reason for the tool's hold.
pub fn check_contents(uri: &str, result: &Map<String, Value>) -> Result<UiResource, String> {
    let Some(Value::Array(contents)) = result.get("contents") else {
        return Err("its read result has no contents".into());
    };
    let [item] = contents.as_slice() else {
        return Err(format!("it has {} content items, not one", contents.len()));
    };
    if item.get("uri").and_then(Value::as_str) != Some(uri) {
        return Err("its content names another URI".into());
    }
    let mime = item.get("mimeType").and_then(Value::as_str).unwrap_or("");
    if !is_ui_mime_type(mime) {
        return Err(format!("its MIME type is {mime:?}, not {UI_MIME_TYPE}"));
    }
    if !item.get("text").is_some_and(Value::is_string) && !item.get("blob").is_some_and(Value::is_string) {
        return Err("its content has no text or blob".into());
    }
    let meta = match item.get("_meta") {
        None => None,
        Some(Value::Object(meta)) => {
            check_ui_meta(meta)?;
            Some(meta)
        }
        Some(_) => return Err("its _meta is not an object".into()),
    };
    let digest = contents_digest(contents)?;
    let mut pinned = json!({ "uri": uri, "mimeType": mime, "contentsSha256": digest });
    if let Some(meta) = meta {
        pinned["_meta"] = Value::Object(meta.clone());
    }
    Ok(UiResource { digest, pinned })
}

/// The SHA-256 (hex) of a read result's contents as sent (RFC 8785 bytes, as pins are).
pub fn contents_digest(contents: &[Value]) -> Result<String, String> {
    definition_digest(&Value::Array(contents.to_vec()))
        .map_err(|error| format!("its contents cannot be digested: {error}"))
}

/// Whether `mime` is [`UI_MIME_TYPE`] (parameters may be spaced, names in any case).
pub fn is_ui_mime_type(mime: &str) -> bool {
    let mut parts = mime.split(';').map(str::trim);
    parts.next().is_some_and(|essence| essence.eq_ignore_ascii_case("text/html"))
        && parts.next().is_some_and(|profile| {
            profile.split_once('=').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("profile") && value.trim().trim_matches('"') == "mcp-app"
            })
        })
        && parts.next().is_none()
}

/// Checks the MCP Apps members of a UI resource's `_meta` (on its content item or its list
/// entry): `ui.csp` holds only the extension's lists, each of at most 64 plain origins;
/// `ui.permissions` only the extension's permissions; `ui.domain` is a host name. Other members
/// of `_meta` and of `ui` (`prefersBorder`, …) are relayed unchecked: they grant nothing.
pub fn check_ui_meta(meta: &Map<String, Value>) -> Result<(), String> {
    let Some(ui) = meta.get("ui") else { return Ok(()) };
    let Value::Object(ui) = ui else { return Err("its _meta.ui is not an object".into()) };
    if let Some(csp) = ui.get("csp") {
        let Value::Object(csp) = csp else { return Err("its CSP is not an object".into()) };
        for (key, list) in csp {
            if !CSP_LISTS.contains(&key.as_str()) {
                return Err(format!("its CSP has an unknown member {key:?}"));
            }
            let Value::Array(entries) = list else { return Err(format!("its CSP {key} is not a list")) };
            if entries.len() > MAX_CSP_ENTRIES {
                return Err(format!("its CSP {key} has more than {MAX_CSP_ENTRIES} entries"));
            }
            for entry in entries {
                let origin = entry.as_str().filter(|origin| origin.len() <= MAX_CSP_ENTRY && ORIGIN.is_match(origin));
                if origin.is_none() {
                    return Err(format!("its CSP {key} holds {entry}, which is not a plain origin"));
                }
            }
        }
    }
    if let Some(permissions) = ui.get("permissions") {
        let Value::Object(permissions) = permissions else {
            return Err("its permissions are not an object".into());
        };
        if let Some(unknown) = permissions.keys().find(|key| !PERMISSIONS.contains(&key.as_str())) {
            return Err(format!("it asks for an unknown permission {unknown:?}"));
        }
    }
    if let Some(domain) = ui.get("domain") {
        let host = domain.as_str().filter(|host| {
            !host.is_empty()
                && host.len() <= MAX_CSP_ENTRY
                && host.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-'))
        });
        if host.is_none() {
            return Err(format!("its domain {domain} is not a host name"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    fn read(uri: &str, item: Value) -> Map<String, Value> {
        let mut item = item;
        item["uri"] = json!(uri);
        object(json!({ "contents": [item] }))
    }

    #[test]
    fn a_ui_is_pinned_with_its_digest_and_declared_meta() {
        let meta = json!({ "ui": {
            "csp": { "connectDomains": ["https://api.example.com", "wss://live.example.com:8443"],
                     "resourceDomains": ["https://*.cdn.example.com/lib/"] },
            "permissions": { "clipboardWrite": {} },
            "domain": "a904794854a047f6.apps.example.com",
            "prefersBorder": true
        } });
        let result =
            read("ui://clock/app.html", json!({ "mimeType": UI_MIME_TYPE, "text": "<html></html>", "_meta": meta }));
        let ui = check_contents("ui://clock/app.html", &result).unwrap();
        assert_eq!(ui.digest.len(), 64);
        assert_eq!(ui.pinned["contentsSha256"], json!(ui.digest));
        assert_eq!(ui.pinned["_meta"], meta, "the declared CSP is what the pin shows, unchanged");
        assert_eq!(ui.pinned["uri"], "ui://clock/app.html");
        // One byte of the page, the CSP or a permission is another digest.
        let other =
            read("ui://clock/app.html", json!({ "mimeType": UI_MIME_TYPE, "text": "<html> </html>", "_meta": meta }));
        assert_ne!(check_contents("ui://clock/app.html", &other).unwrap().digest, ui.digest);
        let mut wider = meta.clone();
        wider["ui"]["csp"]["connectDomains"] = json!(["https://api.example.com", "https://other.example"]);
        let wider =
            read("ui://clock/app.html", json!({ "mimeType": UI_MIME_TYPE, "text": "<html></html>", "_meta": wider }));
        assert_ne!(check_contents("ui://clock/app.html", &wider).unwrap().digest, ui.digest);
        // A blob body is a body too.
        let blob = read("ui://clock/app.html", json!({ "mimeType": "text/html; profile=mcp-app", "blob": "PGh0bWw+" }));
        assert!(check_contents("ui://clock/app.html", &blob).unwrap().pinned.get("_meta").is_none());
    }

    #[test]
    fn what_is_not_a_ui_is_refused_with_its_reason() {
        let uri = "ui://clock/app.html";
        let cases = [
            (object(json!({})), "its read result has no contents"),
            (object(json!({ "contents": [] })), "it has 0 content items, not one"),
            (
                read("ui://other/app.html", json!({ "mimeType": UI_MIME_TYPE, "text": "" })),
                "its content names another URI",
            ),
            (
                read(uri, json!({ "mimeType": "text/html", "text": "" })),
                "its MIME type is \"text/html\", not text/html;profile=mcp-app",
            ),
            (read(uri, json!({ "mimeType": UI_MIME_TYPE })), "its content has no text or blob"),
            (read(uri, json!({ "mimeType": UI_MIME_TYPE, "text": "", "_meta": [] })), "its _meta is not an object"),
        ];
        for (result, reason) in cases {
            assert_eq!(check_contents(uri, &result), Err(reason.to_owned()), "{result:?}");
        }
    }

    #[test]
    fn a_csp_that_would_widen_the_policy_is_refused() {
        let csp = |list: Value| object(json!({ "ui": { "csp": { "connectDomains": list } } }));
        for good in [
            "https://api.example.com",
            "http://localhost:3000",
            "https://*.example.com",
            "wss://h:*",
            "https://cdn.example.com/a/b.js",
        ] {
            assert_eq!(check_ui_meta(&csp(json!([good]))), Ok(()), "{good}");
        }
        for bad in [
            "https://a.example; script-src *",
            "*",
            "'unsafe-inline'",
            "https://a.example 'unsafe-eval'",
            "data:",
            "https:",
            "javascript://x",
            "https://a.example,https://b.example",
            "https://a.example/\u{2028}",
            "https://*",
            "",
        ] {
            let reason = check_ui_meta(&csp(json!([bad]))).unwrap_err();
            assert!(reason.contains("is not a plain origin"), "{bad}: {reason}");
        }
        assert!(check_ui_meta(&csp(json!([7]))).unwrap_err().contains("not a plain origin"));
        assert_eq!(check_ui_meta(&csp(json!("https://a.example"))), Err("its CSP connectDomains is not a list".into()));
        let many: Vec<String> = (0..=MAX_CSP_ENTRIES).map(|n| format!("https://h{n}.example")).collect();
        assert_eq!(check_ui_meta(&csp(json!(many))), Err("its CSP connectDomains has more than 64 entries".into()));
        let unknown = object(json!({ "ui": { "csp": { "scriptSrc": ["https://a.example"] } } }));
        assert_eq!(check_ui_meta(&unknown), Err("its CSP has an unknown member \"scriptSrc\"".into()));
        let permission = object(json!({ "ui": { "permissions": { "camera": {}, "usb": {} } } }));
        assert_eq!(check_ui_meta(&permission), Err("it asks for an unknown permission \"usb\"".into()));
        let domain = object(json!({ "ui": { "domain": "evil.example/; frame-ancestors *" } }));
        assert!(check_ui_meta(&domain).unwrap_err().contains("is not a host name"));
        assert_eq!(check_ui_meta(&object(json!({ "ui": "x" }))), Err("its _meta.ui is not an object".into()));
        assert_eq!(check_ui_meta(&object(json!({ "other": 1 }))), Ok(()), "other _meta is relayed");
    }

    #[test]
    fn the_ui_mime_type_is_recognised_in_its_spellings() {
        for good in [UI_MIME_TYPE, "text/html; profile=mcp-app", "TEXT/HTML;Profile=\"mcp-app\""] {
            assert!(is_ui_mime_type(good), "{good}");
        }
        for bad in
            ["text/html", "text/html;profile=other", "text/plain;profile=mcp-app", "text/html;profile=mcp-app;x=y", ""]
        {
            assert!(!is_ui_mime_type(bad), "{bad}");
        }
    }
}
