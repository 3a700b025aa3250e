//! The gateway's first job, reconciliation: every upstream's listing → each definition's pin
//! state (from the store's observations and decisions) → the published registry ([`App`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use palisade_server::{App, AppBuilder, Origin};
use palisade_store::{AuditRecord, Decision, PinDecision, PinObservation, PinRow, PinVerdict};
use serde_json::{Value, json};

use super::offers::{Offers, declares};
use super::relay::{ApprovedUi, CompletionRoutes, relayed_prompt, relayed_resource, relayed_template, relayed_tool};
use super::{Attached, CoverageCheck, Gateway, GatewayError, Listing, PinEntry, Refreshed, Roster, Upstream, lock};
use crate::churn::{Summary, Verdict};
use crate::names::{collisions, ui_link};
use crate::pins::{DecisionView, DefinitionKind, PinState, PinSubject, canonical_text, definition_digest, evaluate};
use crate::ui::{PIN_MEMBER, UiResource, check_contents, check_ui_meta};
use crate::upstream::launch::LaunchSpec;
use crate::upstream::{ListCache, ListKind, UpstreamError};

impl Gateway {
    /// Lists every upstream once (connecting first); an upstream that fails keeps its previous
    /// listing (or none) and is reported, never failing the others.
    pub async fn refresh_all(&self) {
        let roster = self.roster();
        futures::future::join_all(roster.upstreams.iter().map(|upstream| self.refresh_upstream(upstream))).await;
    }

    /// Re-lists upstream `index` of the current roster (its definitions are not re-pinned until
    /// a rebuild).
    pub async fn refresh(&self, index: usize) -> Refreshed {
        let Some(upstream) = self.roster().upstreams.get(index).cloned() else { return Refreshed::Failed };
        self.refresh_upstream(&upstream).await
    }

    /// Re-lists one upstream (its definitions are not re-pinned until a rebuild).
    pub(super) async fn refresh_upstream(&self, upstream: &Upstream) -> Refreshed {
        if let Err(reason) = self.gate_launch(upstream).await {
            let had = lock(&upstream.listing).take().is_some();
            let repeated = lock(&upstream.listing_error).replace(reason.clone()).as_ref() == Some(&reason);
            if !repeated {
                tracing::warn!(upstream = %upstream.settings.id, %reason,
                    "stdio upstream not started (`palisade upstreams show {}` shows its launch)", upstream.settings.id);
            }
            self.bound_freshness();
            return if had { Refreshed::Changed } else { Refreshed::Failed };
        }
        let started = std::time::Instant::now();
        let listed = list_upstream(upstream, self.inner.clock.now_ms()).await;
        upstream.series.observe(None, started.elapsed(), &listed);
        let outcome = match listed {
            Ok(listing) => {
                let mut current = lock(&upstream.listing);
                let changed = current.as_deref().is_none_or(|old| !old.same_as(&listing));
                *current = Some(Arc::new(listing));
                *lock(&upstream.listing_error) = None;
                if changed { Refreshed::Changed } else { Refreshed::Unchanged }
            }
            Err(error) => {
                *lock(&upstream.listing_error) = Some(error.to_string());
                tracing::warn!(upstream = %upstream.settings.id, %error, "upstream listing failed; keeping the previous one");
                Refreshed::Failed
            }
        };
        self.bound_freshness();
        outcome
    }

    /// What the gateway's lists say of their freshness, from its upstreams' last listings: fresh
    /// until the first of them is no longer (a kept listing whose time has passed bounds it to
    /// 0 ms), and `private` when one of them is. The gateway lists as itself, one authorization
    /// for every caller, and serves only approved definitions: what it relays from a `private`
    /// list is its own, and clients are told not to share it across authorizations.
    pub(super) fn bound_freshness(&self) {
        let (mut until, mut private) = (None::<i64>, false);
        for upstream in &self.roster().upstreams {
            let Some(listing) = lock(&upstream.listing).clone() else { continue };
            if let Some(end) = listing.fresh_until_ms() {
                until = Some(until.map_or(end, |until| until.min(end)));
            }
            private |= listing.cache.private;
        }
        self.inner.freshness.set(until, private);
    }

    /// How long `upstream`'s listing is kept before it is made again: the relisting interval,
    /// or less when the upstream says its lists stay fresh for less (never under
    /// [`MIN_RELIST`]).
    pub(super) fn relist_wait(&self, upstream: &Upstream) -> std::time::Duration {
        let every = self.settings().pins.relist;
        let ttl = lock(&upstream.listing).as_ref().and_then(|listing| listing.cache.ttl_ms);
        match ttl {
            Some(ttl) => std::time::Duration::from_millis(ttl).max(MIN_RELIST).min(every),
            None => every,
        }
    }

