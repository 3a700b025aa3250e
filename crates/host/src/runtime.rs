//! The composition root: [`Runtime`] builds every service of a running server from validated
//! settings (store, authenticator, audit writer and checkpointer, kill switch, gateway,
//! delegation, handles, tasks, sessions, the development authorization server, the event
//! fan-out), owns every periodic job, serves one transport, and shuts down in order: stop
//! accepting, drain requests, stop the jobs, flush the audit, close the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use palisade_apps::AppName;
use palisade_base::clock::SystemClock;
use palisade_gateway::gateway::CoverageCheck;
use palisade_server::delegation::DelegationService;
use palisade_server::http::{MetricsExposure, ServeOptions};
use palisade_server::secret::ServerSecret;
use palisade_server::{App, HandleService, Server, ServerConfig, SubjectKey, TaskConfig, TaskService};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::answer_relay::ANSWER_RELAY_KEY_LABEL;
use crate::killswitch::KillSwitchRuntime;
use crate::reload::{ReloadSource, Reloader};
use crate::settings::{ConfigError, Settings, keys};
use crate::{audit, authn, events_bridge, gateway, jobs, killswitch, secrets};

/// The transport a [`Runtime`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Streamable HTTP on `listen` (and `/metrics` on `metrics_listen` when configured).
    Http,
    /// MCP messages on standard input and output.
    Stdio,
}

/// A running server and everything that keeps it running.
pub struct Runtime {
    server: Arc<Server>,
    gateway: Option<palisade_gateway::Gateway>,
    checkpointer: palisade_store::Checkpointer,
    /// Handle retention, task maintenance and the session purge, stopped in that order.
    jobs: [JoinHandle<()>; 3],
    /// The HTTP listener and the metrics exposure, until [`Runtime::serve`] takes them.
    http: Option<(TcpListener, ServeOptions)>,
    local_addr: Option<SocketAddr>,
    transport: Transport,
    /// Dropped last: the kill switch and the development authority it may run.
    _kill_switch: Option<KillSwitchRuntime>,
}

/// The application a [`Runtime`] serves, and the gateway and kill switch behind it.
struct Assembled {
    app: App,
    gateway: Option<palisade_gateway::Gateway>,
    kill_switch: Option<KillSwitchRuntime>,
    /// The kill switch's registry check, given to the gateway's first build and its loops.
    coverage: Option<CoverageCheck>,
}

impl Runtime {
    /// Builds every service the settings ask for, starts the periodic jobs and, for HTTP, binds
    /// the listeners (announcing `listening on http://…/mcp` on stdout).
    pub async fn start(settings: Settings, transport: Transport) -> anyhow::Result<Self> {
        Self::start_serving(settings, transport, None, None).await
    }

    /// [`Runtime::start`], reloading the configuration of `source` on `SIGHUP`, on a change of
    /// the file and at `palisade reload` ([`crate::reload`]); the triggers are in place before
    /// the listener is bound.
    pub async fn start_reloadable(
        settings: Settings,
        transport: Transport,
        source: Option<ReloadSource>,
    ) -> anyhow::Result<Self> {
        Self::start_serving(settings, transport, None, source).await
    }

    /// [`Runtime::start`] serving `app` (with the delegation tools when `[delegation]` is
    /// enabled) instead of the application the settings name; not with the gateway's upstreams.
    pub async fn start_with_app(settings: Settings, transport: Transport, app: App) -> anyhow::Result<Self> {
        Self::start_serving(settings, transport, Some(app), None).await
    }

