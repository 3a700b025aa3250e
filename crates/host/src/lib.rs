//! The running system behind the `palisade` command: the settings (file, environment, flags,
//! validated once), logging and trace export, and the composition root, [`Runtime`], which
//! builds every service and periodic job from the settings and shuts them down in order.
//!
//! Layers, low to high: `settings`, `redis_publish`, `signal`, `jobs` → `telemetry`, `secrets`,
//! `answer_relay`, `authn`, `killswitch`, `gateway`, `audit`, `policies`, `rate_limits` → `events_bridge`,
//! `reload` → `runtime`.
//!
//! ```no_run
//! # async fn run(settings: palisade_host::settings::Settings) -> anyhow::Result<()> {
//! let mut runtime = palisade_host::Runtime::start(settings, palisade_host::Transport::Http).await?;
//! runtime.serve(palisade_host::signal::shutdown_signal()).await?;
//! runtime.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod answer_relay;
pub mod audit;
pub mod authn;
pub mod events_bridge;
pub mod gateway;
pub mod jobs;
pub mod killswitch;
pub mod policies;
pub mod rate_limits;
pub mod redis_publish;
pub mod reload;
pub mod runtime;
pub mod secrets;
pub mod settings;
pub mod signal;
pub mod telemetry;

pub use runtime::{Runtime, Transport};
pub use settings::{ConfigError, Settings};
