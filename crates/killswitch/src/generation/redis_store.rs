//! `RedisGenerationStore`: the shared backend for several instances (Valkey or Redis). One Lua
//! script per batch, run with `EVALSHA` (the script is loaded again on `NOSCRIPT`), so a batch is
//! atomic. Keys are `palisade:killswitch:{<authority>}:<subject>`: every key of one authority lies
//! in one cluster hash slot, as a multi-key script requires.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{GenerationRecord, GenerationStore, GenerationStoreError, MonotonicOutcome, StoreFuture, validate_batch};

/// ARGV holds three values per key: generation, digest, state. Nothing is written unless every
/// record is acceptable (the same rule as `decide` in Rust).
const ACCEPT_ALL: &str = r"
local outcomes = {}
local refused = false
for index = 1, #KEYS do
  local current = tonumber(redis.call('HGET', KEYS[index], 'generation') or '0')
  local incoming = tonumber(ARGV[3 * index - 2])
  if not current or not incoming or incoming < 1 then
    return redis.error_reply('generation')
  end
  if incoming < current then
    outcomes[index] = 'STALE'
    refused = true
  elseif incoming == current then
    if redis.call('HGET', KEYS[index], 'digest') ~= ARGV[3 * index - 1] then
      outcomes[index] = 'CONFLICT'
      refused = true
    else
      outcomes[index] = 'REPLAY'
    end
  else
    outcomes[index] = 'ACCEPTED'
  end
end
if not refused then
  for index = 1, #KEYS do
    if outcomes[index] == 'ACCEPTED' then
      redis.call('HSET', KEYS[index], 'generation', ARGV[3 * index - 2],
        'digest', ARGV[3 * index - 1], 'state', ARGV[3 * index])
    end
  end
end
return outcomes
";

/// Connection settings. Short timeouts: the request path waits on this store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisOptions {
    /// Connecting (and reconnecting) gives up after this long.
    pub connect_timeout: Duration,
    /// A command gives up after this long.
    pub response_timeout: Duration,
    /// Reconnection attempts before an error is returned.
    pub retries: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self { connect_timeout: Duration::from_secs(1), response_timeout: Duration::from_secs(1), retries: 1 }
    }
}

/// The Valkey/Redis generation store.
#[derive(Clone)]
pub struct RedisGenerationStore {
    connection: ConnectionManager,
    script: redis::Script,
}

impl std::fmt::Debug for RedisGenerationStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RedisGenerationStore").finish_non_exhaustive()
    }
}

impl RedisGenerationStore {
    /// Connects to `redis://…` (or `rediss://…` when the redis client has TLS support). The URL
    /// may hold a password: it never appears in an error.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, GenerationStoreError> {
        let client = redis::Client::open(url).map_err(|error| GenerationStoreError::unavailable("connect", error))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(options.retries)
            .set_max_delay(options.connect_timeout);
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|error| GenerationStoreError::unavailable("connect", error))?;
        Ok(Self { connection, script: redis::Script::new(ACCEPT_ALL) })
    }

    async fn accept_batch(&self, records: &[GenerationRecord]) -> Result<Vec<MonotonicOutcome>, GenerationStoreError> {
        validate_batch(records)?;
        let mut invocation = self.script.prepare_invoke();
        for record in records {
            invocation.key(format!("palisade:killswitch:{{{}}}:{}", record.authority, record.subject.storage_name()));
        }
        for record in records {
            invocation.arg(record.generation.to_string()).arg(&record.digest).arg(&record.state);
        }
        let mut connection = self.connection.clone();
        let answers: Vec<String> = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|error| GenerationStoreError::unavailable("accept", error))?;
        if answers.len() != records.len() {
            return Err(GenerationStoreError::Corrupt { what: "answer count" });
        }
        answers
            .iter()
            .map(|answer| match answer.as_str() {
                "ACCEPTED" => Ok(MonotonicOutcome::Accepted),
                "REPLAY" => Ok(MonotonicOutcome::Replay),
                "STALE" => Ok(MonotonicOutcome::Stale),
                "CONFLICT" => Ok(MonotonicOutcome::Conflict),
                _ => Err(GenerationStoreError::Corrupt { what: "unknown outcome" }),
            })
            .collect()
    }
}

impl GenerationStore for RedisGenerationStore {
    fn accept_all<'a>(&'a self, records: &'a [GenerationRecord]) -> StoreFuture<'a, Vec<MonotonicOutcome>> {
        Box::pin(self.accept_batch(records))
    }
}
