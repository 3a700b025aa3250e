//! The baseline of accepted findings: every entry carries a human judgement and its evidence
//! (the loader refuses one without, naming the entry and the field); an entry accepts one
//! verdict, FAIL or INCONCLUSIVE, and is stale as soon as its check's verdict is another one.

// Helpers outside #[test] functions unwrap too: a failure there is the test failing.
#![allow(clippy::unwrap_used)]

use palisade_verify::check::{Check, Outcome, Severity, Verdict};
use palisade_verify::identity::Redactor;
use palisade_verify::report::{Baseline, Judgement, Report};

const FAILING: Check = Check { id: "demo.failing", title: "t", requirement: "r", severity: Severity::High };
const UNDECIDED: Check = Check { id: "demo.undecided", title: "t", requirement: "r", severity: Severity::Medium };
const PASSING: Check = Check { id: "demo.passing", title: "t", requirement: "r", severity: Severity::Low };

const REAL_FAIL: &str = "[[accepted]]\nid = \"demo.failing\"\nreason = \"no auth\"\njudgement = \"real\"\n\
                         evidence = \"a request with no token was served 200\"\nbreaks = \"authorization spec 2.6\"\n";
const REAL_INCONCLUSIVE: &str = "[[accepted]]\nid = \"demo.undecided\"\nverdict = \"inconclusive\"\n\
                                 reason = \"control refused\"\njudgement = \"real\"\n\
                                 evidence = \"the control tools/call got -32602\"\n";

fn report(fail: Verdict, undecided: Verdict, baseline: &str) -> Report {
    let results = vec![
        (FAILING, Outcome::new(&FAILING, fail, "x")),
        (UNDECIDED, Outcome::new(&UNDECIDED, undecided, "y")),
        (PASSING, Outcome::new(&PASSING, Verdict::Pass, "z")),
    ];
    Report::new("http://127.0.0.1:9/mcp", results, &Baseline::parse(baseline).unwrap(), Redactor::default())
}

fn refused(text: &str) -> String {
    Baseline::parse(text).unwrap_err()
}

#[test]
fn a_judged_fail_and_a_judged_inconclusive_are_accepted_and_matched_by_verdict() {
    let baseline = Baseline::parse(&format!("{REAL_FAIL}\n{REAL_INCONCLUSIVE}")).unwrap();
    assert_eq!(baseline.accepted.len(), 2);
    assert_eq!(baseline.accepted[0].verdict, Verdict::Fail, "fail unless said");
    assert_eq!(baseline.accepted[0].judgement, Some(Judgement::Real));
    assert_eq!(baseline.accepted[1].verdict, Verdict::Inconclusive);
    assert_eq!(baseline.accepted[0].breaks, "authorization spec 2.6");

    let matched = report(Verdict::Fail, Verdict::Inconclusive, &format!("{REAL_FAIL}\n{REAL_INCONCLUSIVE}"));
    assert!(matched.stale.is_empty(), "{:?}", matched.stale);
    assert_eq!(matched.exit_code(), 0);
    let json = matched.to_json();
    let baselined =
        |id: &str| json["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap()["baselined"].clone();
    assert_eq!(baselined("demo.failing"), "no auth");
    assert_eq!(baselined("demo.undecided"), "control refused", "an inconclusive is baselined like a failure");
    assert!(baselined("demo.passing").is_null());
}

#[test]
fn an_entry_is_stale_when_its_check_has_another_verdict_now() {
    // The accepted FAIL now passes; the accepted INCONCLUSIVE now fails.
    let moved = report(Verdict::Pass, Verdict::Fail, &format!("{REAL_FAIL}\n{REAL_INCONCLUSIVE}"));
    let stale: Vec<&str> = moved.stale.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(stale, ["demo.failing", "demo.undecided"]);
    // An INCONCLUSIVE entry does not accept the FAIL its check has now: that FAIL is unbaselined.
    assert_eq!(moved.unbaselined_failures(), 1);
    assert_eq!(moved.exit_code(), 1);
    // A FAIL entry does not accept an INCONCLUSIVE (nor make it baselined), and is stale.
    let fail_entry_for_inconclusive = REAL_FAIL.replace("demo.failing", "demo.undecided");
    let other = report(Verdict::Pass, Verdict::Inconclusive, &fail_entry_for_inconclusive);
    assert_eq!(other.stale.len(), 1);
    let json = other.to_json();
    let undecided = json["checks"].as_array().unwrap().iter().find(|c| c["id"] == "demo.undecided").unwrap();
    assert!(undecided["baselined"].is_null(), "{undecided}");
    // An entry for a check that did not run is stale too.
    let absent = report(Verdict::Fail, Verdict::Pass, &REAL_FAIL.replace("demo.failing", "demo.absent"));
    assert_eq!(absent.stale.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["demo.absent"]);
}

#[test]
fn an_entry_without_its_judgement_or_evidence_is_refused_with_a_clear_error() {
    let no_judgement = "[[accepted]]\nid = \"demo.failing\"\nreason = \"no auth\"\n";
    let error = refused(no_judgement);
    assert!(error.contains("entry 1 (demo.failing) has no judgement"), "{error}");
    assert!(error.contains("judgement = \"real\" or \"false positive\""), "{error}");

    let no_evidence = REAL_FAIL.replace("evidence = \"a request with no token was served 200\"\n", "");
    assert!(refused(&no_evidence).contains("entry 1 (demo.failing) has no evidence"), "{}", refused(&no_evidence));
    let no_breaks = REAL_FAIL.replace("breaks = \"authorization spec 2.6\"\n", "");
    assert!(refused(&no_breaks).contains("has no breaks (the spec clause or seed control"), "{}", refused(&no_breaks));
    // An INCONCLUSIVE or a false positive breaks nothing: no `breaks` needed.
    assert!(Baseline::parse(REAL_INCONCLUSIVE).is_ok());
    let false_positive = no_breaks.replace("\"real\"", "\"false positive\"");
    assert_eq!(Baseline::parse(&false_positive).unwrap().accepted[0].judgement, Some(Judgement::FalsePositive));

    let blank_reason = REAL_FAIL.replace("reason = \"no auth\"", "reason = \"  \"");
    assert!(refused(&blank_reason).contains("entry 1 (demo.failing) has no reason"), "{}", refused(&blank_reason));
    let second = format!("{REAL_INCONCLUSIVE}\n{}", no_judgement.replace("demo.failing", "demo.other"));
    assert!(refused(&second).contains("entry 2 (demo.other) has no judgement"), "{}", refused(&second));
}

#[test]
fn a_wrong_value_an_unknown_field_or_a_repeated_check_is_refused() {
    let judged_maybe = REAL_FAIL.replace("\"real\"", "\"maybe\"");
    let error = refused(&judged_maybe);
    assert!(error.contains("maybe") && error.contains("real") && error.contains("false positive"), "{error}");
    let warning = REAL_FAIL.replace("judgement", "verdict = \"warning\"\njudgement");
    let error = refused(&warning);
    assert!(error.contains("only a fail or an inconclusive can be accepted"), "{error}");
    let typo = REAL_FAIL.replace("evidence", "evidense");
    assert!(refused(&typo).contains("evidense"), "{}", refused(&typo));
    let twice = format!("{REAL_FAIL}\n{REAL_FAIL}");
    assert!(refused(&twice).contains("entry 2 (demo.failing): the check is accepted twice"), "{}", refused(&twice));
}
