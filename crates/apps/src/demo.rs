//! The demo shop: a catalogue, the shop's policies as resources, one prompt, and baskets held
//! across calls by explicit handles (no sessions), every one of them behind a scope, on
//! Palisade's public library API. `orders_export` (your baskets, after a confirmation) runs as a
//! durable task with its progress in the task's status message.
//!
//! `basket_checkout` is the commit-fence contract of the kill switch: it prepares (validates the
//! basket), asks for the commit fence (`pre_side_effect`), then in one SQLite transaction on the
//! database it shares with the disable authority redeems every fence token and inserts the
//! order; a DISABLE committed before that transaction makes the redemption, and so the order,
//! fail. Orders need that database ([`Orders`]); without it checkout answers "unavailable".
//!
//! Baskets live in the store the server is configured with ([`BasketStore`], in `baskets`: the
//! table `demo_baskets` in SQLite or PostgreSQL, through the demo's own pool), keyed by tenant
//! and basket id; their handles live in Palisade's store. So every instance sharing the store
//! sees every basket, and a basket outlives a restart as long as its handle does. Every change is
//! one statement or one transaction; when the store cannot be used the call is refused
//! ("temporarily unavailable") and nothing is written. [`app`] keeps its baskets in a private
//! in-memory SQLite database, for callers that configure no store.

mod baskets;

use std::collections::BTreeMap;
use std::sync::Arc;

use palisade_killswitch::CommitFence;
use palisade_killswitch::authority::{RedeemError, redeem_commit_token};
use palisade_server::{
    App, CallToolResult, Content, Effect, GetPromptResult, HandleError, HandleObject, HandlePolicy, HandleType,
    InputRequired, Outcome, PromptArgument, PromptDef, PromptMessage, ProtocolError, RequestContext, ResourceContents,
    ResourceDef, TaskSupport, ToolDef,
};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::SqlitePool;

use baskets::Basket;
pub use baskets::BasketStore;

/// Arguments of `product_get`; its input schema is generated from this type.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProductGet {
    /// Stock-keeping unit, e.g. `TEA-001`.
    sku: String,
}

/// Arguments of `basket_add_item` besides the basket handle.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddItem {
    /// Stock-keeping unit, e.g. `TEA-001`.
    sku: String,
    /// How many to add (1–99).
    #[schemars(range(min = 1, max = 99))]
    quantity: u32,
}

/// Scope for reading the catalogue, policies and prompt.
pub const SCOPE_READ: &str = "shop:read";
/// Scope for creating and using baskets.
pub const SCOPE_BASKET: &str = "shop:basket";

/// Every scope the demo understands (published in the protected-resource metadata).
pub const SCOPES: &[&str] = &[SCOPE_READ, SCOPE_BASKET];

/// The object type of basket handles.
pub const BASKET: &str = "basket";

/// A store failure: logged, and the call refused (fail closed).
fn unavailable(error: sqlx::Error) -> ProtocolError {
    tracing::error!(%error, "basket store unavailable");
    ProtocolError::Unavailable
}

/// The items of the basket behind the call's resolved handle, as the loader read them.
fn resolved_items(ctx: &RequestContext) -> Result<BTreeMap<String, u32>, ProtocolError> {
    let handle = ctx.handle("basket").ok_or(ProtocolError::Internal)?;
    serde_json::from_value(handle.object["items"].clone()).map_err(|_| ProtocolError::Internal)
}

fn owner_of(ctx_principal: &palisade_server::auth::VerifiedPrincipal) -> String {
    format!("{}#{}", ctx_principal.issuer(), ctx_principal.subject())
}

fn basket_json(items: &BTreeMap<String, u32>) -> Value {
    let mut total = 0u64;
    let items: Vec<Value> = items
        .iter()
        .map(|(sku, quantity)| {
            let price = CATALOGUE.iter().find(|p| p.sku == sku).map_or(0, |p| p.price_cents);
            total += price * u64::from(*quantity);
            json!({ "sku": sku, "quantity": quantity, "priceCents": price })
        })
        .collect();
    json!({ "items": items, "totalCents": total })
}