    /// A stdio upstream's launch, resolved now (the executable re-hashed), recorded as its
    /// `launch` pin and evaluated: `Ok` when it is the approved one (the client may start
    /// processes), else why not (every process is stopped). HTTP upstreams: `Ok`.
    async fn gate_launch(&self, upstream: &Upstream) -> Result<(), String> {
        let settings = upstream.settings.clone();
        let resolved = tokio::task::spawn_blocking(move || {
            let path = settings.stdio.as_ref().and_then(|stdio| stdio.search_path.clone());
            LaunchSpec::resolve(&settings, path.as_deref())
        })
        .await
        .map_err(|_| "the launch could not be resolved".to_owned())?;
        let spec = match resolved {
            None => return Ok(()),
            Some(Ok(spec)) => spec,
            Some(Err(error)) => {
                upstream.client.set_launch_approved(None).await;
                *lock(&upstream.launch) = None;
                return Err(format!("its launch cannot be resolved: {error}"));
            }
        };
        let subject = spec.subject();
        let pin_id = subject.pin_id();
        let observation = match spec.observation(self.inner.clock.now_ms()) {
            Ok(observation) => observation,
            Err(error) => {
                upstream.client.set_launch_approved(None).await;
                return Err(error.to_string());
            }
        };
        let digest = observation.digest.clone();
        let stored = async {
            if lock(&self.inner.observed).get(&pin_id) != Some(&digest) {
                self.inner.store.observe_pins(vec![observation]).await?;
                lock(&self.inner.observed).insert(pin_id.clone(), digest.clone());
            }
            self.inner.store.pin(&pin_id).await
        };
        let row = match stored.await {
            Ok(row) => row,
            Err(error) => {
                // The store cannot confirm an approval: fail closed.
                upstream.client.set_launch_approved(None).await;
                return Err(format!("its launch approval cannot be read: {error}"));
            }
        };
        let decision = self.decision_view(&subject, row.as_ref());
        let state = evaluate(&digest, decision, self.settings().pins.require_signed);
        let reason = match state {
            PinState::Approved => None,
            PinState::Held => Some("its launch changed after it was approved: review it again".to_owned()),
            PinState::Rejected => Some("its launch was rejected by a reviewer".to_owned()),
            PinState::Pending => Some("its launch was never approved".to_owned()),
        };
        *lock(&upstream.launch) = Some(PinEntry {
            pin_id,
            upstream: upstream.settings.id.clone(),
            kind: DefinitionKind::Launch.as_str(),
            name: String::new(),
            exposed: None,
            digest: digest.clone(),
            state: state.as_str(),
            served: reason.is_none(),
            reason: reason.clone(),
        });
        match reason {
            None => {
                upstream.client.set_launch_approved(Some(digest)).await;
                Ok(())
            }
            Some(reason) => {
                upstream.client.set_launch_approved(None).await;
                Err(reason)
            }
        }
    }