    async fn start_serving(
        settings: Settings,
        transport: Transport,
        custom: Option<App>,
        reload: Option<ReloadSource>,
    ) -> anyhow::Result<Self> {
        let stdio = transport == Transport::Stdio;
        if stdio && settings.metrics_listen.is_some() {
            let reason = "is a second HTTP listener; it cannot be used with --stdio".into();
            return Err(ConfigError { key: keys::METRICS_LISTEN.into(), reason }.into());
        }
        let authenticator = authn::authenticator(&settings, stdio)?;
        let config = server_config(&settings, authn::dev_authorization_server(&settings, &authenticator, stdio)?);
        secrets::prepare_sqlite_dir(&settings)?;
        let secret = secrets::server_secret(&settings)?;
        if settings.gateway.is_some() {
            // Its operator's commands look stdio commands up where this process does.
            gateway::record_search_path(&settings)?;
        }
        let subject_key = secrets::subject_key_bytes(&settings)?;
        let store = palisade_store::open_store(&settings.store).await.context("opening the store")?;
        let (audit_writer, checkpointer) = audit::start(&settings, &store, &secret).await?;
        if settings.delegation.is_some() && settings.gateway.is_some() {
            anyhow::bail!("delegation.enabled is not offered by the gateway yet: it serves the upstreams' tools only");
        }
        let delegation = settings
            .delegation
            .clone()
            .map(|config| Arc::new(DelegationService::new(store.clone(), &secret, config, Arc::new(SystemClock))));
        let Assembled { app, gateway, kill_switch, coverage } =
            assemble(&settings, &store, &secret, delegation.as_ref(), custom).await?;
        // The operator's policies, validated against the registry just assembled: a set that
        // does not validate stops the start (every problem at its file and line).
        let policies = crate::policies::load(&settings.policies, &app)?;
        let (handles, tasks) = services(&settings, &store, &subject_key, &app)?;
        let sessions_store: Arc<dyn palisade_store::SessionStore> = store.clone();
        let ledger: Arc<dyn palisade_store::DelegationStore> = store.clone();
        let once_store: Arc<dyn palisade_store::OnceStore> = store.clone();
        // Authenticates answers relayed between instances (events_redis); derived before the
        // secret moves into the server.
        let relay_key = secret.derive(ANSWER_RELAY_KEY_LABEL);
        let console_key = secret.derive(palisade_gateway::console::KEY_LABEL);
        // The gateway's browser pages (connect flow, review page): their keys derive from the secret.
        let web = match (&gateway, settings.gateway.as_ref().and_then(|g| g.web.as_ref())) {
            (Some(gateway), Some(web)) => {
                Some((web, gateway.web_routes(&secret).context("building the gateway's web pages ([web])")?))
            }
            _ => None,
        };
        let limits =
            crate::rate_limits::build(&settings, None).context("building the rate limits ([[rate_limits]])")?;
        let reload_store = store.clone();
        let mut builder = Server::builder(app, config, authenticator, secret)
            .rate_limits(Arc::new(limits))
            .sessions(sessions_store.clone())
            .once_store(once_store.clone())
            .audit(store)
            .audit_writer(audit_writer)
            .handles(handles.clone())
            .tasks(tasks.clone());
        if let Some(runtime) = &kill_switch {
            builder = builder.kill_switch(runtime.switch.clone(), runtime.server_release.clone());
        }
        if let Some(delegation) = &delegation {
            builder = builder.delegation(delegation.clone());
        }
        if let Some(policies) = policies {
            tracing::info!(policies = policies.len(), digest = policies.digest(), "operator policies in force");
            builder = builder.policies(policies);
        }
        if let Some(gateway) = &gateway {
            // One recorder for the server's series and the gateway's per-upstream ones, and the
            // gateway's readiness (one upstream serving) in `/readyz`.
            builder = builder.metrics(gateway.metrics().clone()).readiness(Arc::new(gateway.clone()));
        }
        let server = Arc::new(builder.build().context("assembling the server")?);
        if let Some(gateway) = &gateway {
            gateway.spawn(server.clone(), server.shutdown_token().clone(), coverage);
        }
        if let Some(source) = reload {
            let reloader = Reloader::new(source, &settings, server.clone(), gateway.clone(), reload_store)
                .context("reading the configuration file for reloads")?;
            Arc::new(reloader)
                .start(&settings, server.shutdown_token().clone())
                .await
                .context("starting reloads (SIGHUP, the file watch, the control socket)")?;
        }
        // The gateway's browser pages on their own TLS listener. Their grants and refusals go to
        // the server's surface sink (the request path's chain and digest key), whose refusal
        // counts the server's flusher writes every interval and `flush_audit` a last time.
        if let Some((web, mut routes)) = web {
            // The operator console (`[web] operators_file`), its charts sampled from this server's
            // own metrics until it shuts down.
            if let Some(gateway) = &gateway {
                let view = kill_switch.as_ref().map(|runtime| palisade_gateway::console::KillSwitchView {
                    switch: runtime.switch.clone(),
                    authority: runtime.shared_db.clone(),
                    server_release: runtime.server_release.clone(),
                });
                let metrics = server.clone();
                let console = palisade_gateway::console::serve(
                    gateway,
                    console_key,
                    view,
                    Arc::new(move || metrics.metrics().render()),
                    server.shutdown_token().clone(),
                )
                .context("building the operator console ([web] operators_file)")?;
                if let Some(console) = console {
                    routes = routes.merge(console);
                }
            }
            palisade_server::server::spawn_refusal_flusher(&server);
            let local = palisade_gateway::web::start(
                web,
                routes,
                server.surface_audit().clone(),
                server.shutdown_token().clone(),
            )
            .await
            .context("starting the gateway's web pages ([web])")?;
            eprintln!("web pages on https://{local}/ (public URL {})", web.public_url);
        }
        if let Some(url) = &settings.events_redis {
            events_bridge::start(server.clone(), relay_key, url, &settings.public_url, server.shutdown_token().clone())
                .await
                .context("starting the event fan-out (events_redis)")?;
        }
        let jobs = spawn_jobs(&server, &settings, &handles, &tasks, sessions_store, once_store, ledger);
        let mut runtime = Self {
            server,
            gateway,
            checkpointer,
            jobs,
            http: None,
            local_addr: None,
            transport,
            _kill_switch: kill_switch,
        };
        if transport == Transport::Http {
            runtime.bind(&settings).await?;
        }
        Ok(runtime)
    }

