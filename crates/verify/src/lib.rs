//! `palisade verify URL`: an adversarial verifier an operator points at any MCP server. A client
//! only: it shares the wire types (`palisade-wire`), never the server's internals. The command
//! line ([`VerifyArgs`]), the safety gates (an explicit authorization, loopback or a named
//! `--target-host`), and the run ([`verify`]): every module's checks, bounded, then a report.
//!
//! Layers, low to high: `callable`, `escape`, `exchange`, `grant`, `identity`, `program`,
//! `refusals` → `target`, `check` → `modules` → `rules` → `report`, `progress`. (`rules` is the
//! one registry of check rules and root causes every report format reads.)

pub mod callable;
pub mod check;
pub mod escape;
pub mod exchange;
pub mod grant;
pub mod identity;
pub mod modules;
pub mod program;
pub mod progress;
pub mod refusals;
pub mod report;
pub mod rules;
pub mod target;

use std::io::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;

use crate::check::{Check, Outcome};
use crate::identity::{Identity, IdentityError, Redactor};
use crate::modules::Context;
use crate::report::{Baseline, Format, Report};
use crate::target::{Target, TargetConfig};

/// `palisade verify`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// The MCP endpoint to verify, e.g. `http://127.0.0.1:8080/mcp`.
    pub url: String,
    /// An identity file (TOML: `name`, and `token`, `token_file`, `token_command` or a
    /// `[client_credentials]` table (`token_url`, `client_id`, `client_secret` or
    /// `client_secret_file`, `scope`, `resource`); optional
    /// `tenant`, `client`, `subject`, `expired_token`, `other_resource_token`). At least two.
    #[arg(long = "identity", value_name = "FILE")]
    pub identities: Vec<PathBuf>,
    /// Confirms you are authorized to test this target. Nothing is sent without it.
    #[arg(long)]
    pub i_am_authorized: bool,
    /// Allows a target host that is not loopback; it must equal the URL's host.
    #[arg(long, value_name = "HOST")]
    pub target_host: Option<String>,
    /// Allows calls with side effects (creating handles or tasks, cancelling). Default: read-only.
    #[arg(long)]
    pub allow_mutations: bool,
    /// The format of `--output`.
    #[arg(long, value_enum, requires = "output")]
    pub format: Option<Format>,
    /// Where to write the report (JSON unless `--format` says otherwise).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Accepted findings (TOML: `[[accepted]] id`, `verdict`, `reason`, `judgement`, `evidence`,
    /// `breaks`): a baselined FAIL exits 0.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Requests in flight at most (1–16).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub concurrency: u16,
    /// Least milliseconds between the starts of two requests.
    #[arg(long, default_value_t = 10)]
    pub min_interval_ms: u64,
    /// What this server's refusals look like (TOML: `[[refusal]]` tables of `status`, `code`,
    /// `tool_error`): a negative case refused in a shape not listed is a WARNING, not a PASS.
    #[arg(long, value_name = "FILE")]
    pub refusals: Option<PathBuf>,
    /// Runs only the named modules (repeatable; default every module): `transport`, `auth`,
    /// `access`, `sessions`, `handles`, `tasks`, `listen`, `state`, `definitions`, `killswitch`, `pinning`.
    #[arg(long = "module", value_name = "NAME")]
    pub modules: Vec<String>,
    /// Per-request timeout in seconds (1–120).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub timeout_secs: u64,
    /// Makes the operator's fixture upstream change a tool definition (pinning module): run
    /// without a shell (its program is looked up on PATH at the start unless it is a path; not
    /// found refuses the run), split on white space, `{tool}` replaced by the tool's name as the target
    /// lists it, `{state}` by `changed` (serve a changed definition) or `original` (serve the
    /// original again; always run at the end). Without it the pinning checks are not testable.
    #[arg(long, value_name = "CMD")]
    pub change_upstream_command: Option<String>,
    /// How long the target may take to notice a changed definition, in seconds (1–120).
    #[arg(long, default_value_t = modules::pinning::DEFAULT_WAIT_SECS, value_parser = clap::value_parser!(u64).range(1..=120))]
    pub pin_wait_secs: u64,
    /// Sets a kill-switch target to DISABLE (killswitch module): run without a shell (its
    /// program is looked up on PATH at the start unless it is a path; not found refuses the
    /// run), split on white space, `{target}` replaced by the target as `kind:name` (`tool:product_get` or
    /// `resource:<uri>`: only kill-switch target kinds; a prompt is none); it must exit 0 within 10 s. Exit 2 means it cannot flip
    /// targets of that kind (those checks are not testable). Needs `--enable-command`.
    #[arg(long, value_name = "CMD", requires = "enable_command")]
    pub disable_command: Option<String>,
    /// Sets a kill-switch target back to ENABLE, like `--disable-command`; run after every
    /// disable, whatever the verdict. Without both the killswitch checks are not testable.
    #[arg(long, value_name = "CMD", requires = "disable_command")]
    pub enable_command: Option<String>,
    /// Writes the definitions the `definitions` module read (tools, prompts, resources,
    /// templates, instructions) to FILE, for a later `--compare-definitions`.
    #[arg(long, value_name = "FILE")]
    pub save_definitions: Option<PathBuf>,
    /// Compares the definitions with those an earlier run saved: `definitions.meaning-changed`
    /// reports each whose meaning changed (without it, that check is not testable).
    #[arg(long, value_name = "FILE")]
    pub compare_definitions: Option<PathBuf>,
}

