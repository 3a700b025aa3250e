//! Unit tests of the listen module's readings of acknowledgements, notifications and refusals.

use super::*;

fn exchange(id: Value, frames: Vec<Value>, status: u16) -> Exchange {
    Exchange::answered(id, status, frames)
}

fn ack_frame(id: Value, honoured: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": ACKNOWLEDGED,
        "params": { "notifications": honoured, "_meta": { "io.modelcontextprotocol/subscriptionId": id } } })
}

#[test]
fn the_acknowledgement_must_be_first_and_carry_the_exact_id() {
    assert!(ack(&exchange(json!(7), vec![ack_frame(json!(7), json!({}))], 200)).is_some());
    // The id keeps its type: "7" is not 7.
    assert!(ack(&exchange(json!(7), vec![ack_frame(json!("7"), json!({}))], 200)).is_none());
    let late = vec![json!({ "method": "notifications/tasks", "params": {} }), ack_frame(json!(7), json!({}))];
    assert!(ack(&exchange(json!(7), late.clone(), 200)).is_none());
    assert!(any_ack(&exchange(json!(7), late, 200)));
}

#[test]
fn ignored_filters_pass_and_honoured_forgeries_are_served() {
    let ignored = exchange(json!(1), vec![ack_frame(json!(1), json!({ "toolsListChanged": true }))], 200);
    assert_eq!(judge_ignored(&ignored, "bogus", asks), Judgement::Refused);
    let honoured = exchange(json!(1), vec![ack_frame(json!(1), json!({ "bogus": true }))], 200);
    assert!(matches!(judge_ignored(&honoured, "bogus", asks), Judgement::Accepted(_)));
    let refused = exchange(json!(1), vec![json!({ "jsonrpc": "2.0", "id": 1, "error": { "code": -32602 } })], 400);
    assert_eq!(judge(&refused, &[], Some(-32602)), Judgement::Refused);
    assert!(matches!(judge(&refused, &[401], None), Judgement::RefusedOddly(_)));
    assert!(matches!(judge(&honoured, &[], None), Judgement::Accepted(_)));
}

#[test]
fn elicitations_are_accepted_with_a_value_per_property() {
    let schema = json!({ "properties": { "confirm": { "type": "boolean" }, "n": { "type": "integer", "minimum": 3 },
        "pick": { "type": "string", "enum": ["a", "b"] } } });
    assert_eq!(fill(&schema), json!({ "confirm": true, "n": 3, "pick": "a" }));
}
