//! Resources and resource templates: their definitions, builders and readers, and the
//! level-1 URI template matching a read is routed by.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::tool::owned;
use crate::BoxFuture;
use crate::content::ResourceContents;
use crate::context::{Outcome, RequestContext};
use crate::method::Origin;

type ResourceReader =
    Arc<dyn Fn(RequestContext, String, BTreeMap<String, String>) -> BoxFuture<ReadResult> + Send + Sync>;
type ReadResult = Result<Outcome<Vec<ResourceContents>>, ProtocolError>;

/// A static resource.
pub struct ResourceDef {
    pub(crate) uri: String,
    pub(crate) definition: Value,
    pub(crate) ttl_ms: u64,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) reader: ResourceReader,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A resource under construction.
pub struct ResourceBuilder {
    uri: String,
    definition: Map<String, Value>,
    ttl_ms: u64,
    required_scopes: Vec<String>,
    origin: Option<Arc<Origin>>,
}

impl ResourceDef {
    /// Starts a resource at `uri` named `name`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(uri: impl Into<String>, name: impl Into<String>) -> ResourceBuilder {
        let uri = uri.into();
        let mut definition = Map::new();
        definition.insert("uri".into(), json!(uri));
        definition.insert("name".into(), json!(name.into()));
        ResourceBuilder { uri, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: None }
    }

    /// Starts a resource from a complete definition another server sent (the gateway), listed
    /// at `uri`: every field kept as sent except `uri`.
    pub fn relayed(uri: impl Into<String>, mut definition: Map<String, Value>, origin: Origin) -> ResourceBuilder {
        let uri = uri.into();
        definition.insert("uri".into(), json!(uri));
        ResourceBuilder { uri, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: Some(Arc::new(origin)) }
    }
}

/// The options resources and resource templates share: scopes, description, MIME type, `ttlMs`.
macro_rules! resource_options {
    ($builder:ty) => {
        impl $builder {
            /// Scopes the caller must hold to read it.
            pub fn scopes(mut self, scopes: &[&str]) -> Self {
                self.required_scopes = owned(scopes);
                self
            }

            /// Description.
            pub fn description(mut self, description: impl Into<String>) -> Self {
                self.definition.insert("description".into(), json!(description.into()));
                self
            }

            /// MIME type.
            pub fn mime_type(mut self, mime_type: impl Into<String>) -> Self {
                self.definition.insert("mimeType".into(), json!(mime_type.into()));
                self
            }

            /// How long a client may cache a read (`ttlMs`), default 0.
            pub fn ttl_ms(mut self, ttl_ms: u64) -> Self {
                self.ttl_ms = ttl_ms;
                self
            }
        }
    };
}

resource_options!(ResourceBuilder);
resource_options!(ResourceTemplateBuilder);

impl ResourceBuilder {
    /// Finishes the resource with its reader.
    pub fn reader<F, Fut>(self, reader: F) -> ResourceDef
    where
        F: Fn(RequestContext, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ReadResult> + Send + 'static,
    {
        ResourceDef {
            uri: self.uri,
            definition: Value::Object(self.definition),
            ttl_ms: self.ttl_ms,
            required_scopes: self.required_scopes,
            reader: Arc::new(move |ctx, uri, _| Box::pin(reader(ctx, uri))),
            origin: self.origin,
        }
    }
}

/// A resource template (RFC 6570 level 1: `{name}` matches one path segment).
pub struct ResourceTemplateDef {
    pub(crate) template: String,
    pub(crate) definition: Value,
    pub(crate) ttl_ms: u64,
    pub(crate) required_scopes: Vec<String>,
    pub(crate) reader: ResourceReader,
    pub(crate) origin: Option<Arc<Origin>>,
}

/// A resource template under construction.
pub struct ResourceTemplateBuilder {
    template: String,
    definition: Map<String, Value>,
    ttl_ms: u64,
    required_scopes: Vec<String>,
    origin: Option<Arc<Origin>>,
}

impl ResourceTemplateDef {
    /// Starts a template such as `test://template/{id}/data`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(uri_template: impl Into<String>, name: impl Into<String>) -> ResourceTemplateBuilder {
        let template = uri_template.into();
        let mut definition = Map::new();
        definition.insert("uriTemplate".into(), json!(template));
        definition.insert("name".into(), json!(name.into()));
        ResourceTemplateBuilder { template, definition, ttl_ms: 0, required_scopes: Vec::new(), origin: None }
    }

    /// Starts a template from a complete definition another server sent (the gateway), listed
    /// as `uri_template`: every field kept as sent except `uriTemplate`.
    pub fn relayed(
        uri_template: impl Into<String>,
        mut definition: Map<String, Value>,
        origin: Origin,
    ) -> ResourceTemplateBuilder {
        let template = uri_template.into();
        definition.insert("uriTemplate".into(), json!(template));
        ResourceTemplateBuilder {
            template,
            definition,
            ttl_ms: 0,
            required_scopes: Vec::new(),
            origin: Some(Arc::new(origin)),
        }
    }

    /// The variables of `uri` if it matches this template.
    pub fn match_uri(&self, uri: &str) -> Option<BTreeMap<String, String>> {
        match_template(&self.template, uri)
    }
}

impl ResourceTemplateBuilder {
    /// Finishes the template with its reader, which gets the URI and its variables.
    pub fn reader<F, Fut>(self, reader: F) -> ResourceTemplateDef
    where
        F: Fn(RequestContext, String, BTreeMap<String, String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ReadResult> + Send + 'static,
    {
        ResourceTemplateDef {
            template: self.template,
            definition: Value::Object(self.definition),
            ttl_ms: self.ttl_ms,
            required_scopes: self.required_scopes,
            reader: Arc::new(move |ctx, uri, vars| Box::pin(reader(ctx, uri, vars))),
            origin: self.origin,
        }
    }
}

/// Matches `uri` against a level-1 template; each `{var}` takes one non-empty path segment.
pub(super) fn match_template(template: &str, uri: &str) -> Option<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    let mut rest_template = template;
    let mut rest_uri = uri;
    while let Some(open) = rest_template.find('{') {
        let literal = &rest_template[..open];
        rest_uri = rest_uri.strip_prefix(literal)?;
        let close = rest_template[open..].find('}')? + open;
        let name = &rest_template[open + 1..close];
        rest_template = &rest_template[close + 1..];
        let next_literal_start = rest_template.find('{').unwrap_or(rest_template.len());
        let next_literal = &rest_template[..next_literal_start];
        let end = if next_literal.is_empty() {
            rest_uri.find('/').unwrap_or(rest_uri.len())
        } else {
            rest_uri.find(next_literal)?
        };
        let value = &rest_uri[..end];
        if value.is_empty() || value.contains('/') {
            return None;
        }
        vars.insert(name.to_owned(), value.to_owned());
        rest_uri = &rest_uri[end..];
    }
    (rest_uri == rest_template).then_some(vars)
}
