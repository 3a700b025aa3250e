//! The delegation rules' tests: patterns and grants only narrow, every list and entry is
//! checked, an approval fits one call of one holder.

use std::collections::BTreeSet;

use super::*;

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

#[test]
fn patterns_only_narrow() {
    let parent = Grant { tools: set(&["read_*", "summarize"]), ..Grant::default() };
    for within in [&["read_policy"][..], &["read_p*"], &["read_*"], &["summarize"], &[]] {
        let child = Grant { tools: set(within), ..Grant::default() };
        assert_eq!(child.widens(&parent), None, "{within:?}");
    }
    for wider in [&["export"][..], &["read*"], &["*"], &["summarize*"], &["read_policy", "export"]] {
        let child = Grant { tools: set(wider), ..Grant::default() };
        assert!(child.widens(&parent).is_some(), "{wider:?}");
    }
    assert!(parent.allows_tool("read_policy") && !parent.allows_tool("reader") && !parent.allows_tool("export"));
}

#[test]
fn every_list_is_checked() {
    let parent = Grant {
        tools: set(&["a"]),
        resources: set(&["doc://north/*"]),
        prompts: set(&["p"]),
        scopes: set(&["read"]),
        handles: set(&["00"]),
        tool_calls: [("a".to_owned(), 2)].into(),
    };
    let widen: [fn(&mut Grant); 6] = [
        |g| {
            g.tool_calls.clear();
        },
        |g| {
            g.tools.insert("b".into());
        },
        |g| {
            g.resources.insert("doc://south/1".into());
        },
        |g| {
            g.prompts.insert("q".into());
        },
        |g| {
            g.scopes.insert("write".into());
        },
        |g| {
            g.handles.insert("11".into());
        },
    ];
    for step in widen {
        let mut child = parent.clone();
        step(&mut child);
        assert!(child.widens(&parent).is_some(), "{child:?}");
    }
    assert_eq!(parent.widens(&parent), None);
}

#[test]
fn entries_and_references_are_strict() {
    assert!(check_entry("read_*") && check_entry("read"));
    assert!(!check_entry("re*ad") && !check_entry("**") && !check_entry("") && !check_entry("a\nb"));
    let mut raw = [0xab_u8; 32];
    raw[0] = 1;
    let reference = format!("{REFERENCE_PREFIX}{}", URL_SAFE_NO_PAD.encode(raw));
    assert!(parse_reference(&reference).is_some());
    assert!(parse_reference(&reference[1..]).is_none());
    assert!(parse_reference(&format!("{reference}A")).is_none());
    assert_eq!(parse_id(&hex(&raw)), Some(raw));
    assert_eq!(parse_id(&hex(&raw).to_uppercase()), None);
}

#[test]
fn an_approval_fits_one_call_of_one_holder() {
    let holder = Holder { issuer: "i".into(), subject: "h".into(), client: "c".into() };
    let args = |value: Value| value.as_object().cloned().unwrap();
    let key = approval_key(&[1; 32], "export", &args(json!({ "a": 1, "b": [2] })), &holder);
    // Key order does not matter (RFC 8785); anything else does.
    assert_eq!(key, approval_key(&[1; 32], "export", &args(json!({ "b": [2], "a": 1 })), &holder));
    assert_ne!(key, approval_key(&[2; 32], "export", &args(json!({ "a": 1, "b": [2] })), &holder));
    assert_ne!(key, approval_key(&[1; 32], "exports", &args(json!({ "a": 1, "b": [2] })), &holder));
    assert_ne!(key, approval_key(&[1; 32], "export", &args(json!({ "a": 2, "b": [2] })), &holder));
    let other = Holder { subject: "g".into(), ..holder.clone() };
    assert_ne!(key, approval_key(&[1; 32], "export", &args(json!({ "a": 1, "b": [2] })), &other));
}
