//! `palisade audit show|search|tail`: the audit log read without opening the database, through
//! filters (time, decision, stage, code, operation, tool, upstream, trace, subject by the keyed
//! digest the records hold), as a table or JSON lines, each record checked against its hash.
//! Reads only: the store is opened read-only and nothing is created.

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use palisade_base::clock::{Clock as _, SystemClock};
use palisade_host::Settings;
use palisade_host::settings::ConfigError;
use palisade_store::{AuditQuery, ChainRange, Decision, MAX_SEARCH, Store, StoredAuditRecord};

/// What to read, shared by `show`, `search` and `tail`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReadArgs {
    /// Records at or after this time: RFC 3339 (`2026-12-07T09:00:00Z`, `…T10:00:00+01:00`) or an
    /// age before now (`90s`, `15m`, `2h`, `1d`, `1w`).
    #[arg(long)]
    pub since: Option<String>,
    /// Records at or before this time (the same forms as --since).
    #[arg(long)]
    pub until: Option<String>,
    /// `allow` or `deny`.
    #[arg(long)]
    pub decision: Option<String>,
    /// The stage that decided (`authenticate`, `authorize`, `killswitch`, `pins`, `operator`, …);
    /// repeat for any of several.
    #[arg(long)]
    pub stage: Vec<String>,
    /// The code sent back (a JSON-RPC error code such as -32030, or an HTTP status); repeatable.
    #[arg(long, allow_hyphen_values = true)]
    pub code: Vec<String>,
    /// An operation (`tools/call:get-env`) or a method, matching all its operations
    /// (`tools/call`, `resources/read`, `pins/approved`); repeatable.
    #[arg(long)]
    pub operation: Vec<String>,
    /// A tool by the name clients call it (on the gateway, the exposed name); repeatable.
    #[arg(long)]
    pub tool: Vec<String>,
    /// A gateway upstream by id: its calls and its definitions' pin decisions; repeatable.
    #[arg(long)]
    pub upstream: Vec<String>,
    /// A request's trace id (as in the log lines and exported spans); repeatable.
    #[arg(long)]
    pub trace: Vec<String>,
    /// A person by subject (`sub`). Records hold only keyed digests of `issuer#subject`, so this
    /// reads the server secret the server reads (`secret_file`, default
    /// `<data_dir>/server-secret`, or `PALISADE_SECRET_FILE`), derives the audit-digest key from
    /// it and computes the subject's digest under --issuer, or under every issuer the
    /// configuration trusts (its `[[auth.issuers]]` and the development issuer when on).
    #[arg(long)]
    pub subject: Option<String>,
    /// The subject's issuer (`iss`), for --subject.
    #[arg(long, requires = "subject")]
    pub issuer: Option<String>,
    /// A principal digest as records hold it (32 hex characters); needs no key. Repeatable.
    #[arg(long)]
    pub principal_digest: Vec<String>,
    /// Most records shown (1–10000), the newest ones; shown oldest first.
    #[arg(long)]
    pub limit: Option<u32>,
    /// `table` (readable; the default on a terminal) or `json` (one JSON object per line; the
    /// default otherwise).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Configuration file (the store URL, the server secret, the issuers).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// How records are printed.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns.
    Table,
    /// One JSON object per record and line.
    Json,
}

/// Which command reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// The newest records, filtered or not.
    Show,
    /// Records by at least one filter.
    Search,
    /// The newest records, then every new one as it arrives.
    Tail {
        /// Seconds between looks at the store.
        interval: u64,
    },
}

