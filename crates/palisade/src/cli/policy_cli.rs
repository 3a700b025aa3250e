//! `palisade policy …`: the kill switch's signed operation registry (`init`, `sign`, in
//! `killswitch_cli`) and the operator's Cedar policies: `check` validates the configured files
//! against the registry's generated schema (every problem at its file and line), `test` runs a
//! table of cases and exits non-zero on any mismatch (for CI), `schema` prints the generated
//! schema.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::Settings;
use palisade_server::method::Method;
use palisade_server::policy::{Policies, PolicyRequest, PrincipalView};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::killswitch_cli::{PolicyInitArgs, PolicySignArgs, policy_init, policy_sign};

/// `palisade policy …`
#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Kill switch: write the registry skeleton of the server's own registry (every method,
    /// tool, prompt, resource and template of the app) as an unsigned policy payload, for review.
    Init(PolicyInitArgs),
    /// Kill switch: validate a policy payload and sign it with the policy root key.
    Sign(PolicySignArgs),
    /// Operator policies: validate the `[policies]` files (or --file) against the schema
    /// generated from the registry; every problem is named with its file and line.
    Check(CheckArgs),
    /// Operator policies: run a table of cases (TOML) and exit 1 on any mismatch.
    Test(TestArgs),
    /// Operator policies: print the Cedar schema generated from the registry.
    Schema(CheckArgs),
    /// Operator policies: why a request was allowed or refused, from its audit records (by
    /// trace id): the stage that decided and, when the policies did, the policies' text.
    Explain(ExplainArgs),
    /// Operator policies: sign policy files with the kill switch's policy root key (writes
    /// `FILE.sig` beside each), for `[policies] require_signed`.
    SignFiles(SignFilesArgs),
}

#[derive(Args)]
pub struct SignFilesArgs {
    /// The policy root signing key (the one that signs the kill-switch policy).
    #[arg(long)]
    root_key: PathBuf,
    /// The policy files to sign.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    check: CheckArgs,
    /// The request's trace id (as in the log lines, the audit records and exported spans).
    #[arg(long)]
    trace: String,
}

/// Which policies, against which registry.
#[derive(Args)]
pub struct CheckArgs {
    /// Configuration file: its `[policies]` files, validated against its application's registry.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The application: demo, conformance or gateway. Default: from the configuration.
    #[arg(long)]
    app: Option<String>,
    /// A policy file (or `DIR/*.cedar`) instead of the configured ones; repeatable.
    #[arg(long = "file")]
    files: Vec<PathBuf>,
    /// A registry snapshot (JSON: `{"upstreams": {"ID": {"tools": [definitions as the upstream
    /// lists them], "confirm": [names]}}}`) instead of the application's: each tool exposed as
    /// `ID__NAME`, as the gateway names it with a `__` separator, `confirm` as in
    /// `[[upstreams]]`. For CI without the upstreams running.
    #[arg(long, conflicts_with = "app")]
    registry: Option<PathBuf>,
}

#[derive(Args)]
pub struct TestArgs {
    #[command(flatten)]
    check: CheckArgs,
    /// The cases file (TOML, `[[case]]` tables).
    cases: PathBuf,
}

/// Runs a `palisade policy` command.
pub async fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Init(args) => policy_init(args).await,
        PolicyCommand::Sign(args) => policy_sign(args),
        PolicyCommand::Check(args) => check(args).await,
        PolicyCommand::Test(args) => test(args).await,
        PolicyCommand::Schema(args) => schema(args).await,
        PolicyCommand::Explain(args) => explain(args).await,
        PolicyCommand::SignFiles(args) => sign_files(args),
    }
}