    /// Binds `listen` and, when configured, the private `/metrics` listener.
    async fn bind(&mut self, settings: &Settings) -> anyhow::Result<()> {
        let listener = palisade_server::http::bind(&self.server, settings.listen).await?;
        let local = listener.local_addr()?;
        // `metrics_listen`: `/metrics` (with the health endpoints) on a private listener; unset,
        // `/metrics` is served nowhere.
        let options = ServeOptions::bind_metrics(settings.metrics_listen).await.with_context(|| {
            format!(
                "binding {} ({})",
                keys::METRICS_LISTEN,
                settings.metrics_listen.map_or_else(String::new, |a| a.to_string())
            )
        })?;
        if let MetricsExposure::Listener(metrics) = &options.metrics {
            eprintln!("metrics on http://{}/metrics (no authentication: keep it private)", metrics.local_addr()?);
        }
        #[allow(clippy::print_stdout)]
        {
            println!("listening on http://{local}/mcp");
        }
        self.local_addr = Some(local);
        self.http = Some((listener, options));
        Ok(())
    }

    /// The server.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// The HTTP listener's address (`None` on stdio).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Serves the transport: stdio until its input ends; HTTP until `shutdown` resolves, then it
    /// stops accepting and drains the requests in flight.
    pub async fn serve(&mut self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        match self.transport {
            Transport::Stdio => {
                palisade_server::stdio::serve(self.server.clone(), tokio::io::stdin(), tokio::io::stdout())
                    .await
                    .context("stdio transport")?;
            }
            Transport::Http => {
                let (listener, options) = self.http.take().context("the HTTP transport was served already")?;
                palisade_server::http::serve_with(self.server.clone(), listener, options, shutdown).await?;
            }
        }
        Ok(())
    }

    /// Stops the periodic jobs (over HTTP), writes the definition churn counted but not yet on
    /// the record, flushes the audit and stops the checkpoint signer; the store closes as the
    /// last handle on it drops.
    pub async fn shutdown(self) {
        if self.transport == Transport::Http {
            for job in &self.jobs {
                job.abort();
            }
        }
        if let Some(gateway) = &self.gateway {
            gateway.flush_churn().await;
        }
        self.server.flush_audit().await;
        self.checkpointer.shutdown().await;
    }
}

/// The handle service (the application's handle types under the configured policies) and the
/// task service, both keyed by the handle subject key.
fn services(
    settings: &Settings,
    store: &Arc<dyn palisade_store::Store>,
    subject_key: &[u8; 32],
    app: &App,
) -> anyhow::Result<(Arc<HandleService>, Arc<TaskService>)> {
    let handles = HandleService::new(
        store.clone(),
        SubjectKey::from_bytes(subject_key).map_err(anyhow::Error::msg)?,
        app.handle_types(),
        &settings.handles.policies,
        Arc::new(SystemClock),
    )
    .map_err(|reason| ConfigError { key: "handles.policies".into(), reason })?;
    let handles = Arc::new(handles);
    let tasks = Arc::new(TaskService::new(
        store.clone(),
        SubjectKey::from_bytes(subject_key).map_err(anyhow::Error::msg)?,
        TaskConfig::default(),
        Arc::new(SystemClock),
    ));
    Ok((handles, tasks))
}

/// The server's configuration from the settings.
fn server_config(
    settings: &Settings,
    authorization_server: Option<Arc<palisade_auth::authorization_server::DevAuthorizationServer>>,
) -> ServerConfig {
    let limits = &settings.limits;
    ServerConfig {
        max_body_bytes: limits.max_body_bytes,
        request_timeout: Duration::from_secs(limits.request_timeout_secs),
        header_read_timeout: Duration::from_secs(limits.header_read_timeout_secs),
        body_read_timeout: Duration::from_secs(limits.body_read_timeout_secs),
        idle_timeout: Duration::from_secs(limits.idle_timeout_secs),
        max_connections: limits.max_connections,
        max_streams_per_principal: limits.max_streams_per_principal,
        max_listen_filter_entries: limits.max_listen_filter_entries,
        transport_refusal_interval: Duration::from_secs(settings.audit.transport_refusal_interval_secs),
        page_size: limits.page_size,
        allowed_hosts: settings.allowed_hosts.clone(),
        allowed_origins: settings.allowed_origins.clone(),
        legacy: settings.legacy.clone(),
        continue_traces: settings.telemetry.as_ref().is_none_or(|telemetry| telemetry.continue_incoming_traces),
        authorization_server,
        ..ServerConfig::default()
    }
}

