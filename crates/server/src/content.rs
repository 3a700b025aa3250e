//! Result payloads a handler returns: content blocks, tool results, prompt results and resource
//! contents, each serialised to the 2026-07-28 shapes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

/// `text` cut to at most `max` bytes on a character boundary, with `…` when it was cut: how long
/// values (a call's arguments) are shown in a confirmation question.
pub(crate) fn shortened(mut text: String, max: usize) -> String {
    if text.len() > max {
        let cut = (0..=max).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// One content block of a tool result or prompt message.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// An image, raw bytes (base64-encoded on the wire).
    Image {
        /// Raw image bytes.
        data: Vec<u8>,
        /// MIME type, e.g. `image/png`.
        mime_type: String,
    },
    /// Audio, raw bytes (base64-encoded on the wire).
    Audio {
        /// Raw audio bytes.
        data: Vec<u8>,
        /// MIME type, e.g. `audio/wav`.
        mime_type: String,
    },
    /// A resource embedded in the result.
    Resource(ResourceContents),
    /// A link to a resource the client may read.
    ResourceLink {
        /// The resource URI.
        uri: String,
        /// Its name.
        name: String,
        /// MIME type, when known.
        mime_type: Option<String>,
    },
    /// A block exactly as another server sent it (the gateway relays upstream results without
    /// re-typing them, so fields this version does not know survive).
    Raw(Value),
}

impl Content {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text(text.into())
    }

    /// The wire form.
    pub fn to_value(&self) -> Value {
        self.clone().into_value()
    }

    /// The wire form, moving the block's strings into it.
    pub fn into_value(self) -> Value {
        let mut out = Map::new();
        let mut field = |key: &str, value: String| out.insert(key.to_owned(), Value::String(value));
        let kind = match self {
            Self::Text(text) => {
                field("text", text);
                "text"
            }
            Self::Image { data, mime_type } => {
                field("data", STANDARD.encode(data));
                field("mimeType", mime_type);
                "image"
            }
            Self::Audio { data, mime_type } => {
                field("data", STANDARD.encode(data));
                field("mimeType", mime_type);
                "audio"
            }
            Self::Resource(resource) => {
                out.insert("resource".into(), resource.to_value());
                "resource"
            }
            Self::ResourceLink { uri, name, mime_type } => {
                field("uri", uri);
                field("name", name);
                if let Some(mime_type) = mime_type {
                    field("mimeType", mime_type);
                }
                "resource_link"
            }
            Self::Raw(value) => return value,
        };
        out.insert("type".into(), Value::String(kind.into()));
        Value::Object(out)
    }
}

/// The contents of one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceContents {
    /// The resource URI.
    pub uri: String,
    /// MIME type, when known.
    pub mime_type: Option<String>,
    /// Text or bytes.
    pub body: ResourceBody,
    /// The item's `_meta`, relayed as the resource's server sent it (an MCP App's `ui` CSP,
    /// permissions and domain), when it has one.
    pub meta: Option<Map<String, Value>>,
}

/// A resource body.
#[derive(Debug, Clone, PartialEq)]
pub enum ResourceBody {
    /// UTF-8 text.
    Text(String),
    /// Binary data (base64 on the wire).
    Blob(Vec<u8>),
}

impl ResourceContents {
    /// Text contents.
    pub fn text(uri: impl Into<String>, mime_type: impl Into<String>, text: impl Into<String>) -> Self {
        Self { uri: uri.into(), mime_type: Some(mime_type.into()), body: ResourceBody::Text(text.into()), meta: None }
    }

    /// Binary contents.
    pub fn blob(uri: impl Into<String>, mime_type: impl Into<String>, data: Vec<u8>) -> Self {
        Self { uri: uri.into(), mime_type: Some(mime_type.into()), body: ResourceBody::Blob(data), meta: None }
    }

    /// These contents with `meta` as their `_meta`.
    pub fn with_meta(mut self, meta: Map<String, Value>) -> Self {
        self.meta = Some(meta);
        self
    }

    /// The wire form.
    pub fn to_value(&self) -> Value {
        let mut out = Map::new();
        out.insert("uri".into(), json!(self.uri));
        if let Some(mime_type) = &self.mime_type {
            out.insert("mimeType".into(), json!(mime_type));
        }
        match &self.body {
            ResourceBody::Text(text) => out.insert("text".into(), json!(text)),
            ResourceBody::Blob(data) => out.insert("blob".into(), json!(STANDARD.encode(data))),
        };
        if let Some(meta) = &self.meta {
            out.insert("_meta".into(), Value::Object(meta.clone()));
        }
        Value::Object(out)
    }
}

/// The result of a tool call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallToolResult {
    /// Unstructured content.
    pub content: Vec<Content>,
    /// Structured content matching the tool's output schema, when it has one.
    pub structured_content: Option<Value>,
    /// Whether the call failed (tool-level failure, visible to the model).
    pub is_error: bool,
}

impl CallToolResult {
    /// A successful result with the given content.
    pub fn content(content: Vec<Content>) -> Self {
        Self { content, structured_content: None, is_error: false }
    }