    /// A pin's latest decision as [`evaluate`] reads it (its signature checked).
    fn decision_view<'a>(&self, subject: &PinSubject, row: Option<&'a PinRow>) -> Option<DecisionView<'a>> {
        let settings = self.settings();
        let reviewers = &settings.pins.reviewers;
        row.and_then(|row| row.decision.as_ref()).map(|decision| DecisionView {
            approved: decision.verdict == PinVerdict::Approved,
            digest: &decision.digest,
            signature_valid: decision
                .signature
                .as_deref()
                .is_some_and(|signature| reviewers.verify(&decision.reviewer, subject, &decision.digest, signature)),
        })
    }

    /// A re-listing as the loops make it, on a gateway whose loops do not run: the registry is rebuilt when the
    /// listing changed and not published (what the gateway-relist benchmark measures).
    pub async fn relist_unpublished(&self, index: usize) -> Refreshed {
        let Some(upstream) = self.roster().upstreams.get(index).cloned() else { return Refreshed::Failed };
        self.relist(&upstream, None).await
    }

    /// Re-lists one upstream and, when what it lists changed, rebuilds the registry: an
    /// upstream listing the same definitions as before costs one listing and nothing else.
    pub(super) async fn relist(&self, upstream: &Upstream, to: Option<&Attached>) -> Refreshed {
        let started = std::time::Instant::now();
        let outcome = self.refresh_upstream(upstream).await;
        if outcome == Refreshed::Changed {
            self.rebuild(to).await;
        }
        tracing::debug!(upstream = %upstream.settings.id, outcome = outcome.as_str(), elapsed_ms = started.elapsed().as_millis() as u64, "re-listed");
        outcome
    }

    /// Computes every pin's state (writing changed definitions to the store first) and the
    /// application of everything that may be served. `coverage` is the signed kill-switch
    /// registry's check when the server runs a kill switch: an operation it does not cover is
    /// held (`None`: the first build, whose operations the kill switch's registry is made from).
    pub async fn build_app(&self, coverage: Option<&CoverageCheck>) -> Result<App, GatewayError> {
        self.build_app_on(&self.roster(), coverage).await
    }

    /// [`Self::build_app`] of `roster` (the current one, or the one a reload offers).
    pub(super) async fn build_app_on(
        &self,
        roster: &Roster,
        coverage: Option<&CoverageCheck>,
    ) -> Result<App, GatewayError> {
        let definitions = self.collect(roster);
        self.observe(&definitions).await?;
        let rows = self.inner.store.pins(None).await?;
        *lock(&self.inner.decisions_seen) = fingerprint(rows.iter().filter_map(|row| row.decision.as_ref()));
        let rows: HashMap<&str, &PinRow> = rows.iter().map(|row| (row.observation.pin_id.as_str(), row)).collect();
        let mut entries = Vec::with_capacity(definitions.len());
        for definition in &definitions {
            let row = rows.get(definition.pin_id.as_str()).copied();
            entries.push(self.entry(roster, definition, row));
        }
        self.hold_ambiguous(&definitions, &mut entries);
        let (app, mut entries) = self.assemble(roster, &definitions, entries, coverage)?;
        entries.extend(roster.upstreams.iter().filter_map(|upstream| lock(&upstream.launch).clone()));
        self.record_transitions(&entries).await;
        *lock(&self.inner.report) = entries;
        Ok(app)
    }

    /// [`Self::build_app`] and publishes it on the attached server (`None`: builds only, for
    /// [`Self::relist_unpublished`]).
    /// Requests that arrive while a rebuild runs are merged into one more rebuild after it, so N
    /// upstreams changing at once cost two rebuilds, not N.
    pub(super) async fn rebuild(&self, to: Option<&Attached>) {
        use std::sync::atomic::Ordering;
        self.inner.rebuild_wanted.store(true, Ordering::SeqCst);
        loop {
            let Ok(one) = self.inner.rebuilding.try_lock() else { return };
            while self.inner.rebuild_wanted.swap(false, Ordering::SeqCst) {
                self.rebuild_once(to).await;
            }
            drop(one);
            // A request that came between the last swap and the unlock is not lost.
            if !self.inner.rebuild_wanted.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    async fn rebuild_once(&self, to: Option<&Attached>) {
        match self.build_app(to.and_then(|to| to.coverage.as_ref())).await {
            Ok(app) => {
                let Some(to) = to else { return };
                if let Err(error) = to.server.publish(app) {
                    tracing::error!(%error, "the gateway's new registry was refused; the previous one keeps serving");
                }
            }
            Err(error) => {
                tracing::error!(%error, "pin states could not be computed; the previous registry keeps serving")
            }
        }
    }

    /// Every definition every upstream of `roster` last listed, with its pin identity and digest.
    fn collect(&self, roster: &Roster) -> Vec<Definition> {
        let mut out = Vec::new();
        for (index, upstream) in roster.upstreams.iter().enumerate() {
            let Some(listing) = lock(&upstream.listing).clone() else { continue };
            let mut push = |kind: DefinitionKind, name: Option<&str>, raw: &Value, pinned: Pinned<'_>| {
                out.push(Definition::new(index, upstream, kind, name, raw, pinned));
            };
            for tool in &listing.tools {
                push(DefinitionKind::Tool, tool.get("name").and_then(Value::as_str), tool, with_ui(tool, &listing.ui));
            }
            for prompt in &listing.prompts {
                push(DefinitionKind::Prompt, prompt.get("name").and_then(Value::as_str), prompt, as_listed(prompt));
            }
            for resource in &listing.resources {
                let uri = resource.get("uri").and_then(Value::as_str);
                push(DefinitionKind::Resource, uri, resource, with_checked_ui_meta(resource));
            }
            for template in &listing.templates {
                let uri = template.get("uriTemplate").and_then(Value::as_str);
                push(DefinitionKind::ResourceTemplate, uri, template, with_checked_ui_meta(template));
            }
            if let Some(instructions) = &listing.info.instructions {
                let instructions = json!(instructions);
                push(DefinitionKind::Instructions, Some(""), &instructions, as_listed(&instructions));
            }
        }
        // A name an upstream lists twice has two definitions for one pin: neither is served
        // (and neither is written, so the store's batch stays valid for everyone else).
        let mut seen: HashMap<String, usize> = HashMap::new();
        for definition in &out {
            *seen.entry(definition.pin_id.clone()).or_default() += 1;
        }
        for definition in &mut out {
            if seen.get(&definition.pin_id).is_some_and(|count| *count > 1) {
                definition.digest =
                    Err(format!("the upstream lists this {} more than once", definition.subject.kind.as_str()));
            }
        }
        out
    }

    /// Writes definitions whose digest changed since the last write.
    async fn observe(&self, definitions: &[Definition]) -> Result<(), GatewayError> {
        let now = self.inner.clock.now_ms();
        let changed: Vec<PinObservation> = {
            let observed = lock(&self.inner.observed);
            definitions
                .iter()
                .filter_map(|d| {
                    let (digest, _) = d.digest.as_ref().ok()?;
                    (observed.get(&d.pin_id) != Some(digest)).then(|| d.observation(now)).flatten()
                })
                .collect()
        };
        if changed.is_empty() {
            return Ok(());
        }
        let written: Vec<(String, String)> = changed.iter().map(|o| (o.pin_id.clone(), o.digest.clone())).collect();
        self.inner.store.observe_pins(changed).await?;
        lock(&self.inner.observed).extend(written);
        Ok(())
    }

    /// One definition's pin state and whether policy lets it be served.
    fn entry(&self, roster: &Roster, definition: &Definition, row: Option<&PinRow>) -> PinEntry {
        let pins = &roster.settings.pins;
        let upstream = &roster.upstreams[definition.upstream];
        let mut entry = PinEntry {
            pin_id: definition.pin_id.clone(),
            upstream: upstream.settings.id.clone(),
            kind: definition.subject.kind.as_str(),
            name: definition.subject.name.clone(),
            exposed: None,
            digest: String::new(),
            state: PinState::Pending.as_str(),
            served: false,
            reason: None,
        };
        let (digest, _) = match &definition.digest {
            Ok(pair) => pair,
            Err(reason) => {
                entry.state = PinState::Held.as_str();
                entry.reason = Some(reason.clone());
                return entry;
            }
        };
        entry.digest = digest.clone();
        let decision = self.decision_view(&definition.subject, row);
        let state = evaluate(digest, decision, pins.require_signed);
        entry.state = state.as_str();
        match definition.expose(upstream) {
            Ok(exposed) => entry.exposed = Some(exposed),
            Err(reason) => {
                entry.reason = Some(reason);
                return entry;
            }
        }
        if definition.subject.kind == DefinitionKind::Tool && upstream.settings.deny.contains(&definition.subject.name)
        {
            entry.reason = Some("denied by the operator's policy (deny)".into());
            return entry;
        }
        if state != PinState::Approved {
            entry.reason = Some(match state {
                PinState::Held => "its definition changed after it was approved: review it again".into(),
                PinState::Rejected => "rejected by a reviewer".into(),
                _ if pins.require_signed && decision.is_some_and(|d| d.approved) => {
                    "approved without a valid reviewer signature".into()
                }
                _ => "never reviewed".into(),
            });
            return entry;
        }
        entry.served = true;
        entry
    }

    /// Exposed names claimed twice among the definitions that could be served are held: none of
    /// them is served, each with its reason. Only servable definitions (approved, exposable, not
    /// denied) claim a name: one no reviewer approved never withdraws another upstream's. An
    /// unprefixed name or URI inside another upstream's namespace never gets this far: its
    /// namer refuses to expose it ([`Namer::reserving`]), so it is held, alone, before any
    /// name is counted.
    fn hold_ambiguous(&self, definitions: &[Definition], entries: &mut [PinEntry]) {
        // Instructions have no name: each upstream's are its own section, never a collision.
        let key = |d: &Definition, e: &PinEntry| {
            (e.served && d.subject.kind != DefinitionKind::Instructions)
                .then(|| e.exposed.as_ref().map(|name| format!("{}\u{1f}{name}", d.subject.kind.namespace())))
                .flatten()
        };
        let claimed: Vec<String> = definitions.iter().zip(entries.iter()).filter_map(|(d, e)| key(d, e)).collect();
        let twice = collisions(claimed.iter().map(String::as_str));
        for (definition, entry) in definitions.iter().zip(entries.iter_mut()) {
            let Some(claim) = key(definition, entry) else { continue };
            if twice.contains(&claim) {
                let exposed = entry.exposed.as_deref().unwrap_or_default();
                entry.served = false;
                entry.reason =
                    Some(format!("exposed name {exposed:?} is claimed by more than one approved definition"));
            }
        }
    }

    /// The application of every served definition of `roster`. A definition the registry
    /// refuses (its schema does not compile, …) or the signed kill-switch registry does not list
    /// is held alone, with its reason.
    fn assemble(
        &self,
        roster: &Roster,
        definitions: &[Definition],
        mut entries: Vec<PinEntry>,
        coverage: Option<&CoverageCheck>,
    ) -> Result<(App, Vec<PinEntry>), GatewayError> {
        let (mut tools, mut prompts, mut resources, mut templates) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut completion_prompts, mut completion_templates) = (BTreeMap::new(), BTreeMap::new());
        let mut instructions = Vec::new();
        let mut offers = Offers::default();
        let covered = |key: &str| coverage.is_none_or(|check| check(key));
        // Per upstream, the UI contents approved with a served tool: a UI read is relayed only
        // while its contents are one of these.
        let mut approved_ui = vec![BTreeMap::new(); roster.upstreams.len()];
        for (definition, entry) in definitions.iter().zip(entries.iter()) {
            if let (true, Some((uri, digest))) = (entry.served, &definition.ui) {
                approved_ui[definition.upstream].insert(uri.clone(), digest.clone());
            }
        }
        let approved_ui: Vec<ApprovedUi> = approved_ui.into_iter().map(Arc::new).collect();
        for (definition, entry) in definitions.iter().zip(entries.iter_mut()) {
            if !entry.served {
                continue;
            }
            let ui = &approved_ui[definition.upstream];
            let upstream = &roster.upstreams[definition.upstream];
            let exposed = entry.exposed.clone().unwrap_or_default();
            let origin = Origin {
                upstream: upstream.settings.id.clone(),
                pin: entry.digest.clone(),
                audit_detail: format!(
                    "upstream={} exposed={} upstream_name={} pin={}",
                    upstream.settings.id,
                    exposed,
                    definition.subject.name,
                    &entry.digest[..12.min(entry.digest.len())]
                ),
            };
            let (list_key, operation_key) = match definition.subject.kind {
                DefinitionKind::Tool => ("tools/list", format!("tools/call:{exposed}")),
                DefinitionKind::Prompt => ("prompts/list", format!("prompts/get:{exposed}")),
                DefinitionKind::Resource | DefinitionKind::ResourceTemplate => {
                    ("resources/list", format!("resources/read:{exposed}"))
                }
                // Launches are never listed definitions (they gate the listing itself).
                DefinitionKind::Instructions | DefinitionKind::Launch => ("", String::new()),
            };
            if definition.subject.kind != DefinitionKind::Instructions
                && !(covered(&operation_key) && covered(list_key))
            {
                entry.served = false;
                entry.reason = Some(format!("the signed kill-switch registry does not list {operation_key}"));
                continue;
            }
            let Some(raw) = definition.raw.as_object() else {
                if let Value::String(text) = &definition.raw {
                    instructions.push(format!("[{}] {text}", upstream.settings.id));
                }
                continue;
            };
            let raw = raw.clone();
            offers.note(upstream, definition.subject.kind);
            // Completions are relayed only to an upstream that declares them; the others'
            // prompts and templates complete to nothing, here.
            let completes = declares(upstream, "completions", None);
            match definition.subject.kind {
                DefinitionKind::Tool => match relayed_tool(upstream, &exposed, &definition.subject.name, raw, origin) {
                    Ok(tool) => tools.push(tool),
                    Err(reason) => {
                        entry.served = false;
                        entry.reason = Some(reason);
                    }
                },
                DefinitionKind::Prompt => {
                    if completes {
                        completion_prompts
                            .insert(exposed.clone(), (definition.upstream, definition.subject.name.clone()));
                    }
                    prompts.push(relayed_prompt(upstream, &exposed, &definition.subject.name, raw, origin));
                }
                DefinitionKind::Resource => resources.push(relayed_resource(upstream, &exposed, raw, origin, ui)),
                DefinitionKind::ResourceTemplate => {
                    if completes {
                        completion_templates
                            .insert(exposed.clone(), (definition.upstream, definition.subject.name.clone()));
                    }
                    templates.push(relayed_template(upstream, &exposed, raw, origin, ui));
                }
                DefinitionKind::Instructions | DefinitionKind::Launch => {}
            }
        }
        let mut builder = App::builder("palisade-gateway", env!("CARGO_PKG_VERSION"))
            .dynamic()
            .list_freshness(self.inner.freshness.clone())
            .resource_subscriptions(offers.resource_subscriptions);
        let routes = Arc::new(CompletionRoutes {
            upstreams: roster.upstreams.clone(),
            prompts: completion_prompts,
            templates: completion_templates,
        });
        if !routes.is_empty() {
            builder = builder.relayed_completion(move |ctx, reference, params| {
                let routes = routes.clone();
                async move { routes.complete(&ctx, reference, params).await }
            });
        }
        builder = tools.into_iter().fold(builder, AppBuilder::tool);
        builder = prompts.into_iter().fold(builder, AppBuilder::prompt);
        builder = resources.into_iter().fold(builder, AppBuilder::resource);
        builder = templates.into_iter().fold(builder, AppBuilder::resource_template);
        if !instructions.is_empty() {
            builder = builder.instructions(instructions.join("\n\n"));
        }
        let app = builder
            .build()
            .map_err(|error| GatewayError::Upstream { upstream: "*".into(), reason: error.to_string() })?;
        Ok((app, entries))
    }

    /// Logs and audits every pin whose standing changed since the last build (a new definition,
    /// a hold, an approval taking effect, a rejection). An upstream's own changes (new or changed
    /// definitions, and what they do to the served flag) are coalesced while it churns
    /// ([`crate::churn`]); a reviewer's decision taking effect is always recorded, and closes its
    /// upstream's coalescing window.
    async fn record_transitions(&self, entries: &[PinEntry]) {
        let before: HashMap<String, (&'static str, String, bool)> = lock(&self.inner.report)
            .iter()
            .map(|entry| (entry.pin_id.clone(), (entry.state, entry.digest.clone(), entry.served)))
            .collect();
        let now = self.inner.clock.now_unsigned_ms();
        // Per upstream: (coalescible changes, whether one is a listed definition).
        let mut own: BTreeMap<&str, (Vec<&PinEntry>, bool)> = BTreeMap::new();
        let mut changed = Vec::new();
        for entry in entries {
            let previous = before.get(&entry.pin_id);
            match previous {
                Some((state, digest, served))
                    if *state == entry.state && *digest == entry.digest && *served == entry.served => {}
                // The same definition in another state: a reviewer decided.
                Some((state, digest, _)) if *digest == entry.digest && *state != entry.state => changed.push(entry),
                _ => {
                    let (list, definitions) = own.entry(entry.upstream.as_str()).or_default();
                    list.push(entry);
                    *definitions |= entry.kind != DefinitionKind::Launch.as_str();
                }
            }
        }
        let mut records = Vec::new();
        {
            let mut churn = lock(&self.inner.churn);
            // A decision took effect: its upstream's next change is recorded in full again.
            let decided: BTreeSet<&str> = changed.iter().map(|entry| entry.upstream.as_str()).collect();
            for upstream in decided {
                records.extend(churn.reset(upstream).map(|summary| churn_record(&summary, now)));
            }
            for (upstream, (list, definitions)) in own {
                let count = list.len() as u64;
                match churn.observe(upstream, count, definitions, now) {
                    Verdict::Record => changed.extend(list),
                    Verdict::Coalesce { started } => {
                        if started {
                            tracing::warn!(%upstream, window_secs = crate::churn::WINDOW_MS / 1000,
                                "upstream changes its definitions again and again: its changes are counted, \
                                 and audited as one record per window");
                        }
                        for entry in list {
                            tracing::debug!(pin = %entry.pin_id, %upstream, name = %entry.name, state = entry.state,
                                served = entry.served, "definition changed again (coalesced)");
                        }
                    }
                    Verdict::Summarize(summary) => records.push(churn_record(&summary, now)),
                }
            }
            records.extend(churn.due(now, false).iter().map(|summary| churn_record(summary, now)));
        }
        for entry in changed {
            let digest = &entry.digest[..12.min(entry.digest.len())];
            let was_served = before.get(&entry.pin_id).is_some_and(|(_, _, served)| *served);
            let reason = entry.reason.as_deref().unwrap_or("");
            if entry.served {
                tracing::info!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, "definition served");
            } else if was_served || entry.state == PinState::Held.as_str() {
                // A served definition withdrawn (a rug pull, a rejection, a new collision).
                tracing::warn!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, state = entry.state,
                    reason, "definition withdrawn: not served");
            } else {
                tracing::debug!(pin = %entry.pin_id, upstream = %entry.upstream, name = %entry.name, state = entry.state,
                    reason, "definition not served");
            }
            records.push(AuditRecord {
                at_ms: now,
                trace_id: palisade_server::audit::fresh_trace_id(),
                stage: "pins".into(),
                decision: if entry.served { Decision::Allow } else { Decision::Deny },
                operation: format!("pins/{}:{}", entry.kind, entry.exposed.as_deref().unwrap_or(&entry.name)),
                principal_digest: None,
                tenant_digest: None,
                client_digest: None,
                scopes: Vec::new(),
                policy_version: Some(format!("pin:{digest}")),
                code: None,
                detail: Some(format!(
                    "upstream={} pin_id={} upstream_name={} state={} served={}",
                    entry.upstream, entry.pin_id, entry.name, entry.state, entry.served
                )),
            });
        }
        let withheld = entries.iter().filter(|entry| !entry.served).count();
        if !records.is_empty() && withheld > 0 {
            tracing::info!(withheld, "definitions not served (`palisade pins list` shows why)");
        }
        if !records.is_empty()
            && let Err(error) = self.inner.store.append_batch(records).await
        {
            tracing::error!(%error, "pin state changes could not be audited");
        }
    }
}