/// The application to serve: the gateway's registry, or a built-in application (with the
/// delegation tools when enabled); and the kill switch covering what it exposes.
async fn assemble(
    settings: &Settings,
    store: &Arc<dyn palisade_store::Store>,
    secret: &ServerSecret,
    delegation: Option<&Arc<DelegationService>>,
    custom: Option<App>,
) -> anyhow::Result<Assembled> {
    if let Some(app) = custom {
        if settings.gateway.is_some() {
            anyhow::bail!("an application of its own cannot be served with the gateway's upstreams");
        }
        let app = with_delegation_tools(app, delegation)?;
        let kill_switch = killswitch::start(settings, &palisade_server::killswitch::exposed_operations(&app)).await?;
        return Ok(Assembled { app, gateway: None, kill_switch, coverage: None });
    }
    let app_name = authn::app_name(settings.app);
    // The gateway lists its upstreams (and pins what they list) before the kill switch starts:
    // the registry the switch must cover is what the gateway serves.
    let gateway = match &settings.gateway {
        Some(gateway_settings) => Some(gateway::start(gateway_settings, store, secret, None).await?),
        None => None,
    };
    let initial = match (&gateway, app_name) {
        (Some((_, app)), _) => palisade_server::killswitch::exposed_operations(app),
        (None, Some(app_name)) => {
            palisade_server::killswitch::exposed_operations(&with_delegation_tools(app_name.build(), delegation)?)
        }
        (None, None) => Vec::new(),
    };
    let kill_switch = killswitch::start(settings, &initial).await?;
    // What the gateway serves from now on must be covered by the signed registry the switch runs.
    let coverage: Option<CoverageCheck> = kill_switch.as_ref().map(|runtime| {
        let switch = runtime.switch.clone();
        Arc::new(move |key: &str| switch.policy().lookup(key).is_some()) as CoverageCheck
    });
    let orders = match kill_switch.as_ref().and_then(|runtime| runtime.shared_db.as_ref()) {
        Some(db) if app_name == Some(AppName::Demo) => {
            Some(palisade_apps::demo::Orders::open(db.pool().clone()).await.context("opening the order table")?)
        }
        _ => None,
    };
    let (app, gateway) = match (gateway, app_name) {
        (Some((gateway, _)), _) => {
            let app = gateway.build_app(coverage.as_ref()).await.context("building the gateway's registry")?;
            (app, Some(gateway))
        }
        // The demo's baskets live in the configured store, so every instance sharing it sees them.
        (None, Some(AppName::Demo)) => {
            let baskets = palisade_apps::demo::BasketStore::open(&settings.store)
                .await
                .context("opening the demo's basket table in the store")?;
            (palisade_apps::demo::app_with_store(baskets, orders), None)
        }
        (None, Some(app_name)) => (app_name.build_with_orders(orders), None),
        (None, None) => anyhow::bail!("no application to serve"),
    };
    let app = if gateway.is_some() { app } else { with_delegation_tools(app, delegation)? };
    Ok(Assembled { app, gateway, kill_switch, coverage })
}

/// `app` with the delegation tools (`palisade_delegate`, `…_revoke`, `…_approve`) when
/// `[delegation]` is enabled.
fn with_delegation_tools(app: App, delegation: Option<&Arc<DelegationService>>) -> anyhow::Result<App> {
    let Some(service) = delegation else { return Ok(app) };
    let mut builder = app.into_builder();
    for tool in service.tools() {
        builder = builder.tool(tool);
    }
    builder.build().context("adding the delegation tools to the application")
}

/// Starts the periodic jobs: the session purge, task maintenance (tasks left `working` by an
/// instance that died are resumed or failed; expired ones purged) and handle retention. Returned
/// in the order they stop: retention, maintenance, session purge.
fn spawn_jobs(
    server: &Arc<Server>,
    settings: &Settings,
    handles: &Arc<HandleService>,
    tasks: &Arc<TaskService>,
    sessions: Arc<dyn palisade_store::SessionStore>,
    once: Arc<dyn palisade_store::OnceStore>,
    ledger: Arc<dyn palisade_store::DelegationStore>,
) -> [JoinHandle<()>; 3] {
    let session_purge = jobs::spawn_session_purge(sessions, once, ledger, server);
    let maintenance = tasks.spawn_maintenance(
        server.app(),
        server.events().clone(),
        Duration::from_secs(10),
        server.shutdown_token().clone(),
    );
    let retention =
        handles.spawn_retention(Duration::from_secs(300), settings.handles.retention, server.shutdown_token().clone());
    [retention, maintenance, session_purge]
}
