//! `palisade reload`: asks the running instance of a configuration file to reload it now, through
//! the control socket in its data directory (`palisade_host::reload::control`), and prints what
//! changed — or, exiting 1, why nothing did.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use palisade_host::reload::control;

#[derive(clap::Args)]
pub struct ReloadArgs {
    /// The configuration file the instance runs (it names the data directory whose control
    /// socket the instance answers on).
    #[arg(long)]
    pub config: PathBuf,
    /// The instance's data directory, when it was not given by the file or `PALISADE_DATA_DIR`
    /// (`--data-dir` of `palisade gateway`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// Exit 0 when the instance applied the file, 1 when it refused it (or none answers).
#[allow(clippy::print_stdout)]
pub async fn run(args: ReloadArgs) -> anyhow::Result<ExitCode> {
    let data_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => data_dir_of(&args.config),
    };
    let outcome = control::request(&control::socket_path(&data_dir)).await?;
    if outcome.applied {
        println!("{}", outcome.message);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("error: {}", outcome.message);
        Ok(ExitCode::FAILURE)
    }
}

/// The data directory the file resolves to. The edit being reloaded may be invalid (the instance
/// says why): then `PALISADE_DATA_DIR`, or the file's `data_dir` as written, or the default.
fn data_dir_of(config: &Path) -> PathBuf {
    if let Ok(settings) = super::settings(Some(config)) {
        return settings.data_dir;
    }
    if let Some(dir) = std::env::var_os("PALISADE_DATA_DIR") {
        return PathBuf::from(dir);
    }
    control::written_data_dir(config).unwrap_or_else(|| PathBuf::from("palisade-data"))
}
