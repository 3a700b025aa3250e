//! The demo shop (v1): a read-only catalogue, the shop's policies as resources and one prompt,
//! every one of them behind a scope, on Palisade's public library API. Baskets, checkout and the
//! long-running export arrive with the handle, kill-switch and task controls.

use palisade_server::{
    App, CallToolResult, Content, Effect, GetPromptResult, Outcome, PromptArgument, PromptDef, PromptMessage,
    ProtocolError, ResourceContents, ResourceDef, ToolDef,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// Arguments of `product_get`; its input schema is generated from this type.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProductGet {
    /// Stock-keeping unit, e.g. `TEA-001`.
    sku: String,
}

/// Scope for reading the catalogue, policies and prompt.
pub const SCOPE_READ: &str = "shop:read";

/// Every scope the demo understands (published in the protected-resource metadata).
pub const SCOPES: &[&str] = &[SCOPE_READ];

struct Product {
    sku: &'static str,
    name: &'static str,
    price_cents: u64,
    stock: u32,
}

const CATALOGUE: &[Product] = &[
    Product { sku: "TEA-001", name: "Green tea, 100 g", price_cents: 650, stock: 40 },
    Product { sku: "TEA-002", name: "Black tea, 250 g", price_cents: 900, stock: 12 },
    Product { sku: "MUG-001", name: "Stoneware mug", price_cents: 1450, stock: 7 },
    Product { sku: "POT-001", name: "Cast-iron teapot", price_cents: 4900, stock: 3 },
    Product { sku: "INF-001", name: "Steel infuser", price_cents: 390, stock: 55 },
];

fn product_json(product: &Product) -> Value {
    json!({ "sku": product.sku, "name": product.name, "priceCents": product.price_cents, "stock": product.stock })
}

const RETURNS_POLICY: &str = "Returns: unopened items may be returned within 30 days of delivery for a full refund. \
Opened tea cannot be returned. Refunds go to the original payment method within 5 business days.";
const PRIVACY_POLICY: &str = "Privacy: the shop stores your basket and orders under your account and tenant only. \
Tokens and basket handles are never logged; audit records hold keyed digests.";

type ToolResult = Result<Outcome<CallToolResult>, ProtocolError>;

/// The demo application.
pub fn app() -> App {
    App::builder("palisade-demo-shop", env!("CARGO_PKG_VERSION"))
        .instructions("A small tea shop. Search the catalogue, look up products, read the shop's policies.")
        .tool(
            ToolDef::new("catalog_search")
                .title("Search the catalogue")
                .description("Lists products whose name contains the query (case-insensitive); all products without one")
                .input_schema(json!({ "type": "object", "properties": {
                    "query": { "type": "string", "maxLength": 100 } }, "additionalProperties": false }))
                .effect(Effect::ReadOnly)
                .scopes(&[SCOPE_READ])
                .handler(|_, args| async move {
                    let query = args.get("query").and_then(Value::as_str).unwrap_or_default().to_lowercase();
                    let hits: Vec<Value> = CATALOGUE
                        .iter()
                        .filter(|p| p.name.to_lowercase().contains(&query))
                        .map(product_json)
                        .collect();
                    let result: ToolResult = Ok(Outcome::Complete(CallToolResult::structured(json!({ "products": hits }))));
                    result
                }),
        )
        .tool(
            ToolDef::new("product_get")
                .title("Get a product")
                .description("Returns one product by SKU")
                .output_schema(json!({ "type": "object", "properties": {
                    "sku": { "type": "string" }, "name": { "type": "string" },
                    "priceCents": { "type": "integer" }, "stock": { "type": "integer" } },
                    "required": ["sku", "name", "priceCents", "stock"] }))
                .effect(Effect::ReadOnly)
                .scopes(&[SCOPE_READ])
                .typed_handler(|_, args: ProductGet| async move {
                    let result = match CATALOGUE.iter().find(|p| p.sku == args.sku) {
                        Some(product) => CallToolResult::structured(product_json(product)),
                        None => CallToolResult::error(format!("no product with SKU {}", args.sku)),
                    };
                    let result: ToolResult = Ok(Outcome::Complete(result));
                    result
                }),
        )
        .resource(
            ResourceDef::new("shop://policies/returns", "returns-policy")
                .description("The shop's returns policy")
                .mime_type("text/plain")
                .ttl_ms(300_000)
                .scopes(&[SCOPE_READ])
                .reader(|_, uri| async move { Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", RETURNS_POLICY)])) }),
        )
        .resource(
            ResourceDef::new("shop://policies/privacy", "privacy-policy")
                .description("The shop's privacy policy")
                .mime_type("text/plain")
                .ttl_ms(300_000)
                .scopes(&[SCOPE_READ])
                .reader(|_, uri| async move { Ok(Outcome::Complete(vec![ResourceContents::text(uri, "text/plain", PRIVACY_POLICY)])) }),
        )
        .prompt(
            PromptDef::new("shop_assistant")
                .description("Helps a customer find a product for a goal")
                .argument(PromptArgument::new("goal").description("What the customer wants to do").required())
                .scopes(&[SCOPE_READ])
                .handler(|_, args| async move {
                    let goal = args.get("goal").cloned().unwrap_or_default();
                    Ok(Outcome::Complete(GetPromptResult {
                        description: Some("Shop assistant".into()),
                        messages: vec![PromptMessage::user(Content::text(format!(
                            "You are the tea shop's assistant. Use catalog_search and product_get to help with: {goal}. \
                             Quote prices in euros and mention the returns policy when relevant."
                        )))],
                    }))
                }),
        )
        .build()
        .expect("the demo shop's definitions are valid")
}
