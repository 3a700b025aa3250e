//! `[rate_limit]` (where limits count: in process, or in the deployment's Redis/Valkey) and
//! `[[rate_limits]]` (the rules): as written and validated into [`RateLimitSettings`].

use std::time::Duration;

use palisade_server::method::Method;
use palisade_server::rate_limits::{Dimension, OnStoreFailure, Quota, Rate, RateRule};
use serde::Deserialize;

use super::error::{ConfigError, bad};
use super::keys;

/// `[rate_limit]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    /// `local` (each instance counts on its own) or `redis` (instances share the counts).
    pub store: Option<String>,
    /// The Redis or Valkey URL for `store = "redis"`. Default: `events_redis`.
    pub redis_url: Option<String>,
    /// Longest wait for the store's answer, in milliseconds. Default 50.
    pub timeout_ms: Option<u64>,
    /// `refuse` (the default) or `local`: what a check does when the store does not answer.
    pub on_store_failure: Option<String>,
}

/// One `[[rate_limits]]` rule as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateRule {
    /// A unique name: `[a-z0-9_-]`, 1–64 characters.
    pub name: Option<String>,
    /// What the state is keyed on: `subject`, `tenant`, `client`, `tool`, `upstream`, `agent`.
    #[serde(default)]
    pub key: Vec<String>,
    /// The methods counted (default every method).
    #[serde(default)]
    pub methods: Vec<String>,
    /// The tools counted (default any).
    #[serde(default)]
    pub tools: Vec<String>,
    /// The upstreams counted (default any).
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Requests per `per_secs`.
    pub rate: Option<u64>,
    /// The rate's period in seconds. Default 1.
    pub per_secs: Option<u64>,
    /// Requests allowed at once. Default `rate`.
    pub burst: Option<u64>,
    /// Requests per quota window.
    pub quota: Option<u64>,
    /// The quota's window in seconds, aligned to the Unix epoch. Default 86400.
    pub quota_window_secs: Option<u64>,
}

/// Validated `[rate_limit]` and `[[rate_limits]]`.
#[derive(Debug, Clone, Default)]
pub struct RateLimitSettings {
    /// The rules, in order.
    pub rules: Vec<RateRule>,
    /// Where they count across instances, when they do.
    pub shared: Option<SharedLimitSettings>,
}

/// `store = "redis"`.
#[derive(Debug, Clone)]
pub struct SharedLimitSettings {
    /// The Redis or Valkey URL.
    pub redis_url: String,
    /// Longest wait for an answer.
    pub timeout: Duration,
    /// What to do without one.
    pub on_failure: OnStoreFailure,
}

/// Largest `rate` and `burst`.
const MAX_RATE: u64 = 1_000_000;
/// Longest `per_secs` and `quota_window_secs` (a year).
const MAX_PERIOD_SECS: u64 = 31_536_000;

/// Validates both sections; `events_redis` is the default store URL.
pub fn validate(
    raw: RawRateLimit,
    rules: Vec<RawRateRule>,
    events_redis: Option<&str>,
) -> Result<RateLimitSettings, ConfigError> {
    let timeout_ms = raw.timeout_ms.unwrap_or(50);
    if !(1..=5000).contains(&timeout_ms) {
        return Err(bad(keys::RATE_LIMIT_TIMEOUT_MS, "must be between 1 and 5000"));
    }
    let on_failure = match raw.on_store_failure.as_deref() {
        None | Some("refuse") => OnStoreFailure::Refuse,
        Some("local") => OnStoreFailure::Local,
        Some(_) => return Err(bad(keys::RATE_LIMIT_ON_STORE_FAILURE, "must be \"refuse\" or \"local\"")),
    };
    let shared = match raw.store.as_deref() {
        None | Some("local") => {
            if raw.redis_url.is_some() {
                return Err(bad(keys::RATE_LIMIT_REDIS_URL, "is used only with rate_limit.store = \"redis\""));
            }
            None
        }
        Some("redis") => {
            let url = raw.redis_url.as_deref().or(events_redis).ok_or_else(|| {
                bad(keys::RATE_LIMIT_REDIS_URL, "is needed with rate_limit.store = \"redis\" (or set events_redis)")
            })?;
            let parsed = url::Url::parse(url).ok();
            if !parsed.is_some_and(|u| matches!(u.scheme(), "redis" | "rediss") && u.host_str().is_some()) {
                return Err(bad(keys::RATE_LIMIT_REDIS_URL, "must be a redis:// or rediss:// URL with a host"));
            }
            Some(SharedLimitSettings {
                redis_url: url.to_owned(),
                timeout: Duration::from_millis(timeout_ms),
                on_failure,
            })
        }
        Some(_) => return Err(bad(keys::RATE_LIMIT_STORE, "must be \"local\" or \"redis\"")),
    };
    let mut validated: Vec<RateRule> = Vec::with_capacity(rules.len());
    for (index, raw) in rules.into_iter().enumerate() {
        let rule = rule(index, raw)?;
        if validated.iter().any(|other| other.name == rule.name) {
            return Err(bad(&field(index, "name"), format!("`{}` names another rule too", rule.name)));
        }
        validated.push(rule);
    }
    Ok(RateLimitSettings { rules: validated, shared })
}