/// One definition as listed, with its identity and digest.
struct Definition {
    upstream: usize,
    subject: PinSubject,
    pin_id: String,
    raw: Value,
    /// (digest, canonical text), or why it cannot be pinned.
    digest: Result<(String, String), String>,
    /// A tool's MCP Apps UI resource, pinned with it: (upstream URI, contents digest).
    ui: Option<(String, String)>,
}

/// The shortest wait between two listings of one upstream, whatever `ttlMs` its lists carry:
/// a list fresh for less (0 ms included) is kept this long at most.
const MIN_RELIST: std::time::Duration = std::time::Duration::from_secs(1);

/// The most UI resources one listing reads (distinct links of its tools).
const MAX_UI_READS: usize = 64;

/// What a definition is pinned as (the definition as listed, or a tool with its UI resource
/// under [`PIN_MEMBER`]) with its UI's (upstream URI, contents digest), or why it cannot be.
type Pinned<'a> = Result<(Cow<'a, Value>, Option<(String, String)>), String>;

/// A definition pinned as listed.
fn as_listed(raw: &Value) -> Pinned<'_> {
    Ok((Cow::Borrowed(raw), None))
}

/// A tool as pinned: with what its listing read of the UI resource it links to (a changed page,
/// CSP or permission is a changed definition), or held when the link is unusable or the
/// resource could not be read and checked.
fn with_ui<'a>(tool: &'a Value, ui: &BTreeMap<String, Result<UiResource, String>>) -> Pinned<'a> {
    let Some(map) = tool.as_object() else { return as_listed(tool) };
    let Some(uri) = ui_link(map).map_err(|refusal| refusal.to_string())? else { return as_listed(tool) };
    if map.contains_key(PIN_MEMBER) {
        return Err(format!("the tool's definition has a member {PIN_MEMBER:?}, where the gateway pins its UI"));
    }
    match ui.get(uri) {
        Some(Ok(resource)) => {
            let mut pinned = map.clone();
            pinned.insert(PIN_MEMBER.into(), resource.pinned.clone());
            Ok((Cow::Owned(Value::Object(pinned)), Some((uri.to_owned(), resource.digest.clone()))))
        }
        Some(Err(reason)) => Err(format!("its MCP Apps UI resource {uri} cannot be pinned: {reason}")),
        None => Err(format!("its MCP Apps UI resource {uri} was not read (a listing reads at most {MAX_UI_READS})")),
    }
}

