//! The scope index and the listing classes against Cedar on the whole set: over policy sets drawn
//! from every scope form the index reads (and conditions that name a tool or read its name),
//! every decision and every listing answer must equal the unindexed one.

use serde_json::{Map, json};

use super::index::IndexedSet;
use super::view::ViewLimits;
use super::{Policies, PolicyRequest, PolicySource, PrincipalView, listing_set};
use crate::method::{Method, Origin};
use crate::registry::App;
use crate::{CallToolResult, Outcome, ToolDef};

/// Three upstreams and local tools, with annotations that vary.
fn registry() -> App {
    let mut builder = App::builder("index-test", "0").dynamic();
    for n in 0..24 {
        let mut definition = Map::new();
        definition
            .insert("inputSchema".into(), json!({ "type": "object", "properties": { "path": { "type": "string" } } }));
        definition.insert(
            "annotations".into(),
            json!({ "readOnlyHint": n % 3 == 0, "destructiveHint": n % 4 == 1, "openWorldHint": n % 5 == 0 }),
        );
        let name = match n % 4 {
            0 => format!("read_{n}"),
            1 => format!("write_{n}"),
            2 => format!("list_{n}"),
            _ => format!("other_{n}"),
        };
        let handler = |_, _| async { Ok(Outcome::Complete(CallToolResult::text("ok"))) };
        builder = if n % 6 == 5 {
            builder.tool(ToolDef::new(name).annotations(definition["annotations"].clone()).handler(handler))
        } else {
            let origin =
                Origin { upstream: format!("u{}", n % 3), pin: format!("pin{n}"), audit_detail: String::new() };
            builder.tool(ToolDef::relayed(name, definition, origin).handler(handler))
        };
    }
    builder.build().expect("the test registry builds")
}

/// Policies of every scope form and of conditions the classes must respect.
const POLICIES: &[&str] = &[
    r#"permit (principal, action, resource);"#,
    r#"permit (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"read_0");"#,
    r#"permit (principal, action == Palisade::Action::"tools/call", resource in Palisade::Upstream::"u1");"#,
    r#"permit (principal, action in [Palisade::Action::"tools/call", Palisade::Action::"prompts/get"], resource is Palisade::Tool in Palisade::Upstream::"u2");"#,
    r#"permit (principal, action, resource is Palisade::Tool) when { resource.readOnly };"#,
    r#"permit (principal in Palisade::Group::"ops", action == Palisade::Action::"tools/call", resource);"#,
    r#"permit (principal, action == Palisade::Action::"tools/call", resource) when { resource.name like "list_*" };"#,
    r#"permit (principal, action == Palisade::Action::"tools/call", resource) when { context.arguments has path && context.arguments.path like "/srv/*" };"#,
    r#"forbid (principal, action == Palisade::Action::"tools/call", resource in Palisade::Upstream::"u0") when { resource.destructive };"#,
    r#"forbid (principal, action, resource) when { resource == Palisade::Tool::"list_2" };"#,
    r#"forbid (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"other_7") unless { principal.tenant == "t1" };"#,
    r#"forbid (principal, action == Palisade::Action::"resources/read", resource);"#,
    r#"forbid (principal, action, resource is Palisade::Tool) when { resource.pin == "pin13" };"#,
    r#"forbid (principal, action == Palisade::Action::"tools/call", resource) when { context.arguments has path && context.arguments.path like "*..*" };"#,
    r#"permit (principal, action == Palisade::Action::"tools/call", resource) when { resource.openWorld && principal.tenant == "t2" };"#,
];

fn principal(groups: &[&str], tenant: &str) -> PrincipalView {
    PrincipalView {
        issuer: "https://issuer.example".into(),
        subject: "alice".into(),
        tenant: tenant.into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..PrincipalView::default()
    }
}

/// A deterministic walk over subsets of [`POLICIES`].
fn subsets() -> Vec<Vec<usize>> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut out: Vec<Vec<usize>> = (0..POLICIES.len()).map(|n| vec![n]).collect();
    for _ in 0..60 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push((0..POLICIES.len()).filter(|n| state >> n & 1 == 1).collect());
    }
    out
}

