//! Resource updates through the gateway: the gateway asks an upstream for the updates of the
//! resources its callers listen for, and hands each update on under the exposed URI.
//!
//! - **Who listens.** The server counts what its open streams want
//!   ([`palisade_server::Server::resource_interest`]): a 2026-07-28 caller's
//!   `subscriptions/listen` with `resourceSubscriptions`, a 2025-era caller's
//!   `resources/subscribe`d URIs while its session's GET stream is open. Both were authorized by
//!   the pipeline (the read scopes of each URI) and name only resources the gateway serves.
//! - **Asking the upstream.** [`Gateway::route_interest`] maps each wanted URI back to its upstream
//!   ([`crate::names::Namer::upstream_uri`]) into that upstream's `wanted` set, at most
//!   [`MAX_SUBSCRIPTIONS_PER_UPSTREAM`] per upstream (the rest are not asked for, and logged);
//!   the upstream's change loop keeps its subscriptions equal to that set, in the gateway's own
//!   name ([`crate::upstream::Subscribing`]): a URI nobody listens for any more is unsubscribed.
//!   A `user_oauth` upstream is never asked (the gateway has no credential of its own there).
//! - **Handing updates on.** An update is delivered only for a URI in the upstream's `wanted`
//!   set (an upstream cannot push updates of anything else), exposed through its namer, to this
//!   instance's streams only ([`palisade_server::EventBus::deliver_here`]; every instance asks
//!   for its own listeners). Each stream delivers it to its own caller only when that caller
//!   listens for that URI (a listen stream's acknowledged filter; a GET stream's session
//!   subscriptions, re-read at each event), exactly as for an application's own resources.

use std::collections::BTreeSet;
use std::sync::Arc;

use palisade_server::ServerEvent;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Attached, Gateway, Upstream, lock};
use crate::names::Namer;

/// Most resources the gateway subscribes to at one upstream at once.
pub const MAX_SUBSCRIPTIONS_PER_UPSTREAM: usize = 512;

