//! Reading the audit log by what its records say: [`AuditQuery`] (time range, decision, stage,
//! code, operation or method, tool, upstream, trace, principal digests; optionally one chain's records
//! after a sequence number, for following the log) and the one statement both backends run for
//! it, built from constant clauses with every value bound.

use crate::Decision;
use crate::handles::Bind;

/// Most records one [`AuditStore::search`](crate::AuditStore::search) returns, whatever limit is
/// asked for.
pub const MAX_SEARCH: u32 = 10_000;

/// Which audit records to read. Every field left empty matches every record; the values of one
/// field are alternatives (any may match), the fields together must all match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Records made at or after this time (milliseconds since the Unix epoch).
    pub since_ms: Option<u64>,
    /// Records made at or before this time.
    pub until_ms: Option<u64>,
    /// Allowed or refused.
    pub decision: Option<Decision>,
    /// The stages (`authorize`, `killswitch`, `pins`, …).
    pub stages: Vec<String>,
    /// The codes sent back (a JSON-RPC error code or an HTTP status).
    pub codes: Vec<i64>,
    /// Operations: a value with a `:` is a whole operation (`tools/call:get-env`); one without
    /// is a method and matches every operation of it (`tools/call` matches `tools/call:…` and a
    /// `tools/call` that was refused before it was classified).
    pub operations: Vec<String>,
    /// Tools by the name the client called (the operation `tools/call:<name>`).
    pub tools: Vec<String>,
    /// Upstreams by id: the gateway's records of an upstream's definitions and calls begin their
    /// detail with `upstream=<id>`.
    pub upstreams: Vec<String>,
    /// Trace ids (a request's records share one; so do its log lines and exported span).
    pub trace_ids: Vec<String>,
    /// Principal digests (the keyed digests every record carries instead of the identity).
    pub principal_digests: Vec<String>,
    /// Only records of one chain in a range of sequence numbers, oldest first (how a reader
    /// follows the log: the head of each chain it has seen, and the records after it).
    pub chain: Option<ChainRange>,
    /// Most records returned (capped at [`MAX_SEARCH`]).
    pub limit: u32,
}

/// The records `after_seq < seq <= up_to_seq` of one chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRange {
    /// The chain id.
    pub chain: String,
    /// The last record already seen (0 for none).
    pub after_seq: u64,
    /// The chain's head when it was read: records beyond it may still be arriving.
    pub up_to_seq: u64,
}

/// Placeholders numbered as values are bound.
struct Clauses {
    clauses: Vec<String>,
    binds: Vec<Bind>,
}

impl Clauses {
    fn placeholder(&mut self, bind: Bind) -> String {
        self.binds.push(bind);
        format!("${}", self.binds.len())
    }

    /// `column = $n` for one value, `column IN ($n, …)` for several, nothing for none.
    fn any_of(&mut self, column: &'static str, values: Vec<Bind>) {
        if values.is_empty() {
            return;
        }
        let placeholders: Vec<String> = values.into_iter().map(|value| self.placeholder(value)).collect();
        self.clauses.push(format!("{column} IN ({})", placeholders.join(", ")));
    }

    /// `column` begins with `prefix` (an exact, case-sensitive comparison on both backends).
    fn starts_with(&mut self, column: &'static str, prefix: String) -> String {
        let n = self.placeholder(Bind::Text(prefix));
        format!("substr({column}, 1, length({n})) = {n}")
    }

    /// At least one of `alternatives` (each already a clause) holds.
    fn one_of(&mut self, alternatives: Vec<String>) {
        if !alternatives.is_empty() {
            self.clauses.push(format!("({})", alternatives.join(" OR ")));
        }
    }
}

fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The statement of `query` with `$n` placeholders and the values to bind, in order. Newest
/// first (time, then chain and sequence number), or oldest first within one chain's range.
pub(crate) fn search_statement(query: &AuditQuery) -> (String, Vec<Bind>) {
    let mut built = Clauses { clauses: Vec::new(), binds: Vec::new() };
    if let Some(since) = query.since_ms {
        let n = built.placeholder(Bind::Int(int(since)));
        built.clauses.push(format!("at_ms >= {n}"));
    }
    if let Some(until) = query.until_ms {
        let n = built.placeholder(Bind::Int(int(until)));
        built.clauses.push(format!("at_ms <= {n}"));
    }
    if let Some(decision) = query.decision {
        built.any_of("decision", vec![Bind::Text(decision.as_str().to_owned())]);
    }
    built.any_of("stage", query.stages.iter().cloned().map(Bind::Text).collect());
    built.any_of("code", query.codes.iter().copied().map(Bind::Int).collect());
    let mut operations = Vec::new();
    for operation in &query.operations {
        let n = built.placeholder(Bind::Text(operation.clone()));
        operations.push(format!("operation = {n}"));
        if !operation.contains(':') {
            operations.push(built.starts_with("operation", format!("{operation}:")));
        }
    }
    built.one_of(operations);
    built.any_of("operation", query.tools.iter().map(|tool| Bind::Text(format!("tools/call:{tool}"))).collect());
    let mut upstreams = Vec::new();
    for upstream in &query.upstreams {
        let n = built.placeholder(Bind::Text(format!("upstream={upstream}")));
        upstreams.push(format!("detail = {n}"));
        upstreams.push(built.starts_with("detail", format!("upstream={upstream} ")));
    }
    built.one_of(upstreams);
    built.any_of("trace_id", query.trace_ids.iter().cloned().map(Bind::Text).collect());
    built.any_of("principal_digest", query.principal_digests.iter().cloned().map(Bind::Text).collect());
    let order = match &query.chain {
        Some(range) => {
            let chain = built.placeholder(Bind::Text(range.chain.clone()));
            let after = built.placeholder(Bind::Int(int(range.after_seq)));
            let up_to = built.placeholder(Bind::Int(int(range.up_to_seq)));
            built.clauses.push(format!("chain_id = {chain} AND seq > {after} AND seq <= {up_to}"));
            "seq"
        }
        None => "at_ms DESC, chain_id DESC, seq DESC",
    };
    let limit = built.placeholder(Bind::Int(i64::from(query.limit.min(MAX_SEARCH))));
    let filter =
        if built.clauses.is_empty() { String::new() } else { format!(" WHERE {}", built.clauses.join(" AND ")) };
    let statement =
        format!("SELECT chain_id, {} FROM audit_log{filter} ORDER BY {order} LIMIT {limit}", audit_columns!());
    (statement, built.binds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_query_reads_the_newest_records() {
        let (statement, binds) = search_statement(&AuditQuery { limit: 5, ..AuditQuery::default() });
        assert!(
            statement.ends_with(" FROM audit_log ORDER BY at_ms DESC, chain_id DESC, seq DESC LIMIT $1"),
            "{statement}"
        );
        assert!(matches!(binds.as_slice(), [Bind::Int(5)]));
    }

    #[test]
    fn every_value_is_bound_never_spliced() {
        let hostile = "x' OR '1'='1";
        let query = AuditQuery {
            since_ms: Some(1),
            until_ms: Some(2),
            decision: Some(Decision::Deny),
            stages: vec![hostile.into(), "pins".into()],
            codes: vec![-32030],
            operations: vec![hostile.into(), "tools/call:a".into()],
            tools: vec![hostile.into()],
            upstreams: vec![hostile.into()],
            trace_ids: vec![hostile.into()],
            principal_digests: vec![hostile.into()],
            chain: Some(ChainRange { chain: hostile.into(), after_seq: 3, up_to_seq: 9 }),
            limit: u32::MAX,
        };
        let (statement, binds) = search_statement(&query);
        assert!(!statement.contains('\''), "{statement}");
        let placeholders = statement.matches('$').count();
        // The prefix comparisons name their placeholder twice.
        assert_eq!(placeholders, binds.len() + 2, "{statement}");
        assert!(statement.ends_with("ORDER BY seq LIMIT $18"), "{statement}");
        assert!(matches!(binds.last(), Some(Bind::Int(limit)) if *limit == i64::from(MAX_SEARCH)));
    }
}