#[derive(clap::Parser)]
#[command(name = "palisade verify")]
struct Standalone {
    #[command(flatten)]
    args: VerifyArgs,
}

impl VerifyArgs {
    /// Parses `palisade verify`'s arguments (without the program and subcommand names).
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser as _;
        let argv = std::iter::once(std::ffi::OsString::from("verify")).chain(args.into_iter().map(Into::into));
        Standalone::try_parse_from(argv).map(|standalone| standalone.args)
    }
}

/// Why a run was refused before sending anything (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// `--i-am-authorized` was not given.
    #[error("refusing to run: confirm you are authorized to test this target with --i-am-authorized")]
    NotAuthorized,
    /// The URL is not an http(s) URL with a host.
    #[error("refusing to run: {0} is not an http:// or https:// URL with a host")]
    BadUrl(String),
    /// A non-loopback host without a matching `--target-host`.
    #[error("refusing to run: {0} is not a loopback host; name it with --target-host {0} to test it")]
    HostNotAllowed(String),
    /// An identity could not be used.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// `--module` named no module of the verifier.
    #[error("unknown module {0:?}; the modules are: {1}")]
    UnknownModule(String, String),
    /// The refusal map could not be used.
    #[error("{0}")]
    Refusals(String),
    /// The baseline could not be read.
    #[error("{0}")]
    Baseline(String),
    /// The compared definitions could not be read, or the read ones not saved.
    #[error("{0}")]
    Definitions(String),
    /// The HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(String),
    /// An operator's command names a program that is not found.
    #[error("refusing to run: {0}")]
    Command(String),
}

/// The operator's commands, each program resolved ([`program::resolve_on_path`]); an empty
/// line is no command.
pub struct Commands {
    /// `--change-upstream-command`.
    pub change_upstream: Option<String>,
    /// `--disable-command`.
    pub disable: Option<String>,
    /// `--enable-command`.
    pub enable: Option<String>,
    /// One line per command saying which program it runs and how it was found.
    pub notes: Vec<String>,
}

/// Resolves every operator command's program before anything is sent.
pub fn resolve_commands(args: &VerifyArgs) -> Result<Commands, Refusal> {
    let mut notes = Vec::new();
    let mut resolve = |flag: &str, line: &Option<String>| {
        let resolved = line
            .as_deref()
            .filter(|line| !line.trim().is_empty())
            .map(|line| program::resolve_on_path(flag, line))
            .transpose()
            .map_err(Refusal::Command)?;
        Ok::<_, Refusal>(resolved.map(|resolved| {
            notes.push(resolved.note);
            resolved.line
        }))
    };
    let change_upstream = resolve("--change-upstream-command", &args.change_upstream_command)?;
    let disable = resolve("--disable-command", &args.disable_command)?;
    let enable = resolve("--enable-command", &args.enable_command)?;
    Ok(Commands { change_upstream, disable, enable, notes })
}

