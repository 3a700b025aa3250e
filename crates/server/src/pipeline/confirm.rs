//! The confirmation step of a needs-confirmation tool (part of dispatch, after the allow): the
//! user is asked through an MRTR elicitation (the tool's `confirm_with` summary, or its
//! arguments), the answer is bound by the sealed request state to the exact arguments and the
//! question's text, and an accepted state is spent once in the store's single-use records
//! before the handler runs.
//!
//! Knows the single-use store and MRTR rounds; nothing about the kill switch or handles.

use palisade_wire::ProtocolError;
use serde_json::{Map, Value, json};

use super::dispatch::Dispatch;
use crate::audit::{AuditStage, AuditTrail, fresh_trace_id};
use crate::context::{InputRequired, Outcome, RequestContext};
use crate::method::Method;
use crate::registry::ToolDef;

impl Dispatch {
    /// The confirmation step of a needs-confirmation tool. `None`: confirmed, run the handler
    /// (with the application's own state unwrapped into the context). `Some(result)`: answer
    /// with it (the question, or the refusal after a decline).
    ///
    /// A confirmation authorizes one execution: the sealed state that carries it (the question's,
    /// answered with accept, or a later round's) is spent in the store's single-use records
    /// before the handler runs, so replaying it (on this instance or another) is refused.
    pub(super) async fn confirmation(
        &self,
        ctx: &mut RequestContext,
        tool: &ToolDef,
        params: &Map<String, Value>,
        arguments: &Map<String, Value>,
        audit: &AuditTrail<'_>,
    ) -> Result<Option<Value>, ProtocolError> {
        const KEY: &str = "palisade.confirm";
        // Under a delegation capability the caller is an agent: its own "yes" (or any text it
        // sends) is not the user's. Only an approval the principal's own client recorded for
        // exactly this call counts, taken once.
        if let Some(capability) = ctx.principal.delegation() {
            let Some(service) = &self.delegation else { return Err(ProtocolError::Unavailable) };
            let sent = params.get("arguments").and_then(Value::as_object).cloned().unwrap_or_default();
            // A refusal is on the record as the dispatch's, with the capability's prefix.
            ctx.approval = Some(service.take_approval(capability, &tool.name, &sent).await?);
            return Ok(None);
        }
        let envelope = ctx.request_state.take();
        let confirmed = envelope.as_ref().and_then(|s| s.get("confirmed")).and_then(Value::as_bool);
        let shown = envelope.as_ref().and_then(|s| s.get("s")).and_then(Value::as_str).map(str::to_owned);
        ctx.request_state = envelope.and_then(|mut s| s.get_mut("app").map(Value::take)).filter(|v| !v.is_null());
        match confirmed {
            Some(true) => {}
            // We asked (the sealed state says so, for exactly these params): read the answer.
            Some(false) => match ctx.input_responses.remove(KEY) {
                Some(answer) if answer["action"] == "accept" && answer["content"]["confirm"] == true => {
                    // What the user accepted must still be what would run.
                    if shown != Some(summary_digest(&self.confirmation_text(ctx, tool, arguments)?)) {
                        audit.deny(AuditStage::Confirmation, None).await;
                        let changed = "what this call would do changed since it was confirmed: call it again";
                        return Ok(Some(crate::CallToolResult::error(changed).into_value()));
                    }
                }
                Some(_) => {
                    audit.deny(AuditStage::Confirmation, None).await;
                    return Ok(Some(crate::CallToolResult::error("the user did not confirm this call").into_value()));
                }
                None => return self.ask_confirmation(ctx, tool, params, arguments).map(Some),
            },
            None => return self.ask_confirmation(ctx, tool, params, arguments).map(Some),
        }
        self.spend_confirmation(params).await?;
        Ok(None)
    }

    /// Marks the sealed state a confirmed round presents as used (until it would expire anyway).
    /// Used before: refused. No single-use store, or the store in doubt: refused (fail closed).
    async fn spend_confirmation(&self, params: &Map<String, Value>) -> Result<(), ProtocolError> {
        let sealed = params.get("requestState").and_then(Value::as_str).ok_or(ProtocolError::Internal)?;
        let Some(once) = &self.once else {
            tracing::error!("a tool needs confirmation but the server has no single-use store: refused");
            return Err(ProtocolError::Unavailable);
        };
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, sealed.as_bytes());
        let digest: [u8; 32] = digest.as_ref().try_into().map_err(|_| ProtocolError::Internal)?;
        let ttl_ms = u64::try_from(self.config.request_state_ttl.as_millis()).unwrap_or(u64::MAX);
        let expires_ms = self.clock.now_ms().saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX));
        match once.consume_once(digest, expires_ms).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::info!(stage = "dispatch", decision = "deny", "a confirmation was presented again: refused");
                Err(ProtocolError::invalid_params("this confirmation was already used"))
            }
            Err(error) => {
                tracing::error!(%error, "single-use store unavailable: refusing the confirmed call");
                Err(ProtocolError::Unavailable)
            }
        }
    }

    /// What the user is asked to confirm for this call: the tool's own summary when it has one,
    /// else its arguments (handles removed), cut to 500 bytes.
    fn confirmation_text(
        &self,
        ctx: &RequestContext,
        tool: &ToolDef,
        arguments: &Map<String, Value>,
    ) -> Result<String, ProtocolError> {
        if let Some(summary) = &tool.confirmation_summary {
            return Ok(format!("Allow the tool {}? {}", tool.name, summary(ctx, arguments)?));
        }
        let shown = crate::content::shortened(Value::Object(arguments.clone()).to_string(), 500);
        Ok(format!("Allow the tool {} to run with these arguments? {shown}", tool.name))
    }

    fn ask_confirmation(
        &self,
        ctx: &RequestContext,
        tool: &ToolDef,
        params: &Map<String, Value>,
        arguments: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        let text = self.confirmation_text(ctx, tool, arguments)?;
        let schema =
            json!({ "type": "object", "properties": { "confirm": { "type": "boolean" } }, "required": ["confirm"] });
        // The nonce makes each question's sealed state distinct (it is spent by digest); the
        // summary's digest binds the answer to what was shown.
        let state = json!({ "confirmed": false, "n": fresh_trace_id(), "s": summary_digest(&text) });
        let question = InputRequired::new().elicit("palisade.confirm", text, schema).with_state(state);
        self.finish_round(ctx, Method::ToolsCall, params, Outcome::InputRequired(question))
    }
}

/// The digest of a confirmation question's text, kept in its sealed state.
fn summary_digest(text: &str) -> String {
    palisade_base::hex::hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes()).as_ref())
}
