//! The exact RFC 6750 / RFC 9728 `WWW-Authenticate` challenge each [`AuthError`] produces, built
//! from the resource server's configuration.

use crate::config::ResourceServerConfig;
use crate::error::AuthError;

impl AuthError {
    /// The `WWW-Authenticate` header value for this refusal.
    ///
    /// - 401 without credentials: `Bearer resource_metadata="…", scope="…"`
    /// - 401 with credentials: `Bearer error="invalid_token", resource_metadata="…", scope="…"`
    /// - 403: `Bearer error="insufficient_scope", scope="<all needed scopes>", resource_metadata="…"`
    ///
    /// On 401, `scope` lists `scopes_supported` and is omitted when that is empty. Values are
    /// RFC 7230 quoted-strings (`"` and `\` escaped, control characters dropped).
    pub fn www_authenticate(&self, cfg: &ResourceServerConfig) -> String {
        let mut challenge = String::from("Bearer ");
        match self {
            AuthError::InsufficientScope { required } => {
                push_param(&mut challenge, "error", "insufficient_scope");
                push_param(&mut challenge, "scope", &required.join(" "));
                push_param(&mut challenge, "resource_metadata", &cfg.resource_metadata_url);
            }
            AuthError::MissingCredentials
            | AuthError::MalformedHeader(_)
            | AuthError::InvalidToken(_)
            | AuthError::IssuerUnavailable { .. } => {
                if self.credentials_presented() {
                    push_param(&mut challenge, "error", "invalid_token");
                }
                push_param(&mut challenge, "resource_metadata", &cfg.resource_metadata_url);
                if !cfg.scopes_supported.is_empty() {
                    push_param(&mut challenge, "scope", &cfg.scopes_supported.join(" "));
                }
            }
        }
        challenge
    }
}

/// Appends `name="value"` (comma-separated after the first) with `value` as a quoted-string.
fn push_param(challenge: &mut String, name: &str, value: &str) {
    if !challenge.ends_with(' ') {
        challenge.push_str(", ");
    }
    challenge.push_str(name);
    challenge.push_str("=\"");
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                challenge.push('\\');
                challenge.push(c);
            }
            // Control characters cannot appear in a quoted-string (and CR/LF would split the
            // header); config validation already refuses them, so this only guards.
            c if c.is_control() => {}
            c => challenge.push(c),
        }
    }
    challenge.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{IssuerConfig, JwksSource};
    use crate::error::{HeaderProblem, InvalidTokenReason};

    fn config(scopes: &[&str]) -> ResourceServerConfig {
        let mut cfg = ResourceServerConfig::new(
            "https://mcp.example.com/mcp",
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
            vec![IssuerConfig {
                issuer: "https://idp.example.com".into(),
                jwks: JwksSource::Url("https://idp.example.com/jwks".into()),
                algorithms: vec![jsonwebtoken::Algorithm::ES256],
            }],
        );
        cfg.scopes_supported = scopes.iter().map(|s| (*s).to_owned()).collect();
        cfg
    }

    #[test]
    fn missing_credentials_challenge_has_no_error() {
        let cfg = config(&["tools:read", "tools:call"]);
        let err = AuthError::MissingCredentials;
        assert_eq!(err.http_status(), 401);
        assert_eq!(
            err.www_authenticate(&cfg),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", \
             scope=\"tools:read tools:call\""
        );
    }

    #[test]
    fn other_scheme_is_treated_like_missing_credentials() {
        let cfg = config(&[]);
        let err = AuthError::MalformedHeader(HeaderProblem::UnsupportedScheme);
        assert_eq!(err.http_status(), 401);
        assert_eq!(
            err.www_authenticate(&cfg),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\""
        );
    }

    #[test]
    fn presented_token_gets_invalid_token() {
        let cfg = config(&["a"]);
        for err in [
            AuthError::InvalidToken(InvalidTokenReason::Expired),
            AuthError::MalformedHeader(HeaderProblem::NotToken68),
            AuthError::IssuerUnavailable { issuer: "https://idp.example.com".into() },
        ] {
            assert_eq!(err.http_status(), 401);
            assert_eq!(
                err.www_authenticate(&cfg),
                "Bearer error=\"invalid_token\", \
                 resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", scope=\"a\""
            );
        }
    }

    #[test]
    fn insufficient_scope_lists_every_needed_scope() {
        let cfg = config(&["a"]);
        let err = AuthError::InsufficientScope { required: vec!["files:read".into(), "files:write".into()] };
        assert_eq!(err.http_status(), 403);
        assert_eq!(
            err.www_authenticate(&cfg),
            "Bearer error=\"insufficient_scope\", scope=\"files:read files:write\", \
             resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\""
        );
    }

    #[test]
    fn quoted_string_escapes() {
        let mut out = String::from("Bearer ");
        push_param(&mut out, "x", "a\"b\\c\r\nd");
        assert_eq!(out, "Bearer x=\"a\\\"b\\\\cd\"");
    }
}