/// Runs `audit show|search|tail`: exit 0, 1 when a record shown does not match its hash (or its
/// predecessor's), 2 when a filter is bad or the log could not be read.
pub async fn run(args: ReadArgs, reading: Reading) -> anyhow::Result<ExitCode> {
    let settings = super::settings(args.config.as_deref())?;
    let query = query(&args, &settings, reading)?;
    let format = args.format.unwrap_or(if std::io::stdout().is_terminal() { Format::Table } else { Format::Json });
    let store = match palisade_store::open_store_read_only(&settings.store).await {
        Ok(store) => store,
        Err(error) => return Ok(unreadable(&anyhow::Error::new(error).context(store_name(&settings)))),
    };
    let mut printer = Printer::new(format);
    let outcome = match reading {
        Reading::Show | Reading::Search => show(store.as_ref(), query, &mut printer).await,
        Reading::Tail { interval } => tail(store.as_ref(), query, &mut printer, interval).await,
    };
    store.close().await;
    match outcome {
        Ok(()) => Ok(if printer.mismatches > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }),
        Err(error) => Ok(unreadable(&error)),
    }
}

/// Exit 2 with the reason: the log could not be read (never "nothing matched").
fn unreadable(error: &anyhow::Error) -> ExitCode {
    eprintln!("error: the audit log could not be read: {error:#}");
    ExitCode::from(2)
}

/// The store as an error may name it: a SQLite file by its path; a PostgreSQL URL never (it
/// may hold a password).
fn store_name(settings: &Settings) -> String {
    match settings.store.strip_prefix("sqlite:") {
        Some(path) => format!("opening the SQLite store {} read-only", path.trim_start_matches("//")),
        None => "opening the PostgreSQL store read-only".to_owned(),
    }
}

fn bad(key: &str, reason: impl Into<String>) -> anyhow::Error {
    ConfigError { key: key.into(), reason: reason.into() }.into()
}

