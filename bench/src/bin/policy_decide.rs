//! Operator policy cost: CPU per decision of the policy stage (`Policies::decide`, entities,
//! context and the argument view built per call, as the stage builds them) with 10, 200 and
//! 1,000 policies, and the cost of filtering a 1,000-tool `tools/list` for one caller under 200
//! policies as dispatch does it (`Policies::listing`). Without
//! policies the stage returns before building anything, so the figures are the added cost.
//!
//! ```text
//! policy-decide [--iterations 20000] [--sizes 10,200,1000]
//! ```
//!
//! One JSON line per measurement on stdout.

// The allocator the palisade binary ships with, so the library is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::time::Instant;

use clap::Parser;
use palisade_server::method::{Method, Origin};
use palisade_server::policy::view::ViewLimits;
use palisade_server::policy::{Policies, PolicyRequest, PolicySource, PrincipalView};
use palisade_server::{App, CallToolResult, Outcome, ToolDef};
use serde_json::{Map, json};

#[derive(Parser)]
struct Args {
    /// Decisions measured per policy-set size.
    #[arg(long, default_value_t = 20_000)]
    iterations: u32,
    /// The policy-set sizes measured (the list filter is measured at 200).
    #[arg(long, value_delimiter = ',', default_values_t = [10, 200, 1_000])]
    sizes: Vec<usize>,
}

/// A gateway-like registry: `tools` tools over 10 upstreams, each taking a `path`.
fn registry(tools: usize) -> App {
    let mut builder = App::builder("bench", "0").dynamic();
    for n in 0..tools {
        let upstream = format!("up{}", n % 10);
        let mut definition = Map::new();
        definition.insert(
            "inputSchema".into(),
            json!({ "type": "object", "properties": {
            "path": { "type": "string" }, "content": { "type": "string" }, "recursive": { "type": "boolean" } } }),
        );
        definition.insert("annotations".into(), json!({ "readOnlyHint": n % 3 == 0 }));
        let name = format!("{upstream}__tool{n}");
        let origin = Origin { upstream: upstream.clone(), pin: String::new(), audit_detail: String::new() };
        let handler = |_, _| async { Ok(Outcome::Complete(CallToolResult::text("ok"))) };
        builder = builder.tool(ToolDef::relayed(name, definition, origin).handler(handler));
    }
    builder.build().expect("the bench registry builds")
}

/// `count` policies of the shapes operators write: per-group permits on upstreams, per-tenant
/// path prefixes, forbids on destructive tools and on path traversal.
fn policies(count: usize, tools: usize) -> String {
    let mut text = String::new();
    for n in 0..count {
        let policy = match n % 4 {
            0 => format!(
                "@id(\"p{n}\") permit (principal in Palisade::Group::\"team{}\", action == Palisade::Action::\"tools/call\", resource in Palisade::Upstream::\"up{}\");\n",
                n % 50,
                n % 10
            ),
            1 => format!(
                "@id(\"p{n}\") permit (principal, action == Palisade::Action::\"tools/call\", resource == Palisade::Tool::\"up{}__tool{}\") when {{ principal.tenant == \"tenant{}\" && context.arguments has path && context.arguments.path like \"/srv/tenant{}/*\" }};\n",
                (n % tools) % 10,
                n % tools,
                n % 20,
                n % 20
            ),
            2 => format!(
                "@id(\"p{n}\") forbid (principal, action == Palisade::Action::\"tools/call\", resource in Palisade::Upstream::\"up{}\") when {{ resource.destructive && !resource.confirmation && principal.subject == \"user{n}\" }};\n",
                n % 10
            ),
            _ => format!(
                "@id(\"p{n}\") forbid (principal, action == Palisade::Action::\"tools/call\", resource) when {{ context.arguments has path && context.arguments.path like \"*../secret{n}*\" }};\n"
            ),
        };
        text.push_str(&policy);
    }
    text
}

fn principal() -> PrincipalView {
    PrincipalView {
        issuer: "https://issuer.example".into(),
        subject: "alice".into(),
        tenant: "tenant3".into(),
        client: "cli".into(),
        scopes: vec!["files:read".into()],
        groups: vec!["team0".into(), "team7".into()],
        ..PrincipalView::default()
    }
}

#[allow(clippy::print_stdout)]
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tools = 1_000;
    let app = registry(tools);
    let arguments = json!({ "path": "/srv/tenant3/notes.txt", "recursive": false });
    let arguments = arguments.as_object().cloned().unwrap_or_default();
    for count in args.sizes.iter().copied() {
        let source = PolicySource { name: format!("bench-{count}.cedar"), text: policies(count, tools) };
        let set = Policies::load(&[source], ViewLimits::default(), &app).map_err(|e| anyhow::anyhow!("{e}"))?;
        let request = |target: &'static str| PolicyRequest {
            principal: principal(),
            method: Method::ToolsCall,
            target: Some(target),
            arguments: Some(&arguments),
            era: "2026-07-28",
            source: None,
            now_ms: 1_800_000_000_000,
        };
        let call = request("up3__tool13");
        let mut allowed = 0u32;
        for _ in 0..1_000 {
            allowed += u32::from(set.decide(&app, &call).allowed);
        }
        let started = Instant::now();
        for _ in 0..args.iterations {
            allowed += u32::from(set.decide(&app, &call).allowed);
        }
        let per_call = started.elapsed().as_nanos() as f64 / f64::from(args.iterations);
        println!(
            "{}",
            json!({ "measure": "decide", "policies": count, "ns_per_call": per_call.round(), "allowed": allowed })
        );
        if count == 200 {
            // One caller's view of a 1,000-tool list, as dispatch filters it: one listing (the
            // principal and context built once, one decision per class of tools).
            let names: Vec<String> = (0..tools).map(|n| format!("up{}__tool{n}", n % 10)).collect();
            let started = Instant::now();
            let rounds = 200u32;
            let mut visible = 0usize;
            for _ in 0..rounds {
                let mut listing = set.listing(&app, &call);
                visible += names.iter().filter(|name| listing.visible(name)).count();
            }
            let per_list = started.elapsed().as_micros() as f64 / f64::from(rounds);
            println!(
                "{}",
                json!({ "measure": "list_filter", "tools": tools, "policies": count,
                "us_per_list": per_list.round(), "visible": visible / rounds as usize })
            );
        }
    }
    Ok(())
}