fn basket_type(baskets: BasketStore) -> HandleType {
    HandleType::new(
        BASKET,
        move |tenant: String, basket_id: String| {
            let baskets = baskets.clone();
            async move {
                let basket = baskets.get(&tenant, &basket_id).await.map_err(|error| {
                    tracing::error!(%error, "basket store unavailable");
                    HandleError::Unavailable
                })?;
                // The items travel with the object, so the checkout's confirmation (synchronous)
                // and `basket_view` show what this resolution read.
                Ok(basket.map(|basket| HandleObject {
                    object_ref: basket_id,
                    version: basket.generation.to_string(),
                    value: json!({ "owner": basket.owner, "client": basket.client, "items": basket.items }),
                }))
            }
        },
        // The application's own object check, at mint and on every use: only the basket's owner,
        // through the client that created it.
        |principal, object, _scope, _phase| async move {
            object.value["owner"] == json!(owner_of(&principal))
                && object.value["client"].as_str() == principal.client_id()
        },
    )
    .default_policy(HandlePolicy {
        ttl: std::time::Duration::from_secs(2 * 3600),
        allowed_scopes: vec![SCOPE_BASKET.into()],
        max_scopes: 1,
        version: 1,
    })
}

/// `orders_export`: asks for confirmation (the task waits in `input_required`), then exports the
/// caller's baskets one by one, reporting progress in the task's status message.
async fn export_baskets(ctx: &RequestContext, baskets: &BasketStore) -> ToolResult {
    match ctx.input_response("confirm") {
        None => {
            let schema = json!({ "type": "object", "properties": { "confirm": { "type": "boolean" } }, "required": ["confirm"] });
            return Ok(Outcome::InputRequired(InputRequired::new().elicit(
                "confirm",
                "Export all your baskets in this tenant?",
                schema,
            )));
        }
        Some(answer) if answer["action"] != "accept" || answer["content"]["confirm"] != true => {
            return Ok(Outcome::Complete(CallToolResult::error("the export was not confirmed")));
        }
        Some(_) => {}
    }
    let tenant = tenant_of(ctx)?;
    let owner = owner_of(ctx.principal());
    let client = ctx.principal().client_id().unwrap_or_default();
    // The owner rule of the basket handles: the same user, through the client that made it.
    let mine: Vec<Value> =
        baskets.items_of(&tenant, &owner, client).await.map_err(unavailable)?.iter().map(basket_json).collect();
    let total = mine.len();
    for done in 0..=total {
        ctx.set_task_status(&format!("exported {done} of {total} baskets")).await;
        if done < total {
            tokio::select! {
                () = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                () = ctx.cancellation().cancelled() => return Err(ProtocolError::Internal),
            }
        }
    }
    Ok(Outcome::Complete(CallToolResult::structured(json!({ "baskets": mine, "count": total }))))
}

fn tenant_of(ctx: &RequestContext) -> Result<String, ProtocolError> {
    ctx.principal()
        .tenant()
        .map(str::to_owned)
        .ok_or_else(|| ProtocolError::invalid_params("baskets need a caller with a tenant"))
}

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

/// Runs between the commit fence and the order transaction (tests widen that window with it).
pub type CommitHook = Arc<dyn Fn() -> palisade_server::BoxFuture<()> + Send + Sync>;

/// Where checkout records orders: a SQLite database shared with the disable authority, so the
/// fence tokens are redeemed in the same transaction as the order insert.
#[derive(Clone)]
pub struct Orders {
    pool: SqlitePool,
    before_commit: Option<CommitHook>,
}

impl std::fmt::Debug for Orders {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Orders").finish_non_exhaustive()
    }
}

