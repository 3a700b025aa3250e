//! OAuth 2.0 Protected Resource Metadata (RFC 9728): the JSON document and the well-known paths
//! it is served at.

use serde_json::{Map, Value, json};
use url::Url;

use crate::config::ResourceServerConfig;

/// The well-known path prefix of RFC 9728 §3.
pub const PROTECTED_RESOURCE_WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The metadata document: `resource`, `authorization_servers` (every configured issuer, at
/// least one), `scopes_supported` (when any), `bearer_methods_supported: ["header"]` (tokens in
/// query strings or bodies are never accepted), and `resource_name` when configured.
pub fn protected_resource_metadata(cfg: &ResourceServerConfig) -> Value {
    let mut doc = Map::new();
    doc.insert("resource".into(), json!(cfg.resource));
    doc.insert(
        "authorization_servers".into(),
        Value::Array(cfg.issuers.iter().map(|issuer| json!(issuer.issuer)).collect()),
    );
    if !cfg.scopes_supported.is_empty() {
        doc.insert("scopes_supported".into(), json!(cfg.scopes_supported));
    }
    doc.insert("bearer_methods_supported".into(), json!(["header"]));
    if let Some(name) = &cfg.resource_name {
        doc.insert("resource_name".into(), json!(name));
    }
    Value::Object(doc)
}

/// The paths at which the metadata for `resource` should be served: the bare
/// `/.well-known/oauth-protected-resource` and, when the resource URI has a path, the RFC 9728
/// §3.1 form with that path appended (`https://h/mcp` → `/.well-known/oauth-protected-resource/mcp`).
/// A resource that is not an absolute URL yields only the bare path.
pub fn metadata_paths(resource: &str) -> Vec<String> {
    let mut paths = vec![PROTECTED_RESOURCE_WELL_KNOWN.to_owned()];
    if let Ok(url) = Url::parse(resource) {
        let path = url.path();
        // §3.1: a terminating "/" right after the host is removed before inserting.
        if !path.is_empty() && path != "/" {
            let suffixed = format!("{PROTECTED_RESOURCE_WELL_KNOWN}{path}");
            if !paths.contains(&suffixed) {
                paths.push(suffixed);
            }
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{IssuerConfig, JwksSource};

    #[test]
    fn metadata_shape() {
        let mut cfg = ResourceServerConfig::new(
            "https://mcp.example.com/mcp",
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
            vec![
                IssuerConfig {
                    issuer: "https://idp.example.com".into(),
                    jwks: JwksSource::Url("https://idp.example.com/jwks".into()),
                    algorithms: vec![jsonwebtoken::Algorithm::ES256],
                },
                IssuerConfig {
                    issuer: "https://idp2.example.com/tenant".into(),
                    jwks: JwksSource::Url("https://idp2.example.com/jwks".into()),
                    algorithms: vec![jsonwebtoken::Algorithm::RS256],
                },
            ],
        );
        assert_eq!(
            protected_resource_metadata(&cfg),
            json!({
                "resource": "https://mcp.example.com/mcp",
                "authorization_servers": ["https://idp.example.com", "https://idp2.example.com/tenant"],
                "bearer_methods_supported": ["header"],
            })
        );
        cfg.scopes_supported = vec!["tools:read".into(), "tools:call".into()];
        cfg.resource_name = Some("Palisade demo".into());
        assert_eq!(
            protected_resource_metadata(&cfg),
            json!({
                "resource": "https://mcp.example.com/mcp",
                "authorization_servers": ["https://idp.example.com", "https://idp2.example.com/tenant"],
                "scopes_supported": ["tools:read", "tools:call"],
                "bearer_methods_supported": ["header"],
                "resource_name": "Palisade demo",
            })
        );
    }

    #[test]
    fn paths() {
        assert_eq!(
            metadata_paths("https://mcp.example.com/mcp"),
            ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
        );
        assert_eq!(
            metadata_paths("http://127.0.0.1:8080/a/b/"),
            ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/a/b/"]
        );
        assert_eq!(metadata_paths("https://mcp.example.com/"), ["/.well-known/oauth-protected-resource"]);
        assert_eq!(metadata_paths("https://mcp.example.com"), ["/.well-known/oauth-protected-resource"]);
        assert_eq!(metadata_paths("not a url"), ["/.well-known/oauth-protected-resource"]);
    }
}