/// A resource or template pinned as listed, once the MCP Apps CSP and permissions its `_meta`
/// declares pass [`check_ui_meta`].
fn with_checked_ui_meta(raw: &Value) -> Pinned<'_> {
    if let Some(Value::Object(meta)) = raw.get("_meta") {
        check_ui_meta(meta).map_err(|reason| format!("its MCP Apps metadata is refused: {reason}"))?;
    }
    as_listed(raw)
}

impl Definition {
    fn new(
        upstream: usize,
        settings: &Upstream,
        kind: DefinitionKind,
        name: Option<&str>,
        raw: &Value,
        pinned: Pinned<'_>,
    ) -> Self {
        let subject = PinSubject {
            upstream_id: settings.settings.id.clone(),
            upstream_url: settings.settings.url.to_string(),
            kind,
            name: name.unwrap_or("").to_owned(),
        };
        let mut ui = None;
        let digest = if name.is_none() {
            Err(format!("the {} has no name", kind.as_str()))
        } else if matches!(kind, DefinitionKind::Tool | DefinitionKind::Prompt)
            && !name.is_some_and(crate::names::is_spec_name)
        {
            // Held before it is stored: never served, never offered for review, and a name
            // with terminal escapes or invisible characters never reaches a table.
            Err(format!(
                "the {}'s name is not a valid MCP name (1 to 128 characters of A-Z a-z 0-9 _ - .): held, never served",
                kind.as_str()
            ))
        } else {
            match pinned {
                Err(reason) => Err(reason),
                Ok((pinned, link)) => {
                    ui = link;
                    match (definition_digest(&pinned), canonical_text(&pinned)) {
                        (Ok(digest), Ok(text)) => Ok((digest, text)),
                        (Err(error), _) | (_, Err(error)) => Err(format!("the definition cannot be pinned: {error}")),
                    }
                }
            }
        };
        let mut definition = Self { upstream, pin_id: subject.pin_id(), subject, raw: raw.clone(), digest, ui };
        // What the store would refuse (an over-long name, a definition over 1 MiB) is held here,
        // alone, instead of failing the batch of every other definition.
        if let Some(Err(error)) = definition.observation(0).map(|observation| observation.validate()) {
            definition.digest = Err(format!("the definition cannot be stored: {error}"));
        }
        definition
    }