impl Orders {
    /// Uses `pool` (the authority's database), creating the `orders` table if missing.
    pub async fn open(pool: SqlitePool) -> Result<Self, sqlx::Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                owner TEXT NOT NULL,
                basket TEXT NOT NULL,
                items TEXT NOT NULL,
                total_cents INTEGER NOT NULL,
                created_ms INTEGER NOT NULL
            )",
        )
        .execute(&pool)
        .await?;
        Ok(Self { pool, before_commit: None })
    }

    /// Runs `hook` after the commit fence is obtained and before the order transaction.
    pub fn before_commit(mut self, hook: CommitHook) -> Self {
        self.before_commit = Some(hook);
        self
    }

    /// How many orders are recorded.
    pub async fn count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM orders").fetch_one(&self.pool).await
    }

    /// Redeems every fence token and inserts the order, in one transaction; nothing is written
    /// unless every token redeems.
    async fn commit(&self, fence: &CommitFence, order: &PlacedOrder) -> Result<(), ProtocolError> {
        let now_ms = palisade_base::clock::Clock::now_ms(&palisade_base::clock::SystemClock);
        let storage = |error: sqlx::Error| {
            tracing::error!(%error, "order database unavailable");
            ProtocolError::Unavailable
        };
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(storage)?;
        for request in fence.redeem_requests() {
            match redeem_commit_token(&mut transaction, &request, now_ms).await {
                Ok(()) => {}
                Err(RedeemError::Rejected(why)) => {
                    // Dropping the transaction rolls it back: no order.
                    tracing::info!(rejection = %why, "commit fence rejected: order not placed");
                    return Err(ProtocolError::OperationDisabled);
                }
                Err(RedeemError::Storage(error)) => return Err(storage(error)),
                Err(error) => {
                    tracing::error!(%error, "commit fence not redeemed: order not placed");
                    return Err(ProtocolError::Unavailable);
                }
            }
        }
        sqlx::query(
            "INSERT INTO orders (id, tenant, owner, basket, items, total_cents, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(&order.id)
        .bind(&order.tenant)
        .bind(&order.owner)
        .bind(&order.basket)
        .bind(order.items.to_string())
        .bind(i64::try_from(order.total_cents).unwrap_or(i64::MAX))
        .bind(now_ms)
        .execute(&mut *transaction)
        .await
        .map_err(storage)?;
        transaction.commit().await.map_err(storage)
    }
}

struct PlacedOrder {
    id: String,
    tenant: String,
    owner: String,
    basket: String,
    items: Value,
    total_cents: u64,
}

async fn checkout(ctx: RequestContext, baskets: BasketStore, orders: Option<Orders>) -> ToolResult {
    let Some(orders) = orders else {
        tracing::warn!("basket_checkout needs the order database shared with the disable authority");
        return Err(ProtocolError::Unavailable);
    };
    // Prepare: nothing changes yet.
    let tenant = tenant_of(&ctx)?;
    let handle = ctx.handle("basket").ok_or(ProtocolError::Internal)?;
    let basket_ref = handle.object_ref.clone();
    let basket = baskets.get(&tenant, &basket_ref).await.map_err(unavailable)?.ok_or(ProtocolError::Internal)?;
    let summary = basket_json(&basket.items);
    if summary["items"].as_array().is_none_or(Vec::is_empty) {
        return Ok(Outcome::Complete(CallToolResult::error("the basket is empty")));
    }
    let mut id = [0u8; 16];
    palisade_server::secret::fill_random(&mut id).map_err(|_| ProtocolError::Internal)?;
    let order = PlacedOrder {
        id: palisade_base::hex::hex(&id),
        tenant: tenant.clone(),
        owner: owner_of(ctx.principal()),
        basket: basket_ref.clone(),
        total_cents: summary["totalCents"].as_u64().unwrap_or(0),
        items: summary["items"].clone(),
    };
    // Second kill-switch phase, then the commit with the fence.
    let fence = ctx.pre_side_effect().await?;
    if let Some(hook) = &orders.before_commit {
        hook().await;
    }
    orders.commit(&fence, &order).await?;
    // The basket is consumed: its handle no longer resolves. The order is placed already, so a
    // store failure here is logged, not answered (the handle is revoked below all the same).
    if let Err(error) = baskets.remove(&tenant, &basket_ref).await {
        tracing::error!(%error, "basket not removed after checkout");
    }
    if let Err(error) = ctx.revoke_handle("basket", "checked out").await {
        tracing::warn!(%error, "basket handle not revoked after checkout");
    }
    Ok(Outcome::Complete(CallToolResult::structured(
        json!({ "order": order.id, "items": order.items, "totalCents": order.total_cents }),
    )))
}