/// `palisade policy sign-files`: each file parsed as Cedar (a file that does not parse is not
/// signed), then its `FILE.sig` written.
#[allow(clippy::print_stdout)]
fn sign_files(args: SignFilesArgs) -> anyhow::Result<ExitCode> {
    let key = palisade_killswitch::Ed25519SigningKey::read(&args.root_key).context("reading the root key")?;
    for file in &args.files {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let text = std::str::from_utf8(&bytes).with_context(|| format!("{} is not UTF-8", file.display()))?;
        if let Err(errors) = palisade_server::policy::parses(text) {
            anyhow::bail!("{} does not parse as Cedar policies, not signed: {errors}", file.display());
        }
        let signature = palisade_host::policies::signature_path(file);
        std::fs::write(&signature, palisade_killswitch::keys::sign_policy_file(&key, &bytes))
            .with_context(|| format!("writing {}", signature.display()))?;
        println!("signed {} -> {}", file.display(), signature.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The registry and the policy set the arguments name.
async fn load(args: &CheckArgs) -> anyhow::Result<(palisade_server::App, Settings, Result<Policies, String>)> {
    let mut settings = super::settings_for_app(args.config.as_deref(), args.app.as_deref())?;
    if !args.files.is_empty() {
        settings.policies.files.clone_from(&args.files);
    }
    let app = match &args.registry {
        Some(file) => snapshot_registry(file)?,
        None => super::registry(&settings).await?,
    };
    if !settings.policies.enabled() {
        anyhow::bail!("no policy files: configure [policies] files, or name them with --file");
    }
    let policies = match palisade_host::policies::load(&settings.policies, &app) {
        Ok(policies) => Ok(policies.context("no policy files")?),
        Err(palisade_host::policies::LoadError::Invalid(errors)) => Err(errors.to_string()),
        Err(error) => return Err(error.into()),
    };
    Ok((app, settings, policies))
}

#[allow(clippy::print_stdout)]
async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let (_, settings, policies) = load(&args).await?;
    match policies {
        Ok(policies) => {
            println!(
                "{} policies in {} file(s) valid against the registry's schema (digest {})",
                policies.len(),
                settings.policies.files.len(),
                policies.digest()
            );
            for name in policies.conflicts() {
                println!("note: argument {name:?} is typed differently by two definitions: policies cannot see it");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            eprintln!("{errors}");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[allow(clippy::print_stdout)]
async fn schema(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let settings = super::settings_for_app(args.config.as_deref(), args.app.as_deref())?;
    let app = match &args.registry {
        Some(file) => snapshot_registry(file)?,
        None => super::registry(&settings).await?,
    };
    let vocabulary = palisade_server::policy::schema::Vocabulary::of(&app, settings.policies.limits.max_depth);
    print!("{}", vocabulary.schema);
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::print_stdout)]
async fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    if args.trace.is_empty() || args.trace.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!("--trace {:?} is no trace id", args.trace);
    }
    let settings = super::settings_for_app(args.check.config.as_deref(), args.check.app.as_deref())?;
    let store = palisade_store::open_store_read_only(&settings.store).await.context("opening the audit log")?;
    let query = palisade_store::AuditQuery { trace_ids: vec![args.trace.clone()], limit: 100, ..Default::default() };
    let found = store.search(query).await;
    store.close().await;
    let mut records = found.context("reading the audit log")?;
    records.sort_by_key(|stored| stored.record.at_ms);
    if records.is_empty() {
        anyhow::bail!("no audit record has trace id {}", args.trace);
    }
    let mut decided = None;
    for stored in &records {
        let record = &stored.record;
        let decision = if record.decision == palisade_store::Decision::Allow { "allow" } else { "deny" };
        let code = record.code.map(|code| format!(" code {code}")).unwrap_or_default();
        println!("{} {decision} at stage {}{code}", record.operation, record.stage);
        if let Some(detail) =
            record.detail.as_deref().and_then(|d| d.split(' ').find(|part| part.starts_with("policy=")))
        {
            let by = record.detail.as_deref().and_then(|d| d.split(' ').find_map(|part| part.strip_prefix("by=")));
            decided =
                Some((detail.trim_start_matches("policy=").to_owned(), by.unwrap_or("none").to_owned(), decision));
        }
    }
    let Some((digest, by, decision)) = decided else {
        println!(
            "the operator's policies did not decide this request (none configured then, or a stage before them refused it)"
        );
        return Ok(ExitCode::SUCCESS);
    };
    let (_, _, policies) = load(&args.check).await?;
    let policies = policies.map_err(|errors| anyhow::anyhow!("the policy files do not validate now:\n{errors}"))?;
    if policies.digest() != digest {
        println!(
            "note: the policy files changed since (set {digest} then, {} now): the text below is today's",
            policies.digest()
        );
    }
    if by == "none" {
        println!("no policy permitted it: with policies configured, a request no policy permits is refused");
        return Ok(ExitCode::SUCCESS);
    }
    let role = if decision == "allow" { "permitted by" } else { "decided by" };
    for id in by.split(',') {
        match policies.text(id) {
            Some(text) => println!("{role} {id}:\n{text}"),
            None => println!("{role} {id} (no such policy now)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The registry of a snapshot file: each upstream's tool definitions, exposed as `ID__NAME`.
fn snapshot_registry(file: &Path) -> anyhow::Result<palisade_server::App> {
    use palisade_server::method::Origin;
    use palisade_server::{CallToolResult, Outcome, ToolDef};
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let snapshot: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    let upstreams = snapshot
        .get("upstreams")
        .and_then(Value::as_object)
        .with_context(|| format!("{}: expected {{\"upstreams\": {{\"ID\": {{\"tools\": [...]}}}}}}", file.display()))?;
    let mut builder = palisade_server::App::builder("gateway", "snapshot").dynamic();
    for (id, upstream) in upstreams {
        let tools = upstream.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        // The upstream's `confirm` list, as in its [[upstreams]] table.
        let confirm: Vec<&str> =
            upstream.get("confirm").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        for tool in tools {
            let definition = tool.as_object().cloned().with_context(|| format!("{id}: a tool is not an object"))?;
            let name = definition
                .get("name")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .with_context(|| format!("{id}: a tool has no name"))?;
            let exposed = format!("{id}__{name}");
            let origin = Origin {
                upstream: id.clone(),
                pin: String::new(),
                audit_detail: format!("upstream={id} exposed={exposed}"),
            };
            let handler =
                |_, _| async { Ok(Outcome::Complete(CallToolResult::error("a registry snapshot runs nothing"))) };
            let mut tool = ToolDef::relayed(exposed, definition, origin);
            if confirm.contains(&name.as_str()) {
                tool = tool.needs_confirmation();
            }
            builder = builder.tool(tool.handler(handler));
        }
    }
    builder.build().with_context(|| format!("{}: not a valid registry", file.display()))
}

/// A cases file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cases {
    case: Vec<Case>,
}

/// One case: a request and the decision (and, optionally, the deciding policy ids) expected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    principal: CasePrincipal,
    /// The MCP method, e.g. `tools/call`.
    action: String,
    /// The registered tool or prompt name, or resource URI (none for a method without target).
    resource: Option<String>,
    #[serde(default)]
    arguments: Map<String, Value>,
    /// RFC 3339; default now.
    time: Option<String>,
    /// `2026-07-28` (default) or `2025`.
    era: Option<String>,
    /// `context.source`: the caller's address (absent: unknown, as on stdio).
    #[serde(default)]
    source: Option<String>,
    /// `allow` or `deny`.
    expect: String,
    /// The deciding policy ids expected (any order), when given.
    policies: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CasePrincipal {
    subject: String,
    #[serde(default = "default_issuer")]
    issuer: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    client: String,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    /// Under a delegation capability: the chain of agents, root first (the last one calls).
    #[serde(default)]
    agents: Vec<String>,
}

fn default_issuer() -> String {
    "https://issuer.example".into()
}

#[allow(clippy::print_stdout)]
async fn test(args: TestArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.cases).with_context(|| format!("reading {}", args.cases.display()))?;
    let cases: Cases = toml::from_str(&text).with_context(|| format!("{}: not a cases file", args.cases.display()))?;
    let (app, _, policies) = load(&args.check).await?;
    let policies = match policies {
        Ok(policies) => policies,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let now_ms = SystemClock.now_unsigned_ms();
    let mut failed = 0usize;
    for case in &cases.case {
        match run_case(&policies, &app, case, now_ms, &args.cases) {
            Ok(None) => println!("ok       {}", case.name),
            Ok(Some(mismatch)) => {
                failed += 1;
                println!("MISMATCH {}: {mismatch}", case.name);
            }
            Err(error) => {
                failed += 1;
                println!("ERROR    {}: {error:#}", case.name);
            }
        }
    }
    println!("{} case(s), {} passed, {failed} failed", cases.case.len(), cases.case.len() - failed);
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// One case: `None` when the decision is the expected one, else what differs.
fn run_case(
    policies: &Policies,
    app: &palisade_server::App,
    case: &Case,
    now_ms: u64,
    file: &Path,
) -> anyhow::Result<Option<String>> {
    let method = Method::parse(&case.action)
        .or_else(|| Method::parse_legacy(&case.action))
        .filter(|m| Policies::decides(*m))
        .with_context(|| format!("{}: {:?} is not a method policies decide", file.display(), case.action))?;
    let expect_allow = match case.expect.as_str() {
        "allow" => true,
        "deny" => false,
        other => anyhow::bail!("expect must be allow or deny, not {other:?}"),
    };
    let now_ms = match &case.time {
        None => now_ms,
        Some(time) => palisade_base::time::parse_rfc3339_any_offset_ms(time)
            .and_then(|ms| u64::try_from(ms).ok())
            .with_context(|| format!("time {time:?} is not RFC 3339"))?,
    };
    let principal = &case.principal;
    let request = PolicyRequest {
        principal: PrincipalView {
            issuer: principal.issuer.clone(),
            subject: principal.subject.clone(),
            tenant: principal.tenant.clone(),
            client: principal.client.clone(),
            scopes: principal.scopes.clone(),
            groups: principal.groups.clone(),
            agent: principal.agents.last().cloned().unwrap_or_default(),
            agents: principal.agents.clone(),
        },
        method,
        target: case.resource.as_deref(),
        arguments: Some(&case.arguments),
        era: case.era.as_deref().unwrap_or("2026-07-28"),
        source: match &case.source {
            None => None,
            Some(source) => Some(source.parse().with_context(|| format!("source {source:?} is not an IP address"))?),
        },
        now_ms,
    };
    let verdict = policies
        .check_target(app, &request)
        .map(|()| policies.decide(app, &request))
        .map_err(|unknown| anyhow::anyhow!("{unknown}"))?;
    let decided = if verdict.allowed { "allow" } else { "deny" };
    let mut problems = Vec::new();
    if verdict.allowed != expect_allow {
        problems.push(format!("expected {}, got {decided} ({})", case.expect, verdict.reason));
    }
    if let Some(expected) = &case.policies {
        let mut expected = expected.clone();
        expected.sort();
        if expected != verdict.policies {
            problems.push(format!("expected policies {expected:?}, decided by {:?}", verdict.policies));
        }
    }
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}