/// The exposed URIs in `interest`, each in the set of the upstream it routes to (upstream
/// URIs). `namers[i]`: upstream `i`'s namer, `None` when it is never asked; `lists(i, uri)`:
/// whether upstream `i`'s last listing lists the upstream `uri` (which of several unprefixed
/// upstreams a URI is). A prefixed namer's claim is its alone; a URI no namer claims, or claimed
/// by several none of which lists it, is nobody's.
pub(super) fn route(
    namers: &[Option<&Namer>],
    lists: impl Fn(usize, &str) -> bool,
    interest: &BTreeSet<String>,
) -> Vec<BTreeSet<String>> {
    let mut wanted = vec![BTreeSet::new(); namers.len()];
    for exposed in interest {
        let claims: Vec<(usize, std::borrow::Cow<'_, str>)> = namers
            .iter()
            .enumerate()
            .filter_map(|(index, namer)| Some((index, namer.as_ref()?.upstream_uri(exposed)?)))
            .collect();
        let chosen = match claims.as_slice() {
            [one] => Some(one.clone()),
            several => several.iter().find(|(index, uri)| lists(*index, uri)).cloned(),
        };
        let Some((index, uri)) = chosen else { continue };
        let set: &mut BTreeSet<String> = &mut wanted[index];
        if set.len() < MAX_SUBSCRIPTIONS_PER_UPSTREAM {
            set.insert(uri.into_owned());
        } else {
            tracing::warn!(uri = %exposed, "an upstream has the most resource subscriptions allowed: this one is not made");
        }
    }
    wanted
}

impl Gateway {
    /// Follows what the server's streams listen for, and sets each upstream's `wanted` set.
    pub(super) async fn interest_loop(&self, mut interest: watch::Receiver<BTreeSet<String>>, stop: CancellationToken) {
        loop {
            let current = interest.borrow_and_update().clone();
            self.route_interest(&current);
            tokio::select! {
                () = stop.cancelled() => return,
                changed = interest.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Routes `interest` (exposed URIs) to the upstreams' `wanted` sets (upstream URIs).
    pub(super) fn route_interest(&self, interest: &BTreeSet<String>) {
        let roster = self.roster();
        let upstreams = &roster.upstreams;
        let namers: Vec<Option<&Namer>> =
            upstreams.iter().map(|upstream| upstream.oauth.is_none().then_some(&upstream.namer)).collect();
        let lists = |index: usize, uri: &str| {
            let listing = lock(&upstreams[index].listing).clone();
            listing.is_some_and(|listing| {
                listing
                    .resources
                    .iter()
                    .any(|resource| resource.get("uri").and_then(serde_json::Value::as_str) == Some(uri))
            })
        };
        for (upstream, wanted) in upstreams.iter().zip(route(&namers, lists, interest)) {
            upstream.wanted.send_if_modified(|current| {
                let changed = *current != wanted;
                *current = wanted;
                changed
            });
        }
    }

    /// An upstream's update of `uri`: delivered to this instance's streams under the exposed URI
    /// when the gateway asked for it, dropped otherwise.
    pub(super) fn resource_updated(&self, upstream: &Upstream, to: &Attached, uri: &str) {
        if !upstream.wanted.borrow().contains(uri) {
            tracing::debug!(upstream = %upstream.settings.id, "an update of a resource nobody listens for is dropped");
            return;
        }
        match upstream.namer.expose_uri(uri) {
            Ok(exposed) => to.server.events().deliver_here(ServerEvent::ResourceUpdated { uri: exposed }),
            Err(error) => tracing::warn!(upstream = %upstream.settings.id, %error, "a resource update is dropped"),
        }
    }

    /// 2025 era: makes the gateway's subscriptions at `upstream` (`held`, made on the current
    /// change stream's session) equal `wanted`. A failed request leaves its URI as it was, to be
    /// tried again at the next change or re-opened stream.
    pub(super) async fn sync_subscriptions(
        &self,
        upstream: &Arc<Upstream>,
        held: &mut BTreeSet<String>,
        wanted: &BTreeSet<String>,
    ) {
        let id = &upstream.settings.id;
        let gone: Vec<String> = held.difference(wanted).cloned().collect();
        let new: Vec<String> = wanted.difference(held).cloned().collect();
        for (uris, subscribe) in [(gone, false), (new, true)] {
            for uri in uris {
                match upstream.client.resource_subscription(&uri, subscribe).await {
                    Ok(()) if subscribe => {
                        held.insert(uri);
                    }
                    Ok(()) => {
                        held.remove(&uri);
                    }
                    Err(error) => tracing::warn!(upstream = %id, subscribe, %error, "resource subscription failed"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Separator;

    fn set(uris: &[&str]) -> BTreeSet<String> {
        uris.iter().map(|uri| (*uri).to_owned()).collect()
    }

    #[test]
    fn wanted_uris_route_to_their_own_upstream_only() {
        let every = Namer::new(Some("every"), Separator::Underscore);
        let docs = Namer::new(Some("docs"), Separator::Underscore);
        let root = Namer::new(None, Separator::Underscore).reserving(&[
            "every".to_owned(),
            "docs".to_owned(),
            "mail".to_owned(),
        ]);
        let namers = [Some(&every), Some(&docs), Some(&root), None];
        let interest =
            set(&["every+demo://resource/static/1", "docs+file:///a", "file:///b", "mail+imap://x", "every+", "nope"]);
        let wanted = route(&namers, |_, _| false, &interest);
        assert_eq!(wanted[0], set(&["demo://resource/static/1"]));
        assert_eq!(wanted[1], set(&["file:///a"]));
        assert_eq!(wanted[2], set(&["file:///b"]), "the unprefixed upstream claims only what is outside the prefixes");
        assert!(wanted[3].is_empty(), "a user_oauth upstream is never asked");
    }

    #[test]
    fn of_several_unprefixed_upstreams_the_one_that_lists_the_uri_has_it() {
        let first = Namer::new(None, Separator::Underscore);
        let second = Namer::new(None, Separator::Underscore);
        let namers = [Some(&first), Some(&second)];
        let wanted = route(&namers, |index, uri| index == 1 && uri == "file:///b", &set(&["file:///b", "file:///c"]));
        assert_eq!(wanted[1], set(&["file:///b"]));
        assert!(wanted[0].is_empty(), "file:///c is listed by neither: nobody's");
    }

    #[test]
    fn an_upstream_is_asked_for_a_bounded_number_of_resources() {
        let every = Namer::new(Some("every"), Separator::Underscore);
        let interest: BTreeSet<String> =
            (0..MAX_SUBSCRIPTIONS_PER_UPSTREAM + 10).map(|n| format!("every+demo://r/{n}")).collect();
        let wanted = route(&[Some(&every)], |_, _| false, &interest);
        assert_eq!(wanted[0].len(), MAX_SUBSCRIPTIONS_PER_UPSTREAM);
    }
}
