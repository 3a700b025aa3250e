//! The kill switch of a running server: started from `[killswitch]` (an external authority, or
//! the development authority in the data directory), and the signed policy a configuration runs.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_killswitch::authority::AuthorityDb;
use palisade_killswitch::dev::{DEV_AUTHORITY_ID, DevAuthorityFiles, RunningDevAuthority};
use palisade_killswitch::{
    AuthorityClient, AuthorityClientConfig, ExposedOperation, GenerationStore, KillSwitch, KillSwitchConfig, Policy,
    PolicyFiles, RedisGenerationStore, RedisOptions, SqliteGenerationStore, TargetKey,
};

use crate::settings::{KillSwitchMode, Settings};

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

/// A path as UTF-8 text (the authority database opens by name).
fn path_text(path: &Path) -> anyhow::Result<&str> {
    path.to_str().ok_or_else(|| anyhow::anyhow!("{} is not a UTF-8 path", path.display()))
}

/// The signed policy a server with these settings runs (`None`: no kill switch), read without
/// starting anything.
pub fn active_policy(settings: &Settings) -> anyhow::Result<Option<Policy>> {
    let files = match &settings.killswitch.mode {
        KillSwitchMode::Dev { dir } => DevAuthorityFiles::new(dir.clone()).policy_files(),
        KillSwitchMode::Authority(external) => palisade_killswitch::PolicyFiles {
            root_public_key: external.root_public_key.clone(),
            envelope: external.policy.clone(),
            key_trust_root: external.key_trust_root.clone(),
        },
        KillSwitchMode::Off => return Ok(None),
    };
    Ok(Some(Policy::load(&files, now_ms()).context("reading the active signed policy")?))
}

/// The kill switch of a running `serve`, and what keeps it alive.
pub struct KillSwitchRuntime {
    /// The kill switch.
    pub switch: Arc<KillSwitch>,
    /// The `server_release` target value.
    pub server_release: String,
    /// The authority database, when this process shares it (development authority, or
    /// `killswitch.authority_db`).
    pub shared_db: Option<AuthorityDb>,
    _dev_authority: Option<RunningDevAuthority>,
}

/// Starts the kill switch the settings ask for; `None` when it is off. Refuses a policy whose
/// registry misses any of `exposed`.
pub async fn start(settings: &Settings, exposed: &[ExposedOperation]) -> anyhow::Result<Option<KillSwitchRuntime>> {
    let keys: Vec<String> = exposed.iter().map(|operation| operation.key.clone()).collect();
    let server_release = settings.killswitch.server_release.clone();
    match &settings.killswitch.mode {
        KillSwitchMode::Off => Ok(None),
        KillSwitchMode::Dev { dir } => {
            let files = DevAuthorityFiles::new(dir.clone());
            files.prepare(exposed, now_ms()).context("preparing the development authority")?;
            let running = files.start_authority().await.context("starting the development authority")?;
            eprintln!(
                "WARNING: the kill switch uses the DEVELOPMENT AUTHORITY ({DEV_AUTHORITY_ID}) on {}: its policy root, \
                 signing and CA keys are generated into {} next to the server's data, so anyone who can read that \
                 directory can sign policies and answers. For demos only; use [killswitch] mode = \"authority\" in \
                 production.",
                running.url,
                dir.display()
            );
            let switch = files.kill_switch(&running.url, keys).await.context("starting the kill switch")?;
            switch.set_stream_recheck(settings.killswitch.stream_recheck);
            switch.set_replay_window(settings.killswitch.replay_window);
            Ok(Some(KillSwitchRuntime {
                switch: Arc::new(switch),
                server_release,
                shared_db: Some(running.db.clone()),
                _dev_authority: Some(running),
            }))
        }
        KillSwitchMode::Authority(external) => {
            let policy = Policy::load(
                &PolicyFiles {
                    root_public_key: external.root_public_key.clone(),
                    envelope: external.policy.clone(),
                    key_trust_root: external.key_trust_root.clone(),
                },
                now_ms(),
            )
            .context("loading the kill-switch policy")?;
            let mut client_config = AuthorityClientConfig::from_files(
                &external.authority_url,
                &external.authority_ca,
                &external.client_cert,
                &external.client_key,
            )
            .context("reading the authority client files")?;
            if settings.killswitch.single_envelope {
                client_config.envelope = palisade_killswitch::HeadEnvelope::Single;
            }
            let client = AuthorityClient::new(client_config).context("building the authority client")?;
            let store: Arc<dyn GenerationStore> = if external.generation_store.starts_with("sqlite:") {
                Arc::new(
                    SqliteGenerationStore::open(&external.generation_store)
                        .await
                        .context("opening the generation store")?,
                )
            } else {
                Arc::new(
                    RedisGenerationStore::connect(&external.generation_store, RedisOptions::default())
                        .await
                        .context("connecting to the generation store")?,
                )
            };
            let switch = KillSwitch::start(KillSwitchConfig {
                policy,
                exposed_operations: keys,
                authority: client,
                store,
                target_key: TargetKey::read(&external.target_key_file).context("reading the target key")?,
                clock: Arc::new(SystemClock),
            })
            .await
            .context("starting the kill switch")?;
            switch.set_stream_recheck(settings.killswitch.stream_recheck);
            switch.set_replay_window(settings.killswitch.replay_window);
            let shared_db = match &external.authority_db {
                Some(path) => {
                    Some(AuthorityDb::open(path_text(path)?).await.context("opening the authority database")?)
                }
                None => None,
            };
            Ok(Some(KillSwitchRuntime { switch: Arc::new(switch), server_release, shared_db, _dev_authority: None }))
        }
    }
}