/// The store query of the arguments; every bad filter is a [`ConfigError`] naming its flag.
fn query(args: &ReadArgs, settings: &Settings, reading: Reading) -> anyhow::Result<AuditQuery> {
    let now = SystemClock.now_unsigned_ms();
    let since = args.since.as_deref().map(|text| parse_time("--since", text, now)).transpose()?;
    let until = args.until.as_deref().map(|text| parse_time("--until", text, now)).transpose()?;
    if let (Some(since), Some(until)) = (since, until)
        && since > until
    {
        return Err(bad("--since", "is later than --until: nothing could match"));
    }
    let decision = match args.decision.as_deref() {
        None => None,
        Some("allow") => Some(Decision::Allow),
        Some("deny") => Some(Decision::Deny),
        Some(other) => return Err(bad("--decision", format!("`{other}` is neither `allow` nor `deny`"))),
    };
    for stage in &args.stage {
        if stage.is_empty()
            || !stage.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"_.".contains(&byte))
        {
            return Err(bad("--stage", format!("`{stage}` is no stage name (lowercase letters, digits, `_` and `.`)")));
        }
    }
    let codes = args
        .code
        .iter()
        .map(|code| {
            code.parse::<i64>()
                .ok()
                .filter(|code| code.unsigned_abs() <= palisade_base::canonical::MAX_SAFE_INTEGER)
                .ok_or_else(|| bad("--code", format!("`{code}` is not an integer code (e.g. -32030 or 403)")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (flag, values) in [("--operation", &args.operation), ("--tool", &args.tool), ("--trace", &args.trace)] {
        if let Some(value) =
            values.iter().find(|value| value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(bad(flag, format!("{value:?} is empty or holds white space or control characters")));
        }
    }
    for upstream in &args.upstream {
        palisade_gateway::names::check_label(upstream)
            .map_err(|why| bad("--upstream", format!("`{upstream}` is no upstream id: an id {why}")))?;
    }
    let mut principal_digests = Vec::new();
    for digest in &args.principal_digest {
        let lower = digest.to_ascii_lowercase();
        if lower.len() != 32 || !lower.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(bad("--principal-digest", format!("`{digest}` is not 32 hex characters")));
        }
        principal_digests.push(lower);
    }
    if let Some(subject) = &args.subject {
        principal_digests.extend(subject_digests(settings, subject, args.issuer.as_deref())?);
    }
    let limit = args.limit.unwrap_or(match reading {
        Reading::Tail { .. } => 10,
        Reading::Show | Reading::Search => 50,
    });
    if limit == 0 || limit > MAX_SEARCH {
        return Err(bad("--limit", format!("must be 1–{MAX_SEARCH}")));
    }
    let query = AuditQuery {
        since_ms: since,
        until_ms: until,
        decision,
        stages: args.stage.clone(),
        codes,
        operations: args.operation.clone(),
        tools: args.tool.clone(),
        upstreams: args.upstream.clone(),
        trace_ids: args.trace.clone(),
        principal_digests,
        chain: None,
        limit,
    };
    if reading == Reading::Search && query == (AuditQuery { limit, ..AuditQuery::default() }) {
        return Err(bad(
            "audit search",
            "name at least one filter (--since, --decision, --stage, --subject, …); `palisade audit show` shows the newest records",
        ));
    }
    Ok(query)
}

/// An RFC 3339 time (any offset) or an age before `now` (`90s`, `15m`, `2h`, `1d`, `1w`), as
/// milliseconds since the epoch.
fn parse_time(flag: &str, text: &str, now: u64) -> anyhow::Result<u64> {
    if let Some(at) = palisade_base::time::parse_rfc3339_any_offset_ms(text) {
        return Ok(u64::try_from(at).unwrap_or(0));
    }
    let unit = text.chars().last().and_then(|unit| match unit {
        's' => Some(1_000_u64),
        'm' => Some(60_000),
        'h' => Some(3_600_000),
        'd' => Some(86_400_000),
        'w' => Some(604_800_000),
        _ => None,
    });
    let count = text
        .get(..text.len().saturating_sub(1))
        .filter(|count| !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()));
    match (unit, count.and_then(|count| count.parse::<u64>().ok())) {
        (Some(unit), Some(count)) => Ok(now.saturating_sub(count.saturating_mul(unit))),
        _ => Err(bad(
            flag,
            format!(
                "`{text}` is neither an RFC 3339 time (2026-12-07T09:00:00Z, …+01:00) nor an age (90s, 15m, 2h, 1d, 1w)"
            ),
        )),
    }
}

/// The digests a subject's records carry: under `issuer`, or under every issuer the
/// configuration trusts. Reads the server secret (never creates it).
fn subject_digests(settings: &Settings, subject: &str, issuer: Option<&str>) -> anyhow::Result<Vec<String>> {
    if subject.is_empty() {
        return Err(bad("--subject", "must not be empty"));
    }
    let issuers: Vec<String> = match issuer {
        Some(issuer) => vec![issuer.to_owned()],
        None => {
            let mut issuers: Vec<String> = settings.auth.issuers.iter().map(|issuer| issuer.issuer.clone()).collect();
            if settings.auth.dev_issuer {
                issuers.push(palisade_host::authn::dev_issuer_id(settings));
            }
            issuers
        }
    };
    if issuers.is_empty() {
        return Err(bad(
            "--issuer",
            "the configuration trusts no issuer: name the subject's issuer (`iss`) with --issuer",
        ));
    }
    let secret = palisade_host::secrets::existing_server_secret(settings).map_err(|error| {
        bad(
            "--subject",
            format!(
                "records hold keyed digests of `issuer#subject`, computed with the audit-digest key derived from the \
                 server secret, which could not be read: {error:#}"
            ),
        )
    })?;
    let key = secret.audit_digest_key();
    let mut digests = Vec::new();
    for issuer in &issuers {
        let digest = palisade_server::audit::principal_digest(&key, issuer, subject);
        eprintln!("subject {subject} of issuer {issuer}: principal digest {digest}");
        digests.push(digest);
    }
    Ok(digests)
}

/// `show` and `search`: the newest `limit` matches (one more is read to tell whether there are
/// more), printed oldest first.
async fn show(store: &dyn Store, query: AuditQuery, printer: &mut Printer) -> anyhow::Result<()> {
    let limit = query.limit;
    let mut found = store.search(AuditQuery { limit: limit + 1, ..query }).await?;
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    found.reverse();
    for record in &found {
        printer.record(record);
    }
    printer.summary(found.len(), more, limit);
    Ok(())
}

/// `tail`: the newest matches, then, every `interval` seconds, the records each chain gained
/// since (read by chain and sequence number up to the head read first, so a record shipped late
/// with an older time is not missed and none is shown twice), until interrupted.
async fn tail(store: &dyn Store, query: AuditQuery, printer: &mut Printer, interval: u64) -> anyhow::Result<()> {
    let mut seen: HashMap<String, u64> =
        store.chain_heads().await?.into_iter().map(|head| (head.chain, head.seq)).collect();
    let mut newest = store.search(query.clone()).await?;
    // What arrived after the heads were read is shown by the first look below.
    newest.retain(|record| seen.get(&record.chain).is_some_and(|head| record.seq <= *head));
    newest.reverse();
    for record in &newest {
        printer.record(record);
    }
    eprintln!("following the audit log ({} chains) every {interval} s; Ctrl-C stops", seen.len());
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs(interval)) => {}
        }
        let mut arrived = Vec::new();
        for head in store.chain_heads().await? {
            let mut after = seen.get(&head.chain).copied().unwrap_or(0);
            while after < head.seq {
                let range = ChainRange { chain: head.chain.clone(), after_seq: after, up_to_seq: head.seq };
                let page = store.search(AuditQuery { chain: Some(range), limit: MAX_SEARCH, ..query.clone() }).await?;
                let full = page.len() == MAX_SEARCH as usize;
                after = match (full, page.last()) {
                    (true, Some(last)) => last.seq,
                    _ => head.seq,
                };
                arrived.extend(page);
            }
            seen.insert(head.chain, head.seq);
        }
        arrived.sort_by(|a, b| (a.record.at_ms, &a.chain, a.seq).cmp(&(b.record.at_ms, &b.chain, b.seq)));
        for record in &arrived {
            printer.record(record);
        }
    }
}