/// The safety gates: authorization confirmed, and the host loopback or named. Sends nothing.
pub fn check_gates(args: &VerifyArgs) -> Result<url::Url, Refusal> {
    if !args.i_am_authorized {
        return Err(Refusal::NotAuthorized);
    }
    let url = url::Url::parse(&args.url).map_err(|_| Refusal::BadUrl(args.url.clone()))?;
    let host = match (url.scheme(), url.host_str()) {
        ("http" | "https", Some(host)) if !host.is_empty() => host.to_owned(),
        _ => return Err(Refusal::BadUrl(args.url.clone())),
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let named = args
        .target_host
        .as_deref()
        .is_some_and(|named| named.eq_ignore_ascii_case(&host) || named.eq_ignore_ascii_case(bare));
    if !loopback && !named {
        return Err(Refusal::HostNotAllowed(host));
    }
    Ok(url)
}

/// Runs every module against the target (after the gates and the identities check out) and
/// returns the report; `progress` sees each check as it finishes.
pub async fn verify(args: &VerifyArgs, progress: &mut (dyn FnMut(&Check, &Outcome) + Send)) -> Result<Report, Refusal> {
    let url = check_gates(args)?;
    let commands = resolve_commands(args)?;
    let mut identities = Vec::with_capacity(args.identities.len());
    for path in &args.identities {
        identities.push(Identity::load(path, &url, Duration::from_secs(args.timeout_secs)).await?);
    }
    identity::check_identities(&identities)?;
    let baseline = match &args.baseline {
        Some(path) => Baseline::load(path).map_err(Refusal::Baseline)?,
        None => Baseline::default(),
    };
    let redactor = Arc::new(Redactor::new(&identities));
    let config = TargetConfig {
        url: url.clone(),
        timeout: Duration::from_secs(args.timeout_secs),
        concurrency: usize::from(args.concurrency),
        min_interval: Duration::from_millis(args.min_interval_ms),
        refusals: args.refusals.as_deref().map(refusals::RefusalMap::load).transpose().map_err(Refusal::Refusals)?,
    };
    let target = Target::new(config, redactor.clone()).map_err(|error| Refusal::Client(error.to_string()))?;
    let pinning = modules::pinning::Options::new(commands.change_upstream.as_deref(), args.pin_wait_secs);
    let killswitch = modules::killswitch::Switch::new(commands.disable, commands.enable);
    let programs = commands.notes;
    let compared = match &args.compare_definitions {
        Some(path) => modules::definitions::Compared::load(path).map_err(Refusal::Definitions)?,
        None => modules::definitions::Compared::default(),
    };
    let ctx = Context::new(target, identities, args.allow_mutations, pinning, killswitch, compared);
    let modules = selected_modules(&args.modules)?;
    // A target that does not speak 2026-07-28 gets one line saying so; a check needing it whose
    // control failed is then NOT TESTABLE for that reason, not INCONCLUSIVE. Asked once, at the
    // first such check (a run whose checks send nothing sends nothing).
    let unspoken: tokio::sync::OnceCell<Option<String>> = tokio::sync::OnceCell::new();
    // Report order is module order; the shared modules run together, then each exclusive one
    // alone (its flips must not reach another module's checks).
    let mut numbered = Vec::new();
    for module in &modules {
        for case in &module.cases {
            numbered.push((numbered.len(), module.exclusive.then_some(module.name), *case));
        }
    }
    let mut batches: Vec<Vec<(usize, modules::Case)>> = Vec::new();
    batches.push(numbered.iter().filter(|(_, alone, _)| alone.is_none()).map(|(i, _, case)| (*i, *case)).collect());
    for module in modules.iter().filter(|module| module.exclusive) {
        let alone = Some(module.name);
        batches.push(numbered.iter().filter(|(_, a, _)| *a == alone).map(|(i, _, case)| (*i, *case)).collect());
    }
    let mut finished: Vec<(usize, Check, Outcome)> = Vec::with_capacity(numbered.len());
    for batch in batches {
        let mut running = futures::stream::iter(batch)
            .map(|(i, case)| {
                let ctx = &ctx;
                async move { (i, case.check, (case.run)(ctx, case.check).await) }
            })
            .buffer_unordered(usize::from(args.concurrency));
        while let Some((i, check, mut outcome)) = running.next().await {
            if outcome.verdict == check::Verdict::Inconclusive
                && modules::needs_current_protocol(&check)
                && unspoken.get_or_init(|| modules::unspoken_protocol(&ctx)).await.is_some()
            {
                // One line says why (the report's protocol line); each check says only what it
                // needs, its refused control stays in its transcript.
                outcome.verdict = check::Verdict::NotTestable;
                outcome.detail =
                    format!("needs {}, not spoken by the target (see the protocol line)", target::PROTOCOL_VERSION);
            }
            outcome.detail = redactor.redact(&outcome.detail);
            progress(&check, &outcome);
            finished.push((i, check, outcome));
        }
    }
    finished.sort_by_key(|(i, _, _)| *i);
    // A target that does not speak the 2025-era session wire: one line says so, and each
    // sessions check only what it needs (its refused `initialize` stays in its transcript).
    let session_wire = finished
        .iter()
        .find(|(_, check, outcome)| {
            check.id.starts_with("sessions.")
                && outcome.verdict == check::Verdict::NotTestable
                && outcome.detail.starts_with(modules::sessions::UNSPOKEN)
        })
        .map(|(_, _, outcome)| outcome.detail.clone());
    if session_wire.is_some() {
        for (_, check, outcome) in &mut finished {
            if check.id.starts_with("sessions.") && outcome.detail.starts_with(modules::sessions::UNSPOKEN) {
                outcome.detail =
                    "needs the 2025-era session wire, not spoken by the target (see the protocol line)".into();
            }
        }
    }
    // A target that serves a request with no token at all: the findings that follow from it are
    // grouped under that one root cause (asked only when there is such a finding).
    let grouped = finished.iter().any(|(_, check, outcome)| {
        outcome.verdict == check::Verdict::Fail && report::follows_from_no_authentication(check.id)
    });
    let unauthenticated = if grouped { modules::unauthenticated_served(&ctx).await } else { None };
    if let Some(path) = &args.save_definitions {
        save_definitions(&ctx, path)?;
    }
    let unspoken = unspoken.into_inner().flatten();
    let results = finished.into_iter().map(|(_, check, outcome)| (check, outcome)).collect();
    Ok(Report::new(url.as_str(), results, &baseline, (*redactor).clone())
        .with_protocol(unspoken)
        .with_session_wire(session_wire)
        .with_programs(programs)
        .with_no_authentication(unauthenticated)
        .with_shared_causes()
        .with_identities(&ctx.identities))
}

/// Writes what the `definitions` module read to `path` (`--save-definitions`); a run that read
/// none (the module was not selected, or the target listed nothing) writes nothing and says so.
fn save_definitions(ctx: &Context, path: &std::path::Path) -> Result<(), Refusal> {
    let Some(listed) = ctx.listed_definitions() else {
        return Err(Refusal::Definitions(format!(
            "--save-definitions {}: no definitions were read in this run (run the definitions module)",
            path.display()
        )));
    };
    let text = serde_json::to_string_pretty(listed).map_err(|error| Refusal::Definitions(error.to_string()))?;
    std::fs::write(path, text + "\n")
        .map_err(|error| Refusal::Definitions(format!("--save-definitions {}: {error}", path.display())))
}

/// The modules `names` (every module when empty), in report order; an unknown name is refused
/// before anything is sent.
pub fn selected_modules(names: &[String]) -> Result<Vec<modules::Module>, Refusal> {
    let all = modules::all();
    if let Some(unknown) = names.iter().find(|name| !all.iter().any(|module| module.name == name.as_str())) {
        let known: Vec<&str> = all.iter().map(|module| module.name).collect();
        return Err(Refusal::UnknownModule(unknown.clone(), known.join(", ")));
    }
    Ok(all.into_iter().filter(|module| names.is_empty() || names.iter().any(|name| name == module.name)).collect())
}

/// The cases of [`selected_modules`], in report order.
pub fn selected_cases(names: &[String]) -> Result<Vec<modules::Case>, Refusal> {
    Ok(selected_modules(names)?.into_iter().flat_map(|module| module.cases).collect())
}

/// `palisade verify`: a progress bar (a terminal) or progress lines on stderr, the summary table
/// on stdout, the report file; exit 0 when nothing unbaselined FAILs, 1 otherwise, 2 when the
/// run is refused.
pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    // Which program each operator command runs, before anything runs (a refusal is reported
    // by the run itself, after the gates).
    if check_gates(&args).is_ok()
        && let Ok(commands) = resolve_commands(&args)
    {
        for note in &commands.notes {
            eprintln!("{}", escape::visible(note));
        }
    }
    let display = progress::Progress::new(selected_cases(&args.modules).map_or(0, |cases| cases.len()));
    let result = verify(&args, &mut |check: &Check, outcome: &Outcome| display.finished(check, outcome)).await;
    display.finish();
    let report = match result {
        Ok(report) => report,
        Err(refusal) => {
            eprintln!("error: {}", escape::visible(&refusal.to_string()));
            return Ok(ExitCode::from(2));
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(report.summary_table().as_bytes())?;
    stdout.flush()?;
    if let Some(path) = &args.output {
        let format = args.format.unwrap_or(Format::Json);
        std::fs::write(path, report.render(format))
            .map_err(|error| anyhow::anyhow!("writing the report to {}: {error}", path.display()))?;
    }
    for stale in &report.stale {
        let now = report.entries.iter().find(|entry| entry.check.id == stale.id).map(|entry| entry.outcome.verdict);
        let now = now.map_or("did not run", |verdict| verdict.label());
        eprintln!(
            "stale baseline entry: {} was accepted as {}, is {now} now; remove or update it",
            escape::visible(&stale.id),
            stale.verdict.label()
        );
    }
    Ok(ExitCode::from(report.exit_code()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> VerifyArgs {
        VerifyArgs::parse_from(list.iter().copied()).unwrap()
    }

    #[test]
    fn the_gates_need_authorization_and_a_loopback_or_named_host() {
        assert!(matches!(check_gates(&args(&["http://127.0.0.1:1/mcp"])), Err(Refusal::NotAuthorized)));
        let remote = args(&["https://mcp.example.com/mcp", "--i-am-authorized"]);
        assert!(matches!(check_gates(&remote), Err(Refusal::HostNotAllowed(_))));
        let other = args(&["https://mcp.example.com/mcp", "--i-am-authorized", "--target-host", "other.example.com"]);
        assert!(matches!(check_gates(&other), Err(Refusal::HostNotAllowed(_))));
        let named = args(&["https://mcp.example.com/mcp", "--i-am-authorized", "--target-host", "mcp.example.com"]);
        assert!(check_gates(&named).is_ok());
        for local in ["http://127.0.0.1:9/mcp", "http://localhost:9/mcp", "http://[::1]:9/mcp"] {
            assert!(check_gates(&args(&[local, "--i-am-authorized"])).is_ok(), "{local}");
        }
        assert!(matches!(check_gates(&args(&["file:///etc/x", "--i-am-authorized"])), Err(Refusal::BadUrl(_))));
        assert!(
            VerifyArgs::parse_from(["http://127.0.0.1:1/mcp", "--format", "json"]).is_err(),
            "--format needs --output"
        );
    }

    #[test]
    fn module_selection_keeps_report_order_and_refuses_unknown_names() {
        let every = selected_cases(&[]).unwrap();
        assert_eq!(every.len(), modules::all().into_iter().map(|module| module.cases.len()).sum::<usize>());
        let auth = selected_cases(&["auth".into()]).unwrap();
        assert!(!auth.is_empty() && auth.iter().all(|case| case.check.id.starts_with("auth.")));
        let two = selected_cases(&["sessions".into(), "transport".into()]).unwrap();
        assert!(two.first().unwrap().check.id.starts_with("transport."), "report order, not argument order");
        assert!(matches!(selected_cases(&["handle".into()]), Err(Refusal::UnknownModule(..))));
    }

    #[tokio::test]
    async fn a_command_whose_program_is_not_found_refuses_the_run_before_anything_is_sent() {
        let run = args(&[
            "http://127.0.0.1:9/mcp",
            "--i-am-authorized",
            "--disable-command",
            "palisade-verify-no-such-program authority disable --target {target}",
            "--enable-command",
            "sh -c true",
        ]);
        let refusal = verify(&run, &mut |_, _| {}).await.unwrap_err();
        assert!(matches!(refusal, Refusal::Command(_)), "{refusal}");
        assert!(
            refusal.to_string().contains(
                "--disable-command: palisade-verify-no-such-program not found on PATH; give an absolute path"
            ),
            "{refusal}"
        );
        let commands = resolve_commands(&args(&[
            "http://127.0.0.1:9/mcp",
            "--change-upstream-command",
            "sh -c true {tool} {state}",
        ]))
        .unwrap();
        let resolved = commands.change_upstream.unwrap();
        assert!(resolved.starts_with('/') && resolved.ends_with("/sh -c true {tool} {state}"), "{resolved}");
        let program = resolved.split_whitespace().next().unwrap();
        assert_eq!(commands.notes, [format!("--change-upstream-command runs {program} (sh found on PATH)")]);
    }
}
