//! The rate limits a configuration asks for ([`build`], the one function a start or a reload
//! makes them with) and their shared store across instances: the deployment's Redis or Valkey,
//! one atomic Lua script per check (one round trip) that reads and advances every state the
//! request touches by the store's own clock (`TIME`), so instances whose clocks differ still
//! agree.
//!
//! - The connection is made on first use and again after a failure, at most once a second; in
//!   between, a check fails at once rather than waiting on a store known to be down.
//! - Every check is bounded by `rate_limit.timeout_ms`; a slow answer counts as a failure, and
//!   `rate_limit.on_store_failure` decides (refuse, or the local allowance).
//! - Keys expire when their state says nothing any more (a full bucket, a window over): the
//!   store holds only live keys.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use palisade_server::rate_limits::{
    Limit, RateLimits, RuleError, Shared, SharedCell, SharedStore, StoreFuture, StoreUnavailable, Verdict,
};

use crate::redis_publish::KindText as _;
use crate::settings::Settings;

/// The check: for each key `i`, `ARGV[3i-2..3i]` are `r, interval_us, burst` (a GCRA rate) or
/// `q, limit, window_us` (a fixed-window quota). Decides every key first; advances them all
/// only if every one allows. Returns `{-1, 0}`, or the 0-based index of the key with the
/// longest wait and that wait in µs.
const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = #KEYS
local first, second = {}, {}
local worst, worst_wait = 0, 0
for i = 1, n do
  local kind = ARGV[3 * i - 2]
  local a = tonumber(ARGV[3 * i - 1])
  local b = tonumber(ARGV[3 * i])
  if kind == 'r' then
    local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
    if tat < now then tat = now end
    local new_tat = tat + a
    local allowed_until = now + a * b
    if new_tat > allowed_until and new_tat - allowed_until > worst_wait then
      worst, worst_wait = i, new_tat - allowed_until
    end
    first[i] = new_tat
  else
    local current = math.floor(now / b) + 1
    local stored = redis.call('HMGET', KEYS[i], 'w', 'c')
    local count = 0
    if tonumber(stored[1]) == current then count = tonumber(stored[2]) or 0 end
    if count >= a then
      local wait = current * b - now
      if wait < 1 then wait = 1 end
      if wait > worst_wait then worst, worst_wait = i, wait end
    end
    first[i] = current
    second[i] = count + 1
  end
end
if worst > 0 then return {worst - 1, worst_wait} end
for i = 1, n do
  if ARGV[3 * i - 2] == 'r' then
    local ttl = math.ceil((first[i] - now) / 1000) + 1
    redis.call('SET', KEYS[i], string.format('%.0f', first[i]), 'PX', ttl)
  else
    local ttl = math.ceil((first[i] * tonumber(ARGV[3 * i]) - now) / 1000) + 1
    redis.call('HSET', KEYS[i], 'w', string.format('%.0f', first[i]), 'c', second[i])
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return {-1, 0}
";

/// How long after a failed connection a check fails at once instead of connecting again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Rate-limit state in Redis or Valkey.
pub struct RedisLimitStore {
    client: redis::Client,
    script: redis::Script,
    timeout: Duration,
    connection: Mutex<Connection>,
}

/// The connection, or when the last attempt failed.
enum Connection {
    Open(redis::aio::MultiplexedConnection),
    None,
    FailedAt(Instant),
}

impl RedisLimitStore {
    /// A store at `url`, each check bounded by `timeout`. Connects on first use.
    pub fn new(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let client =
            redis::Client::open(url).map_err(|e| anyhow::anyhow!("rate_limit.redis_url: {}", e.kind_text()))?;
        Ok(Self { client, script: redis::Script::new(SCRIPT), timeout, connection: Mutex::new(Connection::None) })
    }

    fn set(&self, connection: Connection) {
        *self.connection.lock().unwrap_or_else(PoisonError::into_inner) = connection;
    }

    /// The open connection, a new one, or a failure while the last attempt is recent.
    async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, StoreUnavailable> {
        {
            let current = self.connection.lock().unwrap_or_else(PoisonError::into_inner);
            match &*current {
                Connection::Open(connection) => return Ok(connection.clone()),
                Connection::FailedAt(at) if at.elapsed() < RECONNECT_AFTER => {
                    return Err(StoreUnavailable("not connected (the last attempt failed under a second ago)".into()));
                }
                Connection::FailedAt(_) | Connection::None => {}
            }
        }
        match self.client.get_multiplexed_async_connection().await {
            Ok(connection) => {
                self.set(Connection::Open(connection.clone()));
                Ok(connection)
            }
            Err(error) => {
                self.set(Connection::FailedAt(Instant::now()));
                Err(StoreUnavailable(format!("cannot connect: {}", error.kind_text())))
            }
        }
    }

    async fn run(&self, cells: &[SharedCell]) -> Result<Verdict, StoreUnavailable> {
        let mut connection = self.connection().await?;
        let mut invocation = self.script.prepare_invoke();
        for cell in cells {
            invocation.key(&cell.key);
            match cell.limit {
                Limit::Rate(rate) => invocation.arg("r").arg(rate.interval_us).arg(rate.burst),
                Limit::Quota(quota) => {
                    invocation.arg("q").arg(quota.limit).arg(quota.window_secs.saturating_mul(1_000_000))
                }
            };
        }
        let answer: Result<(i64, i64), redis::RedisError> = invocation.invoke_async(&mut connection).await;
        match answer {
            Ok((-1, _)) => Ok(Verdict::Allowed),
            Ok((cell, wait_us)) => match (usize::try_from(cell), u64::try_from(wait_us)) {
                (Ok(cell), Ok(wait_us)) if cell < cells.len() => Ok(Verdict::Refused { cell, wait_us }),
                _ => Err(StoreUnavailable("the script answered something unexpected".into())),
            },
            Err(error) => {
                if error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error() {
                    self.set(Connection::FailedAt(Instant::now()));
                }
                Err(StoreUnavailable(error.kind_text()))
            }
        }
    }
}

impl SharedStore for RedisLimitStore {
    fn check<'a>(&'a self, cells: &'a [SharedCell]) -> StoreFuture<'a> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, self.run(cells)).await {
                Ok(verdict) => verdict,
                Err(_) => Err(StoreUnavailable(format!("no answer within {} ms", self.timeout.as_millis()))),
            }
        })
    }
}

/// The rate limits `settings` ask for, keeping the state of every unchanged rule of `previous`
/// (a reload passes the server's current set, [`palisade_server::server::Server::rate_limits`]).
/// With `store = "redis"` the namespace is the deployment's `public_url`: instances sharing it
/// share the limits.
pub fn build(settings: &Settings, previous: Option<&RateLimits>) -> anyhow::Result<RateLimits> {
    let shared = match &settings.rate_limits.shared {
        Some(shared) => {
            let store: Arc<dyn SharedStore> = Arc::new(RedisLimitStore::new(&shared.redis_url, shared.timeout)?);
            let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, settings.public_url.as_bytes());
            let namespace = palisade_base::hex::hex(&digest.as_ref()[..8]);
            Some(Shared { store, namespace, on_failure: shared.on_failure })
        }
        None => None,
    };
    RateLimits::build(settings.rate_limits.rules.clone(), shared, previous).map_err(|error: RuleError| error.into())
}