    /// What the store keeps of it (`None` when it cannot be pinned).
    fn observation(&self, now_ms: i64) -> Option<PinObservation> {
        let (digest, text) = self.digest.as_ref().ok()?;
        Some(PinObservation {
            pin_id: self.pin_id.clone(),
            upstream_id: self.subject.upstream_id.clone(),
            upstream_url: self.subject.upstream_url.clone(),
            kind: self.subject.kind.as_str().to_owned(),
            name: self.subject.name.clone(),
            digest: digest.clone(),
            definition: text.clone(),
            seen_at_ms: now_ms,
        })
    }

    /// The exposed name or URI, or why there is none.
    fn expose(&self, upstream: &Upstream) -> Result<String, String> {
        let name = &self.subject.name;
        match self.subject.kind {
            DefinitionKind::Tool | DefinitionKind::Prompt => {
                upstream.namer.expose_name(name).map_err(|e| e.to_string())
            }
            DefinitionKind::Resource | DefinitionKind::ResourceTemplate => {
                upstream.namer.expose_uri(name).map_err(|e| e.to_string())
            }
            DefinitionKind::Instructions | DefinitionKind::Launch => Ok(String::new()),
        }
    }
}

impl DefinitionKind {
    /// Names of tools, prompts and resources live in separate namespaces.
    fn namespace(self) -> &'static str {
        match self {
            DefinitionKind::Tool => "tool",
            DefinitionKind::Prompt => "prompt",
            DefinitionKind::Resource | DefinitionKind::ResourceTemplate => "resource",
            DefinitionKind::Instructions => "instructions",
            DefinitionKind::Launch => "launch",
        }
    }
}