/// `rate_limits[index].name`
fn field(index: usize, name: &str) -> String {
    format!("rate_limits[{index}].{name}")
}

fn rule(index: usize, raw: RawRateRule) -> Result<RateRule, ConfigError> {
    let key = |name: &str| field(index, name);
    let name = raw.name.ok_or_else(|| bad(&key("name"), "is required"))?;
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(bad(&key("name"), "must be 1-64 characters of a-z, 0-9, _ and -"));
    }
    let mut dimensions = Vec::with_capacity(raw.key.len());
    for text in &raw.key {
        let dimension = Dimension::parse(text).ok_or_else(|| {
            bad(&key("key"), format!("`{text}` is not one of subject, tenant, client, tool, upstream, agent"))
        })?;
        if dimensions.contains(&dimension) {
            return Err(bad(&key("key"), format!("`{text}` is listed twice")));
        }
        dimensions.push(dimension);
    }
    let mut methods = Vec::with_capacity(raw.methods.len());
    for text in &raw.methods {
        let method = Method::parse(text)
            .or_else(|| Method::parse_legacy(text))
            .ok_or_else(|| bad(&key("methods"), format!("`{text}` is not a method the server serves")))?;
        methods.push(method);
    }
    for (list, values) in [("tools", &raw.tools), ("upstreams", &raw.upstreams)] {
        if values.iter().any(String::is_empty) {
            return Err(bad(&key(list), "must not hold an empty name"));
        }
    }
    let in_range = |name: &str, value: u64, max: u64| {
        if (1..=max).contains(&value) {
            Ok(value)
        } else {
            Err(bad(&key(name), format!("must be between 1 and {max}")))
        }
    };
    let rate = match raw.rate {
        Some(requests) => {
            let requests = in_range("rate", requests, MAX_RATE)?;
            let per_secs = in_range("per_secs", raw.per_secs.unwrap_or(1), MAX_PERIOD_SECS)?;
            let burst = in_range("burst", raw.burst.unwrap_or(requests), MAX_RATE)?;
            let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
            Some(
                Rate::new(narrow(requests), per_secs, narrow(burst))
                    .ok_or_else(|| bad(&key("rate"), "is finer than one request a microsecond"))?,
            )
        }
        None if raw.per_secs.is_some() || raw.burst.is_some() => {
            let which = if raw.per_secs.is_some() { "per_secs" } else { "burst" };
            return Err(bad(&key(which), "is used only with rate"));
        }
        None => None,
    };
    let quota = match raw.quota {
        Some(limit) => Some(Quota {
            limit: in_range("quota", limit, u64::from(u32::MAX))?,
            window_secs: in_range("quota_window_secs", raw.quota_window_secs.unwrap_or(86_400), MAX_PERIOD_SECS)?,
        }),
        None if raw.quota_window_secs.is_some() => {
            return Err(bad(&key("quota_window_secs"), "is used only with quota"));
        }
        None => None,
    };
    if rate.is_none() && quota.is_none() {
        return Err(bad(&key("rate"), "a rule needs a rate, a quota or both"));
    }
    Ok(RateRule { name, key: dimensions, methods, tools: raw.tools, upstreams: raw.upstreams, rate, quota })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Result<RateLimitSettings, ConfigError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            rate_limit: RawRateLimit,
            #[serde(default)]
            rate_limits: Vec<RawRateRule>,
        }
        let file: File = toml::from_str(text).unwrap();
        validate(file.rate_limit, file.rate_limits, None)
    }

    #[test]
    fn a_rule_reads_with_its_defaults() {
        let settings = rules(
            "[[rate_limits]]\nname = \"per-tenant\"\nkey = [\"tenant\", \"tool\"]\nrate = 10\n\
             methods = [\"tools/call\"]\nquota = 1000\n",
        )
        .unwrap();
        let rule = &settings.rules[0];
        assert_eq!(rule.key, vec![Dimension::Tenant, Dimension::Tool]);
        assert_eq!(rule.rate, Rate::new(10, 1, 10));
        assert_eq!(rule.quota, Some(Quota { limit: 1000, window_secs: 86_400 }));
        assert_eq!(rule.methods, vec![Method::ToolsCall]);
        assert!(settings.shared.is_none());
    }

    /// Every bad value is refused naming its key.
    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("[[rate_limits]]\nrate = 1\n", "rate_limits[0].name"),
            ("[[rate_limits]]\nname = \"A\"\nrate = 1\n", "rate_limits[0].name"),
            ("[[rate_limits]]\nname = \"a\"\nkey = [\"ip\"]\nrate = 1\n", "rate_limits[0].key"),
            ("[[rate_limits]]\nname = \"a\"\nkey = [\"tool\", \"tool\"]\nrate = 1\n", "rate_limits[0].key"),
            ("[[rate_limits]]\nname = \"a\"\nmethods = [\"tools/run\"]\nrate = 1\n", "rate_limits[0].methods"),
            ("[[rate_limits]]\nname = \"a\"\nrate = 0\n", "rate_limits[0].rate"),
            ("[[rate_limits]]\nname = \"a\"\nburst = 3\n", "rate_limits[0].burst"),
            ("[[rate_limits]]\nname = \"a\"\n", "rate_limits[0].rate"),
            ("[[rate_limits]]\nname = \"a\"\nquota_window_secs = 60\n", "rate_limits[0].quota_window_secs"),
            (
                "[[rate_limits]]\nname = \"a\"\nrate = 1\n[[rate_limits]]\nname = \"a\"\nrate = 2\n",
                "rate_limits[1].name",
            ),
            ("[rate_limit]\nstore = \"memcached\"\n", "rate_limit.store"),
            ("[rate_limit]\nstore = \"redis\"\n", "rate_limit.redis_url"),
            ("[rate_limit]\nstore = \"redis\"\nredis_url = \"http://x\"\n", "rate_limit.redis_url"),
            ("[rate_limit]\nredis_url = \"redis://x\"\n", "rate_limit.redis_url"),
            ("[rate_limit]\non_store_failure = \"allow\"\n", "rate_limit.on_store_failure"),
            ("[rate_limit]\ntimeout_ms = 0\n", "rate_limit.timeout_ms"),
        ];
        for (text, key) in cases {
            assert_eq!(rules(text).unwrap_err().key, key, "{text}");
        }
    }

    #[test]
    fn the_redis_store_defaults_to_events_redis() {
        let raw =
            RawRateLimit { store: Some("redis".into()), on_store_failure: Some("local".into()), ..Default::default() };
        let settings = validate(raw, Vec::new(), Some("redis://10.0.0.5:6379/")).unwrap();
        let shared = settings.shared.unwrap();
        assert_eq!(shared.redis_url, "redis://10.0.0.5:6379/");
        assert_eq!(shared.on_failure, OnStoreFailure::Local);
        assert_eq!(shared.timeout, Duration::from_millis(50));
    }
}