    /// A successful single-text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self::content(vec![Content::text(text)])
    }

    /// A tool-level failure the model can read and react to.
    pub fn error(message: impl Into<String>) -> Self {
        Self { content: vec![Content::text(message)], structured_content: None, is_error: true }
    }

    /// A result with structured content, also rendered as text as the spec recommends.
    pub fn structured(value: Value) -> Self {
        // Serialized straight into a buffer (a `Value` always serializes; `to_string` goes
        // through `Display`'s formatter, slower).
        let text = serde_json::to_string(&value).unwrap_or_default();
        Self { content: vec![Content::text(text)], structured_content: Some(value), is_error: false }
    }

    /// The wire fields (without `resultType` / `_meta`, which the pipeline adds).
    pub fn to_value(&self) -> Value {
        self.clone().into_value()
    }

    /// The wire fields, moving the content into them (no copy of the structured content).
    pub fn into_value(self) -> Value {
        let mut out = Map::new();
        out.insert("content".into(), Value::Array(self.content.into_iter().map(Content::into_value).collect()));
        if let Some(structured) = self.structured_content {
            out.insert("structuredContent".into(), structured);
        }
        if self.is_error {
            out.insert("isError".into(), Value::Bool(true));
        }
        Value::Object(out)
    }
}

/// One message of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptMessage {
    /// `user` or `assistant`.
    pub role: &'static str,
    /// The message content.
    pub content: Content,
}

impl PromptMessage {
    /// A user message.
    pub fn user(content: Content) -> Self {
        Self { role: "user", content }
    }

    /// An assistant message.
    pub fn assistant(content: Content) -> Self {
        Self { role: "assistant", content }
    }
}

/// The result of `prompts/get`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GetPromptResult {
    /// Optional description.
    pub description: Option<String>,
    /// The messages.
    pub messages: Vec<PromptMessage>,
}

impl GetPromptResult {
    /// The wire fields.
    pub fn to_value(&self) -> Value {
        let mut out = Map::new();
        if let Some(description) = &self.description {
            out.insert("description".into(), json!(description));
        }
        let messages =
            self.messages.iter().map(|m| json!({ "role": m.role, "content": m.content.to_value() })).collect();
        out.insert("messages".into(), Value::Array(messages));
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_blocks_and_tool_results_have_their_wire_shapes() {
        let resource = ResourceContents {
            uri: "test://r".into(),
            mime_type: Some("text/plain".into()),
            body: ResourceBody::Text("hi".into()),
            meta: None,
        };
        let cases = [
            (Content::text("hello"), json!({ "type": "text", "text": "hello" })),
            (
                Content::Image { data: vec![1, 2, 3], mime_type: "image/png".into() },
                json!({ "type": "image", "data": "AQID", "mimeType": "image/png" }),
            ),
            (
                Content::Audio { data: vec![0xff], mime_type: "audio/wav".into() },
                json!({ "type": "audio", "data": "/w==", "mimeType": "audio/wav" }),
            ),
            (
                Content::Resource(resource),
                json!({ "type": "resource", "resource": { "uri": "test://r", "mimeType": "text/plain", "text": "hi" } }),
            ),
            (
                Content::Resource(
                    ResourceContents::blob("ui://a/b", "text/html;profile=mcp-app", vec![b'<']).with_meta(
                        json!({ "ui": { "csp": { "connectDomains": ["https://api.example.com"] } } })
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                    ),
                ),
                json!({ "type": "resource", "resource": { "uri": "ui://a/b", "mimeType": "text/html;profile=mcp-app",
                    "blob": "PA==", "_meta": { "ui": { "csp": { "connectDomains": ["https://api.example.com"] } } } } }),
            ),
            (
                Content::ResourceLink { uri: "test://l".into(), name: "l".into(), mime_type: None },
                json!({ "type": "resource_link", "uri": "test://l", "name": "l" }),
            ),
            (
                Content::ResourceLink { uri: "test://l".into(), name: "l".into(), mime_type: Some("a/b".into()) },
                json!({ "type": "resource_link", "uri": "test://l", "name": "l", "mimeType": "a/b" }),
            ),
        ];
        for (content, expected) in cases {
            assert_eq!(content.to_value(), expected);
            assert_eq!(content.into_value(), expected);
        }
        // The text mirror is the structured content serialized (its member order is the JSON
        // map's: insertion order, as the workspace's serde_json keeps it).
        let structured = CallToolResult::structured(json!({ "sku": "TEA-001", "price": 4.5 }));
        for value in [structured.to_value(), structured.into_value()] {
            assert_eq!(value["structuredContent"], json!({ "sku": "TEA-001", "price": 4.5 }));
            assert_eq!(value["content"][0]["type"], "text");
            let text: Value = serde_json::from_str(value["content"][0]["text"].as_str().unwrap()).unwrap();
            assert_eq!(text, value["structuredContent"]);
            assert_eq!(value.as_object().unwrap().len(), 2);
        }
        let error = CallToolResult::error("no");
        assert_eq!(error.into_value(), json!({ "content": [{ "type": "text", "text": "no" }], "isError": true }));
    }
}
