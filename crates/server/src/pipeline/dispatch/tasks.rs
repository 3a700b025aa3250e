//! Stage 8 for `tasks/get|update|cancel`: handed to the task service, which re-checks the task's
//! owner binding on every call.

use std::sync::Arc;

use palisade_wire::ProtocolError;
use serde_json::{Map, Value};

use super::Dispatch;
use crate::context::RequestContext;
use crate::method::Method;
use crate::registry::App;

impl Dispatch {
    /// One `tasks/*` method.
    pub(super) async fn task_method(
        &self,
        app: &Arc<App>,
        method: Method,
        ctx: RequestContext,
        params: &Map<String, Value>,
    ) -> Result<Value, ProtocolError> {
        match method {
            Method::TasksGet => self.task_service()?.get(&ctx.principal, params).await,
            Method::TasksUpdate => self.task_service()?.update(app, &self.events, &ctx.principal, params).await,
            Method::TasksCancel => self.task_service()?.cancel(&self.events, &ctx.principal, params).await,
            _ => Err(ProtocolError::Internal),
        }
    }
}
