//! The gateway's resource subscriptions at an upstream, made in its own name (the gateway's
//! session, or process, and credential) for the URIs its callers listen for: on the
//! 2026-07-28 wire, the `resourceSubscriptions` of the change stream's `subscriptions/listen`
//! ([`listen_filter`]; a changed set is a re-opened stream); on the 2025 wire,
//! `resources/subscribe` and `resources/unsubscribe` in the gateway's session
//! ([`UpstreamClient::resource_subscription`]), whose updates arrive on its GET stream.
//! Nothing is asked of an upstream that does not advertise `resources.subscribe`.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::http::Body;
use super::legacy::GATEWAY_PARTITION;
use super::{Era, UpstreamClient, UpstreamError, UpstreamInfo};
use crate::credentials::CallerContext;

/// How an upstream takes the gateway's resource subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscribing {
    /// It does not advertise `resources.subscribe`: nothing is asked of it.
    Unsupported,
    /// 2026-07-28: in the change stream's listen filter (re-opened when the set changes).
    InListen,
    /// 2025 era: one `resources/subscribe` (or `unsubscribe`) request per URI.
    ByRequest,
}

/// Whether `info`'s capabilities advertise resource subscriptions.
fn advertises_subscribe(info: &UpstreamInfo) -> bool {
    info.capabilities.get("resources").and_then(|resources| resources.get("subscribe")) == Some(&Value::Bool(true))
}

/// The filter of the gateway's `subscriptions/listen` at a 2026-07-28 upstream: the list
/// changes its capabilities advertise, and `resources` when it advertises subscriptions.
/// Empty: there is nothing to listen for.
pub(super) fn listen_filter(info: &UpstreamInfo, resources: &BTreeSet<String>) -> Map<String, Value> {
    let mut filter = Map::new();
    for (capability, key) in
        [("tools", "toolsListChanged"), ("prompts", "promptsListChanged"), ("resources", "resourcesListChanged")]
    {
        if info.capabilities.get(capability).and_then(|c| c.get("listChanged")) == Some(&Value::Bool(true)) {
            filter.insert(key.into(), Value::Bool(true));
        }
    }
    if !resources.is_empty() && advertises_subscribe(info) {
        filter.insert("resourceSubscriptions".into(), json!(resources));
    }
    filter
}

impl UpstreamClient {
    /// How this upstream takes resource subscriptions, as its last connect said (`Unsupported`
    /// before a connect).
    pub fn subscribing(&self) -> Subscribing {
        match self.info() {
            Some(info) if advertises_subscribe(&info) => match info.era {
                Era::Modern => Subscribing::InListen,
                Era::Legacy(_) => Subscribing::ByRequest,
            },
            _ => Subscribing::Unsupported,
        }
    }

    /// 2025 era: `resources/subscribe` (or, `subscribe` false, `resources/unsubscribe`) of the
    /// upstream `uri` in the gateway's own session (its process, for a stdio upstream), where the
    /// change stream hears the updates. An error answer is an error.
    pub async fn resource_subscription(&self, uri: &str, subscribe: bool) -> Result<(), UpstreamError> {
        self.check_health()?;
        let info = self.ensure_info().await?;
        let method = if subscribe { "resources/subscribe" } else { "resources/unsubscribe" };
        let mut params = Map::new();
        params.insert("uri".into(), json!(uri));
        let caller = CallerContext { partition: GATEWAY_PARTITION, subject_token: None, user: None };
        // In the gateway's own session, the one its change stream reads (2025-era sessions are
        // keyed by the capabilities declared): updates come on the subscribing session's stream.
        let own = self.own_capabilities();
        match self.call(&info, method, params, caller, Some(&own), super::Relays::NONE, None).await? {
            Body::Result(_) => Ok(()),
            Body::Error { code, .. } => Err(UpstreamError::Protocol(format!("answered {method} with error {code}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(capabilities: Value, era: Era) -> UpstreamInfo {
        UpstreamInfo { era, capabilities, server_info: Value::Null, instructions: None }
    }

    #[test]
    fn a_change_stream_notification_is_a_list_change_or_an_update_with_its_uri() {
        use crate::upstream::Change;
        let updated = json!({"method": "notifications/resources/updated", "params": {"uri": "demo://a"}});
        assert_eq!(
            Change::of("notifications/resources/updated", &updated),
            Some(Change::ResourceUpdated("demo://a".into()))
        );
        let listed = json!({"method": "notifications/tools/list_changed"});
        let method = "notifications/tools/list_changed";
        assert_eq!(Change::of(method, &listed), Some(Change::ListChanged(method.into())));
        for (method, frame) in [
            ("notifications/resources/updated", json!({"params": {}})),
            ("notifications/resources/updated", json!({"params": {"uri": 7}})),
            ("notifications/message", json!({"params": {"uri": "demo://a"}})),
            ("notifications/progress", json!({})),
        ] {
            assert_eq!(Change::of(method, &frame), None, "{method} {frame}");
        }
    }

    #[test]
    fn the_listen_filter_asks_for_what_the_upstream_advertises() {
        let wanted: BTreeSet<String> = ["demo://a".to_owned()].into();
        let both = info(json!({"resources": {"subscribe": true, "listChanged": true}}), Era::Modern);
        let filter = listen_filter(&both, &wanted);
        assert_eq!(Value::Object(filter), json!({"resourcesListChanged": true, "resourceSubscriptions": ["demo://a"]}));
        assert_eq!(Value::Object(listen_filter(&both, &BTreeSet::new())), json!({"resourcesListChanged": true}));
        let no_subscribe = info(json!({"resources": {}, "tools": {"listChanged": true}}), Era::Modern);
        assert_eq!(Value::Object(listen_filter(&no_subscribe, &wanted)), json!({"toolsListChanged": true}));
        assert!(listen_filter(&info(json!({}), Era::Modern), &wanted).is_empty());
    }
}
