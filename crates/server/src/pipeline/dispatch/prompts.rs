//! Stage 8 for `prompts/get`: the required arguments present, then the prompt's handler inside
//! its MRTR round.

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use super::Dispatch;
use crate::context::RequestContext;
use crate::method::{Method, OperationKey};
use crate::pipeline::params::string_map;
use crate::registry::App;

impl Dispatch {
    /// `prompts/get` of the classified prompt.
    pub(super) async fn get_prompt(
        &self,
        app: &Arc<App>,
        operation: &OperationKey,
        mut ctx: RequestContext,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let prompt = operation.target().and_then(|name| app.prompt(name)).ok_or(ProtocolError::Internal)?;
        let arguments = string_map(params.get("arguments"))?;
        let missing = prompt.missing_required(&arguments);
        if !missing.is_empty() {
            return Err(ProtocolError::invalid_params(format!("missing required arguments: {}", missing.join(", "))));
        }
        self.prepare_round(&mut ctx, Method::PromptsGet, params)?;
        let outcome = (prompt.handler)(ctx.clone(), arguments).await?;
        self.finish_round(&ctx, Method::PromptsGet, params, outcome.map_complete(|r| r.to_value()))
    }
}
