//! What a check is (a stable id, a requirement, a severity), the five verdicts, and one check's
//! outcome; plus the rule every negative case follows: its positive control must be accepted
//! first, judged from the JSON-RPC body, or the case is inconclusive; a refusal in a shape the
//! operator's refusal map does not list is a warning.

use serde::{Deserialize, Serialize};

use crate::target::Exchange;

/// One check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The target behaved as required.
    Pass,
    /// The target violated a requirement.
    Fail,
    /// The target did something the requirement leaves open but that weakens it.
    Warning,
    /// The check needs something the operator did not supply (an identity, a token, a flag).
    NotTestable,
    /// The positive control failed (or the target did not answer): nothing can be concluded.
    Inconclusive,
}

impl Verdict {
    /// The label used in progress lines and tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Warning => "WARNING",
            Self::NotTestable => "NOT TESTABLE",
            Self::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// How much a failure of the check matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; no direct exposure.
    Low,
    /// A weakened defence or a protocol violation clients will trip over.
    Medium,
    /// A defence that is missing (cross-site requests, resource exhaustion).
    High,
    /// Another caller's data or authority is reachable.
    Critical,
}

/// The static description of one check.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Check {
    /// Stable, dotted id (`transport.origin.foreign`): never reused for another meaning.
    pub id: &'static str,
    /// One line saying what is tested.
    pub title: &'static str,
    /// The requirement tested: a spec clause or a seed section.
    pub requirement: &'static str,
    /// How much a failure matters.
    pub severity: Severity,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The check's id.
    pub id: String,
    /// Its verdict.
    pub verdict: Verdict,
    /// Why, in one or two sentences.
    pub detail: String,
    /// The exchanges it made, redacted (no token ever appears).
    pub transcript: Vec<String>,
}

impl Outcome {
    /// An outcome for `check` with no transcript yet.
    pub fn new(check: &Check, verdict: Verdict, detail: impl Into<String>) -> Self {
        Self { id: check.id.to_owned(), verdict, detail: detail.into(), transcript: Vec::new() }
    }

    /// The same outcome with the transcript of `exchanges` appended.
    pub fn with(mut self, exchanges: &[&Exchange]) -> Self {
        self.transcript.extend(exchanges.iter().map(|exchange| exchange.transcript.clone()));
        self
    }
}

/// How a negative case's answer is judged once its control was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The refusal is the one required.
    Refused,
    /// Refused, but not in the required way (a wrong code or status): the detail says how.
    RefusedOddly(String),
    /// The request was served: the detail says what came back.
    Accepted(String),
}

/// The verdict of a negative case from its control and its judgement: a control that was not
/// accepted makes the case inconclusive, never a pass. `odd` is the verdict of a refusal that
/// is not the required one (WARNING where the spec leaves it open, FAIL where it does not).
pub fn paired(check: &Check, control: &Exchange, negative: &Exchange, judgement: Judgement, odd: Verdict) -> Outcome {
    if !control.accepted() {
        let detail = format!("positive control not accepted ({}): nothing to compare with", control.summary());
        return Outcome::new(check, Verdict::Inconclusive, detail).with(&[control, negative]);
    }
    let (verdict, detail) = match judgement {
        Judgement::Refused => match &negative.unlisted_refusal {
            // The operator's map says how this server refuses; this refusal is not one of those.
            Some(shape) => (
                Verdict::Warning,
                format!("refused, but as {shape}, which the refusal map does not list for this server"),
            ),
            None => (Verdict::Pass, format!("refused ({}); the control was accepted", negative.summary())),
        },
        Judgement::RefusedOddly(why) => (odd, why),
        Judgement::Accepted(why) => (Verdict::Fail, why),
    };
    Outcome::new(check, verdict, detail).with(&[control, negative])
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn exchange(id: i64, frame: Value, status: u16) -> Exchange {
        Exchange { transcript: format!("#{id}"), ..Exchange::answered(json!(id), status, vec![frame]) }
    }

    const CHECK: Check = Check { id: "test.case", title: "t", requirement: "r", severity: Severity::High };

    #[test]
    fn a_negative_case_is_judged_only_next_to_an_accepted_control() {
        let served = exchange(1, json!({ "jsonrpc": "2.0", "id": 1, "result": {} }), 200);
        // A 200 whose body holds an error is not an acceptance: the body decides, not the status.
        let refused_as_200 = exchange(1, json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32600 } }), 200);
        let negative = exchange(2, json!({ "jsonrpc": "2.0", "id": 2, "error": { "code": -32600 } }), 403);
        let outcome = paired(&CHECK, &refused_as_200, &negative, Judgement::Refused, Verdict::Fail);
        assert_eq!(outcome.verdict, Verdict::Inconclusive);
        assert_eq!(outcome.transcript, ["#1", "#2"]);
        assert_eq!(paired(&CHECK, &served, &negative, Judgement::Refused, Verdict::Fail).verdict, Verdict::Pass);
        let odd = Judgement::RefusedOddly("400".into());
        assert_eq!(paired(&CHECK, &served, &negative, odd.clone(), Verdict::Warning).verdict, Verdict::Warning);
        assert_eq!(paired(&CHECK, &served, &negative, odd, Verdict::Fail).verdict, Verdict::Fail);
        let mut unlisted = negative.clone();
        unlisted.unlisted_refusal = Some("HTTP 403, error -32600".into());
        let outcome = paired(&CHECK, &served, &unlisted, Judgement::Refused, Verdict::Fail);
        assert_eq!(outcome.verdict, Verdict::Warning, "a refusal the map does not list");
        assert!(outcome.detail.contains("HTTP 403, error -32600"), "{}", outcome.detail);
        let accepted = Judgement::Accepted("served".into());
        assert_eq!(paired(&CHECK, &served, &served, accepted, Verdict::Warning).verdict, Verdict::Fail);
    }
}
