//! Fans server events out between instances through Redis or Valkey pub/sub (`events_redis`):
//! what this instance raises ([`EventBus::subscribe_local`]) is published on the deployment's
//! channel, and what other instances publish there is handed to this instance's listen streams
//! ([`EventBus::publish_remote`]), where each stream re-reads and re-authorizes what it delivers
//! for its own caller, as for a local event.
//!
//! Pub/sub, not a log: an event is a hint that something changed, so one missed while a
//! connection is down costs a client a refresh, never authority (the state itself is in the
//! shared store). The channel is named by a digest of the deployment's `public_url`, which every
//! instance of one deployment shares, so two deployments on one Redis never hear each other.
//! Messages are bounded and parsed strictly; one that is not a well-formed event is dropped.
//!
//! The same connections carry the deployment's answer channel (`answer_relay.rs`): a
//! client's answer to a server request, relayed to the instance that sent the request.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::hmac;
use futures::StreamExt as _;
use palisade_server::events::{EventBus, ServerEvent};
use palisade_server::server::Server;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::answer_relay;
use crate::redis_publish::{KindText as _, MAX_BACKOFF, publish};

/// The largest message accepted from the channel.
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// One message on the channel.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    /// The publishing instance (random per process): an instance ignores its own messages.
    origin: String,
    event: ServerEvent,
}

/// The bridge's channel for the deployment whose canonical URL is `public_url`.
fn channel(public_url: &str) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, public_url.as_bytes());
    let hex: String = digest.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("palisade:events:{hex}")
}

/// Connects (a failure here refuses the start: the operator asked for the bridge) and runs the
/// bridge, and the answer relay keyed by `relay_key`, until `shutdown`.
pub async fn start(
    server: Arc<Server>,
    relay_key: hmac::Key,
    url: &str,
    public_url: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let bus = server.events().clone();
    let client = redis::Client::open(url).map_err(|_| anyhow::anyhow!("events_redis is not a valid Redis URL"))?;
    let mut origin = [0u8; 16];
    aws_lc_rs::rand::fill(&mut origin).map_err(|_| anyhow::anyhow!("no randomness for the instance id"))?;
    let origin: String = origin.iter().map(|b| format!("{b:02x}")).collect();
    let channels = Channels::new(public_url);
    let publisher = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|error| anyhow::anyhow!("events_redis: cannot connect: {}", error.kind_text()))?;
    let mut subscriber = client
        .get_async_pubsub()
        .await
        .map_err(|error| anyhow::anyhow!("events_redis: cannot connect: {}", error.kind_text()))?;
    channels
        .subscribe(&mut subscriber)
        .await
        .map_err(|error| anyhow::anyhow!("events_redis: cannot subscribe: {}", error.kind_text()))?;
    tracing::info!(channel = %channels.events, answers = %channels.answers, "server events and client answers fan out through Redis");
    answer_relay::start(
        &server,
        relay_key.clone(),
        origin.clone(),
        client.clone(),
        publisher.clone(),
        channels.answers.clone(),
        shutdown.clone(),
    );
    tokio::spawn(publish_loop(
        bus,
        client.clone(),
        publisher,
        channels.events.clone(),
        origin.clone(),
        shutdown.clone(),
    ));
    let receiver = Receiver { server, relay_key, origin, channels };
    tokio::spawn(subscribe_loop(receiver, client, subscriber, shutdown));
    Ok(())
}

/// The deployment's two channels.
#[derive(Clone)]
struct Channels {
    events: String,
    answers: String,
}

impl Channels {
    fn new(public_url: &str) -> Self {
        let events = channel(public_url);
        let answers = answer_relay::channel(&events);
        Self { events, answers }
    }

    async fn subscribe(&self, subscriber: &mut redis::aio::PubSub) -> redis::RedisResult<()> {
        subscriber.subscribe(&self.events).await?;
        subscriber.subscribe(&self.answers).await
    }
}