/// Prints records and checks each against its hash, and against the record before it in its
/// chain when that one was shown too.
struct Printer {
    format: Format,
    /// The last record shown of each chain: its sequence number and hash.
    last: HashMap<String, (u64, [u8; 32])>,
    checked_links: usize,
    mismatches: usize,
    header: bool,
}

impl Printer {
    fn new(format: Format) -> Self {
        Printer { format, last: HashMap::new(), checked_links: 0, mismatches: 0, header: false }
    }

    #[allow(clippy::print_stdout)]
    fn record(&mut self, stored: &StoredAuditRecord) {
        let mut intact = palisade_store::chain_hash(&stored.prev_hash, &stored.record) == stored.hash;
        if let Some((seq, hash)) = self.last.get(&stored.chain)
            && seq + 1 == stored.seq
        {
            self.checked_links += 1;
            intact &= *hash == stored.prev_hash;
        }
        self.last.insert(stored.chain.clone(), (stored.seq, stored.hash));
        if !intact {
            self.mismatches += 1;
            eprintln!(
                "WARNING: record {} of chain {} does not match its hash or its predecessor's: the log was changed \
                 after it was written; `palisade audit verify` walks every chain",
                stored.seq, stored.chain
            );
        }
        match self.format {
            Format::Json => println!("{}", json_line(stored, intact)),
            Format::Table => {
                if !self.header {
                    self.header = true;
                    println!("{}", table_row(&TABLE_HEADER.map(str::to_owned)));
                }
                println!("{}", table_row(&table_cells(stored, intact)));
            }
        }
    }