/// A fingerprint of a set of decisions (pin, digest, verdict, reviewer, signature), whatever
/// their order.
pub(super) fn fingerprint<'a>(decisions: impl Iterator<Item = &'a PinDecision>) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut keyed: Vec<&PinDecision> = decisions.collect();
    keyed.sort_by(|a, b| a.pin_id.cmp(&b.pin_id));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for decision in keyed {
        (&decision.pin_id, &decision.digest, decision.verdict.as_str(), &decision.reviewer, &decision.signature)
            .hash(&mut hasher);
    }
    hasher.finish()
}

async fn list_upstream(upstream: &Upstream, now_ms: i64) -> Result<Listing, UpstreamError> {
    let info = match upstream.client.info() {
        Some(info) => info,
        None => std::sync::Arc::new(upstream.client.connect().await?),
    };
    let has = |capability: &str| info.capabilities.get(capability).is_some();
    let mut caches = Vec::new();
    let tools = if has("tools") { list_kind(upstream, ListKind::Tools, &mut caches).await? } else { Vec::new() };
    let prompts = if has("prompts") { list_kind(upstream, ListKind::Prompts, &mut caches).await? } else { Vec::new() };
    let (resources, templates) = if has("resources") {
        (
            list_kind(upstream, ListKind::Resources, &mut caches).await?,
            list_kind(upstream, ListKind::ResourceTemplates, &mut caches).await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let ui = read_ui_resources(upstream, &tools).await;
    let cache = caches.into_iter().reduce(ListCache::and).unwrap_or_default();
    Ok(Listing { info: (*info).clone(), tools, prompts, resources, templates, ui, cache, listed_at_ms: now_ms })
}

/// One list's items, its caching added to `caches`.
async fn list_kind(
    upstream: &Upstream,
    kind: ListKind,
    caches: &mut Vec<ListCache>,
) -> Result<Vec<Value>, UpstreamError> {
    let (items, cache) = upstream.client.list(kind).await?;
    caches.push(cache);
    Ok(items)
}

/// Reads (as the gateway) and checks the MCP Apps UI resources `tools` link to, at most
/// [`MAX_UI_READS`] of them: each tool is pinned with what was read ([`with_ui`]). A read that
/// fails holds the tools linking to it, not the listing.
async fn read_ui_resources(upstream: &Upstream, tools: &[Value]) -> BTreeMap<String, Result<UiResource, String>> {
    let links: BTreeSet<&str> =
        tools.iter().filter_map(Value::as_object).filter_map(|tool| ui_link(tool).ok().flatten()).collect();
    let mut read = BTreeMap::new();
    for uri in links.into_iter().take(MAX_UI_READS) {
        let checked = match upstream.client.read_as_gateway(uri).await {
            Ok(result) => check_contents(uri, &result),
            Err(error) => Err(format!("it cannot be read: {error}")),
        };
        read.insert(uri.to_owned(), checked);
    }
    read
}

/// The audit record of one upstream's coalesced churn: `pins/churn:<upstream>`, with the count.
pub(super) fn churn_record(summary: &Summary, now_ms: u64) -> AuditRecord {
    AuditRecord {
        at_ms: now_ms,
        trace_id: palisade_server::audit::fresh_trace_id(),
        stage: "pins".into(),
        decision: Decision::Deny,
        operation: format!("pins/churn:{}", summary.upstream),
        principal_digest: None,
        tenant_digest: None,
        client_digest: None,
        scopes: Vec::new(),
        policy_version: None,
        code: None,
        detail: Some(format!(
            "upstream={} coalesced={} since_ms={} window_secs={}",
            summary.upstream,
            summary.coalesced,
            summary.since_ms,
            crate::churn::WINDOW_MS / 1000
        )),
    }
}