/// The confirmation question of a checkout: every item with its quantity and price, and the
/// total the order will charge (the basket as this call's handle resolution read it).
fn checkout_summary(ctx: &RequestContext) -> Result<String, ProtocolError> {
    tenant_of(ctx)?;
    let summary = basket_json(&resolved_items(ctx)?);
    let items: Vec<String> = summary["items"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|item| {
            format!("{} x {} at {}", item["quantity"], item["sku"].as_str().unwrap_or("?"), euros(&item["priceCents"]))
        })
        .collect();
    let items = if items.is_empty() { "nothing".to_owned() } else { items.join(", ") };
    Ok(format!("Place an order for {items}; total {}.", euros(&summary["totalCents"])))
}

fn euros(cents: &Value) -> String {
    let cents = cents.as_u64().unwrap_or(0);
    format!("EUR {}.{:02}", cents / 100, cents % 100)
}

/// Before a basket change: the kill switch's second phase, when the server runs one. Baskets do
/// not live in the authority's database, so there is no transaction to redeem the fence in; the
/// check still refuses a change the authority disabled since dispatch.
async fn check_before_change(ctx: &RequestContext) -> Result<(), ProtocolError> {
    if ctx.has_kill_switch() {
        ctx.pre_side_effect().await?;
    }
    Ok(())
}

/// The demo application, without an order database (checkout answers "unavailable"), its
/// baskets in a private in-memory database ([`BasketStore::memory`]).
pub fn app() -> App {
    app_with_orders(None)
}

/// The demo application, recording orders in `orders`, its baskets in a private in-memory
/// database ([`BasketStore::memory`]).
pub fn app_with_orders(orders: Option<Orders>) -> App {
    app_with_store(BasketStore::memory(), orders)
}

