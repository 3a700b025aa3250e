//! `palisade dev token`: a token from the development issuer, for the server the same file,
//! environment and flags configure.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use palisade_auth::dev_issuer::DevIssuer;
use palisade_host::authn;
use palisade_host::settings::ConfigFlags;

#[derive(Subcommand)]
pub enum DevCommand {
    /// Print a token from the development issuer that the demo accepts.
    Token(TokenArgs),
}

#[derive(clap::Args)]
pub struct TokenArgs {
    /// Subject (`sub`).
    #[arg(long)]
    pub subject: String,
    /// Tenant claim.
    #[arg(long)]
    pub tenant: String,
    /// OAuth client id.
    #[arg(long)]
    pub client: String,
    /// Space-separated scopes.
    #[arg(long, default_value = "")]
    pub scope: String,
    /// A group or role, put in the token's `groups` claim (repeatable); operator policies see it
    /// when `policies.group_claims` names `groups`.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    /// Configuration file, as given to `serve`: the token is minted for the server that file,
    /// the environment and the flags below configure (its `public_url`, or `http://<listen>/mcp`,
    /// is the audience; the issuer key is in its data directory).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// `serve`'s configuration flags, resolved exactly as `serve` resolves them.
    #[command(flatten)]
    pub flags: ConfigFlags,
}

/// Runs a `palisade dev` command.
pub fn run(command: DevCommand) -> anyhow::Result<ExitCode> {
    match command {
        DevCommand::Token(args) => dev_token(args),
    }
}

fn dev_token(args: TokenArgs) -> anyhow::Result<ExitCode> {
    // The settings `serve` resolves from the same file, environment and flags, so that the
    // token's issuer and audience are that server's.
    let settings = super::resolve(args.config.as_deref(), &args.flags, false, None)?;
    if !settings.auth.dev_issuer {
        anyhow::bail!("the development issuer is disabled in this configuration (auth.dev_issuer = false)");
    }
    // Only the key the server created: a new key here would sign tokens no server accepts.
    let issuer = DevIssuer::load_existing(&settings.data_dir, &authn::dev_issuer_id(&settings))
        .context("loading the dev issuer key")?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no development issuer key in the data directory {}: `palisade serve` creates it on its first \
                 start; start the server first, and pass the --config (or --data-dir) the server runs with",
                std::path::absolute(&settings.data_dir).unwrap_or_else(|_| settings.data_dir.clone()).display()
            )
        })?;
    let scopes: Vec<&str> = args.scope.split_whitespace().collect();
    let groups: Vec<&str> = args.groups.iter().map(String::as_str).collect();
    let token = issuer.mint_with_groups(
        &args.subject,
        &args.tenant,
        &args.client,
        &scopes,
        &groups,
        &settings.public_url,
        args.ttl,
    )?;
    #[allow(clippy::print_stdout)]
    {
        println!("{token}");
    }
    Ok(ExitCode::SUCCESS)
}
