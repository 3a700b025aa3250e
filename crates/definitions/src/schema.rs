//! Fields of a definition that invite the model to hand over a secret: an input property named
//! like one (`password`, `api_key`, `accessToken`, `GITHUB_TOKEN`, `seed_phrase`, `private_key`,
//! `cookie`, …) or typed `"format": "password"`, anywhere in `inputSchema` or among a prompt's
//! `arguments`. A tool that needs a credential should get it from its server's configuration;
//! one that asks the model for it gets whatever secret the model can reach.
//!
//! Names are split into words (snake, kebab and camel case) so that `max_tokens`, `page_token`,
//! `token_count` and `key` (a key-value store's key) are not flagged: `token` counts only alone or
//! after a word naming a credential, `key` only after one.

use serde_json::Value;

/// Words that name a secret on their own.
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "credential",
    "credentials",
    "mnemonic",
    "cookie",
    "cookies",
    "otp",
    "totp",
    "apikey",
    "privatekey",
];
/// Words that make the `token` or `key` after them a credential.
const CREDENTIAL_QUALIFIERS: &[&str] = &[
    "access",
    "auth",
    "bearer",
    "api",
    "refresh",
    "github",
    "gitlab",
    "slack",
    "oauth",
    "personal",
    "id",
    "session",
    "secret",
    "npm",
    "private",
    "ssh",
    "signing",
    "encryption",
    "license",
    "client",
];

/// One field that invites a secret: its JSON pointer and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretField {
    pub(crate) pointer: String,
    pub(crate) name: String,
}

/// The fields of `definition` (a tool, prompt or resource template) that invite a secret.
pub(crate) fn secret_fields(definition: &Value) -> Vec<SecretField> {
    let mut out = Vec::new();
    if let Some(schema) = definition.get("inputSchema") {
        properties(schema, "/inputSchema", &mut out, 0);
    }
    if let Some(arguments) = definition.get("arguments").and_then(Value::as_array) {
        for (index, argument) in arguments.iter().enumerate() {
            if let Some(name) = argument.get("name").and_then(Value::as_str)
                && names_a_secret(name)
            {
                out.push(SecretField { pointer: format!("/arguments/{index}/name"), name: name.to_owned() });
            }
        }
    }
    out
}

/// Most nesting levels of a schema read (a definition is bounded already; this bounds the walk).
const MAX_DEPTH: usize = 16;

/// Every property of `schema` (and of the schemas nested in it) whose name or format invites a
/// secret.
fn properties(schema: &Value, pointer: &str, out: &mut Vec<SecretField>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let Some(object) = schema.as_object() else {
        if let Some(items) = schema.as_array() {
            for (index, item) in items.iter().enumerate() {
                properties(item, &format!("{pointer}/{index}"), out, depth + 1);
            }
        }
        return;
    };
    if let Some(members) = object.get("properties").and_then(Value::as_object) {
        for (name, property) in members {
            let child = format!("{pointer}/properties/{}", name.replace('~', "~0").replace('/', "~1"));
            let password_format = property.get("format").and_then(Value::as_str) == Some("password");
            if names_a_secret(name) || password_format {
                out.push(SecretField { pointer: child.clone(), name: name.clone() });
            }
            properties(property, &child, out, depth + 1);
        }
    }
    for key in ["items", "additionalProperties", "anyOf", "oneOf", "allOf", "$defs", "definitions"] {
        if let Some(nested) = object.get(key) {
            if key == "$defs" || key == "definitions" {
                for (name, item) in nested.as_object().into_iter().flatten() {
                    properties(item, &format!("{pointer}/{key}/{name}"), out, depth + 1);
                }
            } else {
                properties(nested, &format!("{pointer}/{key}"), out, depth + 1);
            }
        }
    }
}

/// Whether a field name names a secret (see the module docs).
pub(crate) fn names_a_secret(name: &str) -> bool {
    let words = words(name);
    words.iter().enumerate().any(|(at, word)| {
        let before = at.checked_sub(1).map(|i| words[i].as_str());
        SECRET_WORDS.contains(&word.as_str())
            || (matches!(word.as_str(), "token" | "tokens")
                && (words.len() == 1 || before.is_some_and(|b| CREDENTIAL_QUALIFIERS.contains(&b))))
            || (matches!(word.as_str(), "key" | "keys") && before.is_some_and(|b| CREDENTIAL_QUALIFIERS.contains(&b)))
            || (word == "phrase" && before.is_some_and(|b| matches!(b, "seed" | "recovery")))
            || (word == "pat" && words.len() == 1)
    })
}

/// The lower-case words of a field name: split at `_`, `-`, `.`, spaces and case changes.
fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if matches!(c, '_' | '-' | '.' | ' ') {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_names_are_told_from_honest_ones() {
        for secret in [
            "password",
            "api_key",
            "apiKey",
            "accessToken",
            "GITHUB_TOKEN",
            "token",
            "seed_phrase",
            "private_key",
            "ssh-key",
            "session_cookie",
            "clientSecret",
            "user_credentials",
        ] {
            assert!(names_a_secret(secret), "{secret}");
        }
        for honest in [
            "max_tokens",
            "page_token",
            "nextPageToken",
            "token_count",
            "key",
            "keys",
            "sort_key",
            "path",
            "query",
            "phrase",
            "hotkey",
            "keyword",
        ] {
            assert!(!names_a_secret(honest), "{honest}");
        }
    }

    #[test]
    fn fields_are_found_in_nested_schemas_and_prompt_arguments() {
        let tool = json!({"name": "deploy", "inputSchema": {"type": "object", "properties": {
            "target": {"type": "string"},
            "auth": {"type": "object", "properties": {"api_key": {"type": "string"}, "pin": {"type": "string", "format": "password"}}},
            "steps": {"type": "array", "items": {"type": "object", "properties": {"token": {"type": "string"}}}}
        }}});
        let found: Vec<String> = secret_fields(&tool).into_iter().map(|field| field.pointer).collect();
        assert_eq!(
            found,
            [
                "/inputSchema/properties/auth/properties/api_key",
                "/inputSchema/properties/auth/properties/pin",
                "/inputSchema/properties/steps/items/properties/token"
            ]
        );
        let prompt = json!({"name": "p", "arguments": [{"name": "topic"}, {"name": "password"}]});
        assert_eq!(
            secret_fields(&prompt),
            [SecretField { pointer: "/arguments/1/name".into(), name: "password".into() }]
        );
    }
}