/// The demo application, its baskets in `baskets` (the store every instance shares), recording
/// orders in `orders`.
pub fn app_with_store(baskets: BasketStore, orders: Option<Orders>) -> App {
    let (create, add, export, pay) = (baskets.clone(), baskets.clone(), baskets.clone(), baskets.clone());
    App::builder("palisade-demo-shop", env!("CARGO_PKG_VERSION"))
        .instructions(
            "A small tea shop. Search the catalogue, look up products, read the shop's policies. \
             basket_create returns a basket handle: pass it to basket_add_item and basket_view.",
        )
        .handle_type(basket_type(baskets))
        .tool(
            ToolDef::new("basket_create")
                .title("Create a basket")
                .description("Creates an empty basket and returns its handle (valid for 2 hours, only for you)")
                .output_schema(json!({ "type": "object", "properties": { "basket": { "type": "string" } },
                    "required": ["basket"] }))
                .effect(Effect::SideEffecting)
                .scopes(&[SCOPE_BASKET])
                .handler(move |ctx, _| {
                    let baskets = create.clone();
                    async move {
                        let tenant = tenant_of(&ctx)?;
                        let mut id = [0u8; 16];
                        palisade_server::secret::fill_random(&mut id).map_err(|_| ProtocolError::Internal)?;
                        let basket_id: String = palisade_base::hex::hex(&id);
                        check_before_change(&ctx).await?;
                        let basket = Basket {
                            owner: owner_of(ctx.principal()),
                            client: ctx.principal().client_id().unwrap_or_default().to_owned(),
                            generation: 1,
                            items: BTreeMap::new(),
                        };
                        baskets.insert(&tenant, &basket_id, &basket).await.map_err(unavailable)?;
                        match ctx.mint_handle(BASKET, &basket_id, "1", &[SCOPE_BASKET]).await {
                            Ok(handle) => Ok(Outcome::Complete(CallToolResult::structured(json!({ "basket": handle })))),
                            Err(error) => {
                                // No handle names it: the basket goes (a failure leaves an
                                // unreachable row, logged).
                                if let Err(error) = baskets.remove(&tenant, &basket_id).await {
                                    tracing::error!(%error, "basket without a handle not removed");
                                }
                                Err(error.into())
                            }
                        }
                    }
                }),
        )
        .tool(
            ToolDef::new("basket_add_item")
                .title("Add to a basket")
                .description("Adds a quantity of a product to the basket")
                .effect(Effect::SideEffecting)
                .scopes(&[SCOPE_BASKET])
                .handle_argument("basket", BASKET, SCOPE_BASKET)
                .typed_handler(move |ctx, args: AddItem| {
                    let baskets = add.clone();
                    async move {
                        if !CATALOGUE.iter().any(|p| p.sku == args.sku) {
                            return Ok(Outcome::Complete(CallToolResult::error(format!("no product with SKU {}", args.sku))));
                        }
                        let tenant = tenant_of(&ctx)?;
                        let handle = ctx.handle("basket").ok_or(ProtocolError::Internal)?;
                        check_before_change(&ctx).await?;
                        let items = baskets
                            .add_item(&tenant, &handle.object_ref, &args.sku, args.quantity)
                            .await
                            .map_err(unavailable)?
                            .ok_or(ProtocolError::Internal)?;
                        Ok(Outcome::Complete(CallToolResult::structured(basket_json(&items))))
                    }
                }),
        )
        .tool(
            ToolDef::new("basket_view")
                .title("View a basket")
                .description("Lists the basket's items and total")
                .effect(Effect::ReadOnly)
                .scopes(&[SCOPE_BASKET])
                .handle_argument("basket", BASKET, SCOPE_BASKET)
                // The basket as this call's handle resolution read it from the store.
                .handler(move |ctx, _| async move {
                    tenant_of(&ctx)?;
                    let items = resolved_items(&ctx)?;
                    Ok(Outcome::Complete(CallToolResult::structured(basket_json(&items))))
                }),
        )
        .tool(
            ToolDef::new("basket_checkout")
                .title("Check out a basket")
                .description("Places an order for the basket's items; the basket is consumed")
                .output_schema(json!({ "type": "object", "properties": {
                    "order": { "type": "string" }, "items": { "type": "array" },
                    "totalCents": { "type": "integer" } }, "required": ["order", "items", "totalCents"] }))
                .effect(Effect::SideEffecting)
                .scopes(&[SCOPE_BASKET])
                .handle_argument("basket", BASKET, SCOPE_BASKET)
                // A financial effect: the user confirms this basket's items and total first.
                .confirm_with(|ctx, _| checkout_summary(ctx))
                .handler(move |ctx, _| checkout(ctx, pay.clone(), orders.clone())),
        )
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
                .run(|_, args: ProductGet| async move {
                    match CATALOGUE.iter().find(|p| p.sku == args.sku) {
                        Some(product) => CallToolResult::structured(product_json(product)),
                        None => CallToolResult::error(format!("no product with SKU {}", args.sku)),
                    }
                }),
        )
        .tool(
            ToolDef::new("orders_export")
                .title("Export your baskets")
                .description(
                    "Exports every basket you hold in this tenant, after you confirm. Runs as a task: \
                     progress shows in tasks/get",
                )
                .input_schema(json!({ "type": "object", "properties": {}, "additionalProperties": false }))
                .effect(Effect::ReadOnly)
                .scopes(&[SCOPE_BASKET])
                .task_support(TaskSupport::Required)
                .idempotent()
                .handler(move |ctx, _| {
                    let baskets = export.clone();
                    async move { export_baskets(&ctx, &baskets).await }
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