    /// What was shown and what its hashes say; on stdout under a table, on stderr beside JSON
    /// lines (stdout stays one record per line).
    #[allow(clippy::print_stdout)]
    fn summary(&self, shown: usize, more: bool, limit: u32) {
        let mut text = if shown == 0 {
            "no record matches".to_owned()
        } else {
            let checked = if self.mismatches == 0 {
                format!("each matches its hash; {} links between consecutive records checked", self.checked_links)
            } else {
                format!("{} do NOT match their hash or predecessor", self.mismatches)
            };
            let records = if shown == 1 { "record" } else { "records" };
            format!("{shown} {records}, oldest first; {checked}")
        };
        if more {
            text = format!("{text}; more match than --limit {limit} (the newest are shown)");
        }
        text.push_str("; every chain and the signed checkpoints: `palisade audit verify`");
        match self.format {
            Format::Table => println!("{text}"),
            Format::Json => eprintln!("{text}"),
        }
    }
}

/// One JSON line: the record as hashed, plus where it is (chain, seq), its time in RFC 3339,
/// its hashes and whether it matches them.
fn json_line(stored: &StoredAuditRecord, intact: bool) -> String {
    let mut line = match serde_json::to_value(&stored.record) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    line.insert("at".into(), time(stored.record.at_ms).into());
    line.insert("chain".into(), stored.chain.clone().into());
    line.insert("seq".into(), stored.seq.into());
    line.insert("hash".into(), palisade_base::hex::hex(&stored.hash).into());
    line.insert("prev_hash".into(), palisade_base::hex::hex(&stored.prev_hash).into());
    line.insert("hash_ok".into(), intact.into());
    serde_json::Value::Object(line).to_string()
}

fn time(at_ms: u64) -> String {
    palisade_base::time::format_rfc3339_ms(i64::try_from(at_ms).unwrap_or(i64::MAX))
}

const TABLE_HEADER: [&str; 8] = ["TIME", "DECISION", "STAGE", "CODE", "OPERATION", "PRINCIPAL", "HASH", "DETAIL"];

/// Column widths of the table (the last column is as wide as it is).
const TABLE_WIDTHS: [usize; 7] = [24, 8, 14, 7, 34, 12, 4];

fn table_cells(stored: &StoredAuditRecord, intact: bool) -> [String; 8] {
    let record = &stored.record;
    [
        time(record.at_ms),
        record.decision.as_str().to_owned(),
        printable(&record.stage),
        record.code.map(|code| code.to_string()).unwrap_or_else(|| "-".into()),
        printable(&record.operation),
        record
            .principal_digest
            .as_deref()
            .map(|digest| printable(&digest.chars().take(12).collect::<String>()))
            .unwrap_or_else(|| "-".into()),
        if intact { "ok" } else { "BAD" }.to_owned(),
        record.detail.as_deref().map(printable).unwrap_or_default(),
    ]
}

fn table_row(cells: &[String; 8]) -> String {
    use std::fmt::Write as _;
    let mut row = String::new();
    for (cell, width) in cells.iter().zip(TABLE_WIDTHS) {
        let _ = write!(row, "{cell:<width$}  ");
    }
    row.push_str(&cells[7]);
    row.trim_end().to_owned()
}

/// Text from the log as a terminal may show it: control characters (which could move the cursor
/// or recolour the screen: some detail text comes from upstream servers) escaped.
fn printable(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc_3339_or_ages() {
        let now = 1_765_000_000_000;
        assert_eq!(parse_time("--since", "15m", now).unwrap(), now - 900_000);
        assert_eq!(parse_time("--since", "2h", now).unwrap(), now - 7_200_000);
        assert_eq!(parse_time("--since", "1d", now).unwrap(), now - 86_400_000);
        assert_eq!(
            parse_time("--since", "2026-12-07T10:00:00+01:00", now).unwrap(),
            parse_time("--since", "2026-12-07T09:00:00Z", now).unwrap()
        );
        for bad in ["", "m", "15", "-5m", "15 m", "1y", "yesterday", "2026-12-07", "ﬁm"] {
            let error = parse_time("--since", bad, now).unwrap_err();
            assert!(error.to_string().contains("--since"), "{bad}: {error}");
        }
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(printable("a\u{1b}[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(printable("upstream=bank ünï"), "upstream=bank ünï");
    }
}