/// What the subscriber hands heard messages to.
struct Receiver {
    server: Arc<Server>,
    relay_key: hmac::Key,
    origin: String,
    channels: Channels,
}

impl Receiver {
    fn take(&self, channel: &str, payload: &[u8]) {
        if channel == self.channels.answers {
            answer_relay::receive(&self.server, &self.relay_key, &self.origin, payload);
        } else if let Some(event) = parse(payload, &self.origin) {
            self.server.events().publish_remote(event);
        }
    }
}

async fn publish_loop(
    bus: EventBus,
    client: redis::Client,
    mut connection: redis::aio::MultiplexedConnection,
    channel: String,
    origin: String,
    shutdown: CancellationToken,
) {
    let mut events = bus.subscribe_local();
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        let event = match event {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "server events raised faster than they could be published: some did not reach other instances"
                );
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        let Ok(payload) = serde_json::to_string(&Message { origin: origin.clone(), event }) else { continue };
        if !publish(&client, &mut connection, &channel, &payload, &shutdown, "a server event").await {
            return;
        }
    }
}

async fn subscribe_loop(
    receiver: Receiver,
    client: redis::Client,
    mut subscriber: redis::aio::PubSub,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        {
            let mut messages = subscriber.on_message();
            loop {
                let message = tokio::select! {
                    () = shutdown.cancelled() => return,
                    message = messages.next() => message,
                };
                let Some(message) = message else { break };
                backoff = Duration::from_millis(200);
                receiver.take(message.get_channel_name(), message.get_payload_bytes());
            }
        }
        tracing::warn!(
            "the server event subscription was lost; reconnecting (events and answers of other instances are missed meanwhile)"
        );
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let Ok(mut fresh) = client.get_async_pubsub().await else { continue };
            if receiver.channels.subscribe(&mut fresh).await.is_ok() {
                subscriber = fresh;
                tracing::info!("the server event subscription is back");
                break;
            }
        }
    }
}

/// The event of a channel message from another instance; `None` for one of this instance's,
/// an oversized one, or one that is not a well-formed event.
fn parse(payload: &[u8], own_origin: &str) -> Option<ServerEvent> {
    if payload.len() > MAX_MESSAGE_BYTES {
        tracing::debug!(bytes = payload.len(), "an oversized message on the event channel was dropped");
        return None;
    }
    let Ok(message) = serde_json::from_slice::<Message>(payload) else {
        tracing::debug!("a message on the event channel that is not a server event was dropped");
        return None;
    };
    (message.origin != own_origin).then_some(message.event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_events_of_other_instances_are_taken() {
        let own = "aa".repeat(16);
        let other = Message { origin: "bb".repeat(16), event: ServerEvent::PromptsListChanged };
        let text = serde_json::to_vec(&other).unwrap();
        assert_eq!(parse(&text, &own), Some(ServerEvent::PromptsListChanged));
        let mine = serde_json::to_vec(&Message { origin: own.clone(), event: ServerEvent::ToolsListChanged }).unwrap();
        assert_eq!(parse(&mine, &own), None, "an instance's own event is already delivered locally");
        assert_eq!(parse(b"not json", &own), None);
        assert_eq!(parse(br#"{"origin":"x","event":{"kind":"unknown"}}"#, &own), None);
        assert_eq!(parse(br#"{"origin":"x","event":{"kind":"tools_list_changed"},"extra":1}"#, &own), None);
        let huge = format!(r#"{{"origin":"x","event":{{"kind":"resource_updated","uri":"{}"}}}}"#, "u".repeat(70_000));
        assert_eq!(parse(huge.as_bytes(), &own), None);
    }

    #[test]
    fn each_deployment_has_its_own_channel() {
        let a = channel("https://a.example.com/mcp");
        assert_eq!(a, channel("https://a.example.com/mcp"));
        assert_ne!(a, channel("https://b.example.com/mcp"));
        assert!(a.starts_with("palisade:events:") && a.len() == "palisade:events:".len() + 32);
    }
}