#[test]
fn the_index_and_the_listing_classes_decide_as_the_whole_set_does() {
    let app = registry();
    let names: Vec<String> = app.tools.iter().map(|t| t.name.clone()).collect();
    let principals = [principal(&[], "t1"), principal(&["ops"], "t2"), principal(&["dev"], "t3")];
    let with_path = json!({ "path": "/srv/a" });
    let traversal = json!({ "path": "/srv/../etc" });
    let (mut allowed, mut refused, mut listed) = (0, 0, 0);
    for subset in subsets() {
        let text: String = subset.iter().map(|n| format!("@id(\"p{n}\") {}\n", POLICIES[*n])).collect();
        let source = PolicySource { name: "test.cedar".into(), text };
        let policies = Policies::load(&[source], ViewLimits::default(), &app).expect("the subset validates");
        let whole = IndexedSet::unsliced(policies.set.set.clone());
        let whole_listing = IndexedSet::unsliced(listing_set(&policies.set.set));
        for view in &principals {
            let base = PolicyRequest {
                principal: view.clone(),
                method: Method::ToolsCall,
                target: None,
                arguments: None,
                era: "2026-07-28",
                source: None,
                now_ms: 1_800_000_000_000,
            };
            let mut listing = policies.listing(&app, &base);
            let entity = policies.principal(view).expect("the principal builds");
            for name in &names {
                for arguments in [None, with_path.as_object(), traversal.as_object()] {
                    let request = PolicyRequest { target: Some(name), arguments, ..base.clone() };
                    let target = policies.target(&app, request.method, request.target).expect("a registered tool");
                    let context = policies.context(&request).expect("in bounds").expect("builds");
                    let reference = policies.authorize(&whole, request.method, &entity, &target, context);
                    let verdict = policies.decide(&app, &request);
                    assert_eq!(verdict, reference, "{subset:?} {name} {arguments:?} {view:?}");
                    if verdict.allowed {
                        allowed += 1;
                    } else {
                        refused += 1;
                    }
                }
                let request = PolicyRequest { target: Some(name), ..base.clone() };
                let target = policies.target(&app, request.method, request.target).expect("a registered tool");
                let context = policies.context(&request).expect("in bounds").expect("builds");
                let reference = policies.authorize(&whole_listing, request.method, &entity, &target, context).allowed;
                assert_eq!(listing.visible(name), reference, "listing {subset:?} {name} {view:?}");
                assert_eq!(policies.visible(&app, &request), reference, "visible {subset:?} {name} {view:?}");
                listed += usize::from(reference);
            }
        }
    }
    // The walk reaches both outcomes often (a walk that only ever refused would prove nothing).
    assert!(allowed > 1_000 && refused > 1_000 && listed > 500, "{allowed} {refused} {listed}");
}

#[test]
fn a_listing_decides_once_per_class() {
    let app = registry();
    let text = r#"@id("ops") permit (principal in Palisade::Group::"ops", action == Palisade::Action::"tools/call", resource in Palisade::Upstream::"u1");
@id("named") permit (principal, action == Palisade::Action::"tools/call", resource == Palisade::Tool::"read_0");"#;
    let source = PolicySource { name: "classes.cedar".into(), text: text.into() };
    let policies = Policies::load(&[source], ViewLimits::default(), &app).expect("validates");
    let request = PolicyRequest {
        principal: principal(&["ops"], "t1"),
        method: Method::ToolsCall,
        target: None,
        arguments: None,
        era: "2026-07-28",
        source: None,
        now_ms: 0,
    };
    let mut listing = policies.listing(&app, &request);
    let visible: Vec<&str> = app.tools.iter().map(|t| t.name.as_str()).filter(|name| listing.visible(name)).collect();
    assert!(visible.contains(&"read_0"), "{visible:?}");
    assert!(
        visible.iter().all(|name| *name == "read_0"
            || app.tool(name).and_then(|t| t.origin.as_ref()).is_some_and(|o| o.upstream == "u1"))
    );
    // 24 tools; classes: read_0 (named) and the others by upstream and annotations alone.
    assert!(listing.classes.len() < 16, "{} classes", listing.classes.len());
    // No policy reads `name`, `uri` or `pin`: they are not part of a class.
    assert!(
        listing
            .classes
            .keys()
            .all(|(_, _, attrs)| attrs.iter().all(|(name, _)| !matches!(*name, "name" | "pin" | "uri")))
    );
}
