//! MRTR rounds (part of dispatch): a retry's `requestState` opened and verified against the
//! caller, method and params it was sealed for, its `inputResponses` read into the context; a
//! handler's `input_required` outcome checked against the client's declared capabilities and
//! its state sealed.
//!
//! Knows the state sealer and the request context; nothing about what a handler does.

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::dispatch::Dispatch;
use crate::context::{InputRequired, Outcome, RequestContext};
use crate::method::Method;
use crate::mrtr::Binding;

impl Dispatch {
    /// Reads `requestState` and `inputResponses` of an MRTR retry into the context.
    pub(super) fn prepare_round(
        &self,
        ctx: &mut RequestContext,
        method: Method,
        params: &Map<String, Value>,
    ) -> Result<(), ProtocolError> {
        ctx.input_responses = match params.get("inputResponses") {
            None => Map::new(),
            Some(Value::Object(responses)) if responses.values().all(Value::is_object) => responses.clone(),
            Some(_) => return Err(ProtocolError::invalid_params("inputResponses must be an object of result objects")),
        };
        ctx.request_state = match params.get("requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(sealed)) => {
                let partition = ctx.principal.partition_key();
                let binding = Binding { principal: &partition, method: method.as_str(), params };
                match self.sealer.open(sealed, &binding, self.clock.now_unsigned_ms()) {
                    Ok(state) => Some(state),
                    Err(why) => {
                        tracing::info!(stage = "dispatch", decision = "deny", reason = %why, "request state refused");
                        return Err(ProtocolError::invalid_params("invalid requestState"));
                    }
                }
            }
            Some(_) => return Err(ProtocolError::invalid_params("requestState must be a string")),
        };
        Ok(())
    }

    /// Turns a handler outcome into a result, sealing state for an `input_required` answer.
    pub(super) fn finish_round(
        &self,
        ctx: &RequestContext,
        method: Method,
        params: &Map<String, Value>,
        outcome: Outcome<Value>,
    ) -> Result<Value, ProtocolError> {
        match outcome {
            Outcome::Complete(result) => Ok(result),
            Outcome::InputRequired(InputRequired { requests, state }) => {
                let mut missing = Map::new();
                for request in requests.values() {
                    let capability = match request.get("method").and_then(Value::as_str) {
                        Some("elicitation/create") => "elicitation",
                        Some("sampling/createMessage") => "sampling",
                        Some("roots/list") => "roots",
                        _ => return Err(ProtocolError::Internal),
                    };
                    if !ctx.meta.has_capability(capability) {
                        missing.insert(capability.into(), json!({}));
                    }
                }
                if !missing.is_empty() {
                    return Err(ProtocolError::MissingCapability { required: Value::Object(missing) });
                }
                if requests.is_empty() && state.is_none() {
                    return Err(ProtocolError::Internal);
                }
                let mut result = Map::new();
                result.insert("resultType".into(), json!("input_required"));
                if !requests.is_empty() {
                    result.insert("inputRequests".into(), Value::Object(requests));
                }
                if let Some(state) = state {
                    let partition = ctx.principal.partition_key();
                    let binding = Binding { principal: &partition, method: method.as_str(), params };
                    result.insert(
                        "requestState".into(),
                        json!(self.sealer.seal(&state, &binding, self.clock.now_unsigned_ms())),
                    );
                }
                Ok(Value::Object(result))
            }
        }
    }
}
