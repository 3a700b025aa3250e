//! Stage 8 for `resources/read`: a static resource or the first matching template, read inside
//! its MRTR round; an empty read is "resource not found".

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::Dispatch;
use crate::context::{Outcome, RequestContext};
use crate::method::Method;
use crate::pipeline::params::string_param;
use crate::registry::App;

impl Dispatch {
    /// `resources/read` of the `uri` parameter.
    pub(super) async fn read_resource(
        &self,
        app: &Arc<App>,
        mut ctx: RequestContext,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let uri = string_param(params, "uri")?.to_owned();
        self.prepare_round(&mut ctx, Method::ResourcesRead, params)?;
        let (reader, vars, ttl_ms) = if let Some(resource) = app.static_resource(&uri) {
            (resource.reader.clone(), BTreeMap::new(), resource.ttl_ms)
        } else {
            let (template, vars) = app
                .templates
                .iter()
                .find_map(|t| t.match_uri(&uri).map(|vars| (t, vars)))
                .ok_or_else(|| ProtocolError::ResourceNotFound { uri: uri.clone() })?;
            (template.reader.clone(), vars, template.ttl_ms)
        };
        let outcome = reader(ctx.clone(), uri.clone(), vars).await?;
        let cache_scope = self.cache_scope();
        let outcome = outcome.map_complete(|contents| {
            json!({
                "contents": contents.iter().map(crate::ResourceContents::to_value).collect::<Vec<_>>(),
                "ttlMs": ttl_ms,
                "cacheScope": cache_scope,
            })
        });
        if let Outcome::Complete(result) = &outcome
            && result["contents"].as_array().is_none_or(Vec::is_empty)
        {
            return Err(ProtocolError::ResourceNotFound { uri });
        }
        self.finish_round(&ctx, Method::ResourcesRead, params, outcome)
    }
}
