//! `palisade config check|options`: a configuration file validated and summarised, and the
//! option table.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Validate FILE (with the environment applied) and print the effective settings.
    Check { file: PathBuf },
    /// List every option: file key, environment variable, flag, default (Markdown).
    Options,
}

/// Runs a `palisade config` command.
pub fn run(command: ConfigCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Check { file } => config_check(&file),
        ConfigCommand::Options => config_options(),
    }
}

fn config_options() -> anyhow::Result<ExitCode> {
    #[allow(clippy::print_stdout)]
    {
        print!("{}", palisade_host::settings::options_markdown());
    }
    Ok(ExitCode::SUCCESS)
}

fn config_check(file: &Path) -> anyhow::Result<ExitCode> {
    let settings = super::settings(Some(file))?;
    #[allow(clippy::print_stdout)]
    {
        print!("{}", settings.summary());
        println!("ok");
    }
    Ok(ExitCode::SUCCESS)
}
