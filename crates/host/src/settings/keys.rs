//! The dotted file key of every option, by name: what validation errors name. The option table
//! (`OPTIONS`) gives each its environment variable, flag, default and meaning.

/// `app`
pub const APP: &str = "app";
/// `listen`
pub const LISTEN: &str = "listen";
/// `watch_config`
pub const WATCH_CONFIG: &str = "watch_config";
/// `metrics_listen`
pub const METRICS_LISTEN: &str = "metrics_listen";
/// `public_url`
pub const PUBLIC_URL: &str = "public_url";
/// `data_dir`
pub const DATA_DIR: &str = "data_dir";
/// `store`
pub const STORE: &str = "store";
/// `secret_file`
pub const SECRET_FILE: &str = "secret_file";
/// `events_redis`
pub const EVENTS_REDIS: &str = "events_redis";
/// `limits.max_body_bytes`
pub const LIMITS_MAX_BODY_BYTES: &str = "limits.max_body_bytes";
/// `limits.request_timeout_secs`
pub const LIMITS_REQUEST_TIMEOUT_SECS: &str = "limits.request_timeout_secs";
/// `limits.page_size`
pub const LIMITS_PAGE_SIZE: &str = "limits.page_size";
/// `limits.header_read_timeout_secs`
pub const LIMITS_HEADER_READ_TIMEOUT_SECS: &str = "limits.header_read_timeout_secs";
/// `limits.body_read_timeout_secs`
pub const LIMITS_BODY_READ_TIMEOUT_SECS: &str = "limits.body_read_timeout_secs";
/// `limits.idle_timeout_secs`
pub const LIMITS_IDLE_TIMEOUT_SECS: &str = "limits.idle_timeout_secs";
/// `limits.max_connections`
pub const LIMITS_MAX_CONNECTIONS: &str = "limits.max_connections";
/// `limits.max_streams_per_principal`
pub const LIMITS_MAX_STREAMS_PER_PRINCIPAL: &str = "limits.max_streams_per_principal";
/// `limits.max_listen_filter_entries`
pub const LIMITS_MAX_LISTEN_FILTER_ENTRIES: &str = "limits.max_listen_filter_entries";
/// `http.allowed_hosts`
pub const HTTP_ALLOWED_HOSTS: &str = "http.allowed_hosts";
/// `http.allowed_origins`
pub const HTTP_ALLOWED_ORIGINS: &str = "http.allowed_origins";
/// `auth.mode`
pub const AUTH_MODE: &str = "auth.mode";
/// `auth.dev_issuer`
pub const AUTH_DEV_ISSUER: &str = "auth.dev_issuer";
/// `auth.dev_issuer.enabled`
pub const AUTH_DEV_ISSUER_ENABLED: &str = "auth.dev_issuer.enabled";
/// `auth.dev_issuer.auto_approve`
pub const AUTH_DEV_ISSUER_AUTO_APPROVE: &str = "auth.dev_issuer.auto_approve";
/// `auth.dev_issuer.default_subject`
pub const AUTH_DEV_ISSUER_DEFAULT_SUBJECT: &str = "auth.dev_issuer.default_subject";
/// `auth.dev_issuer.default_tenant`
pub const AUTH_DEV_ISSUER_DEFAULT_TENANT: &str = "auth.dev_issuer.default_tenant";
/// `auth.dev_issuer.access_token_ttl_secs`
pub const AUTH_DEV_ISSUER_ACCESS_TOKEN_TTL_SECS: &str = "auth.dev_issuer.access_token_ttl_secs";
/// `auth.dev_issuer.client_metadata_allow_loopback`
pub const AUTH_DEV_ISSUER_CLIENT_METADATA_ALLOW_LOOPBACK: &str = "auth.dev_issuer.client_metadata_allow_loopback";
/// `auth.dev_issuer.client_metadata_ca_file`
pub const AUTH_DEV_ISSUER_CLIENT_METADATA_CA_FILE: &str = "auth.dev_issuer.client_metadata_ca_file";
/// `auth.leeway_secs`
pub const AUTH_LEEWAY_SECS: &str = "auth.leeway_secs";
/// `auth.required_typ`
pub const AUTH_REQUIRED_TYP: &str = "auth.required_typ";
/// `auth.tenant_claim`
pub const AUTH_TENANT_CLAIM: &str = "auth.tenant_claim";
/// `auth.client_claim`
pub const AUTH_CLIENT_CLAIM: &str = "auth.client_claim";
/// `auth.token_cache_capacity`
pub const AUTH_TOKEN_CACHE_CAPACITY: &str = "auth.token_cache_capacity";
/// `auth.jwks_allow_loopback`
pub const AUTH_JWKS_ALLOW_LOOPBACK: &str = "auth.jwks_allow_loopback";
/// `auth.jwks_allowed_networks`
pub const AUTH_JWKS_ALLOWED_NETWORKS: &str = "auth.jwks_allowed_networks";
/// `auth.jwks_proxy`
pub const AUTH_JWKS_PROXY: &str = "auth.jwks_proxy";
/// `auth.issuers`
pub const AUTH_ISSUERS: &str = "auth.issuers";
/// `auth.issuers[].issuer`
pub const AUTH_ISSUERS_ISSUER: &str = "auth.issuers[].issuer";
/// `auth.issuers[].jwks_url`
pub const AUTH_ISSUERS_JWKS_URL: &str = "auth.issuers[].jwks_url";
/// `auth.issuers[].algorithms`
pub const AUTH_ISSUERS_ALGORITHMS: &str = "auth.issuers[].algorithms";
/// `handles.subject_key_file`
pub const HANDLES_SUBJECT_KEY_FILE: &str = "handles.subject_key_file";
/// `handles.subject_key`
pub const HANDLES_SUBJECT_KEY: &str = "handles.subject_key";
/// `handles.retention_secs`
pub const HANDLES_RETENTION_SECS: &str = "handles.retention_secs";
/// `handles.policies.<type>`
pub const HANDLES_POLICIES: &str = "handles.policies.<type>";
/// `handles.policies.<type>.ttl_secs`
pub const HANDLES_POLICIES_TTL_SECS: &str = "handles.policies.<type>.ttl_secs";
/// `handles.policies.<type>.allowed_scopes`
pub const HANDLES_POLICIES_ALLOWED_SCOPES: &str = "handles.policies.<type>.allowed_scopes";
/// `handles.policies.<type>.max_scopes`
pub const HANDLES_POLICIES_MAX_SCOPES: &str = "handles.policies.<type>.max_scopes";
/// `handles.policies.<type>.policy_version`
pub const HANDLES_POLICIES_POLICY_VERSION: &str = "handles.policies.<type>.policy_version";
/// `policies.files`
pub const POLICIES_FILES: &str = "policies.files";
/// `policies.group_claims`
pub const POLICIES_GROUP_CLAIMS: &str = "policies.group_claims";
/// `policies.max_argument_depth`
pub const POLICIES_MAX_ARGUMENT_DEPTH: &str = "policies.max_argument_depth";
/// `policies.max_argument_bytes`
pub const POLICIES_MAX_ARGUMENT_BYTES: &str = "policies.max_argument_bytes";
/// `policies.max_argument_entries`
pub const POLICIES_MAX_ARGUMENT_ENTRIES: &str = "policies.max_argument_entries";
/// `policies.require_signed`
pub const POLICIES_REQUIRE_SIGNED: &str = "policies.require_signed";
/// `delegation.enabled`
pub const DELEGATION_ENABLED: &str = "delegation.enabled";
/// `delegation.max_depth`
pub const DELEGATION_MAX_DEPTH: &str = "delegation.max_depth";
/// `delegation.max_calls`
pub const DELEGATION_MAX_CALLS: &str = "delegation.max_calls";
/// `delegation.max_lifetime_secs`
pub const DELEGATION_MAX_LIFETIME_SECS: &str = "delegation.max_lifetime_secs";
/// `rate_limit.store`
pub const RATE_LIMIT_STORE: &str = "rate_limit.store";
/// `rate_limit.redis_url`
pub const RATE_LIMIT_REDIS_URL: &str = "rate_limit.redis_url";
/// `rate_limit.timeout_ms`
pub const RATE_LIMIT_TIMEOUT_MS: &str = "rate_limit.timeout_ms";
/// `rate_limit.on_store_failure`
pub const RATE_LIMIT_ON_STORE_FAILURE: &str = "rate_limit.on_store_failure";
/// `rate_limits`
pub const RATE_LIMITS: &str = "rate_limits";
/// `rate_limits[].name`
pub const RATE_LIMITS_NAME: &str = "rate_limits[].name";
/// `rate_limits[].key`
pub const RATE_LIMITS_KEY: &str = "rate_limits[].key";
/// `rate_limits[].methods`
pub const RATE_LIMITS_METHODS: &str = "rate_limits[].methods";
/// `rate_limits[].tools`
pub const RATE_LIMITS_TOOLS: &str = "rate_limits[].tools";
/// `rate_limits[].upstreams`
pub const RATE_LIMITS_UPSTREAMS: &str = "rate_limits[].upstreams";
/// `rate_limits[].rate`
pub const RATE_LIMITS_RATE: &str = "rate_limits[].rate";
/// `rate_limits[].per_secs`
pub const RATE_LIMITS_PER_SECS: &str = "rate_limits[].per_secs";
/// `rate_limits[].burst`
pub const RATE_LIMITS_BURST: &str = "rate_limits[].burst";
/// `rate_limits[].quota`
pub const RATE_LIMITS_QUOTA: &str = "rate_limits[].quota";
/// `rate_limits[].quota_window_secs`
pub const RATE_LIMITS_QUOTA_WINDOW_SECS: &str = "rate_limits[].quota_window_secs";
/// `legacy.enabled`
pub const LEGACY_ENABLED: &str = "legacy.enabled";
/// `legacy.versions`
pub const LEGACY_VERSIONS: &str = "legacy.versions";
/// `legacy.idle_timeout_secs`
pub const LEGACY_IDLE_TIMEOUT_SECS: &str = "legacy.idle_timeout_secs";
/// `legacy.absolute_timeout_secs`
pub const LEGACY_ABSOLUTE_TIMEOUT_SECS: &str = "legacy.absolute_timeout_secs";
/// `killswitch.mode`
pub const KILLSWITCH_MODE: &str = "killswitch.mode";
/// `killswitch.server_release`
pub const KILLSWITCH_SERVER_RELEASE: &str = "killswitch.server_release";
/// `killswitch.root_public_key`
pub const KILLSWITCH_ROOT_PUBLIC_KEY: &str = "killswitch.root_public_key";
/// `killswitch.policy`
pub const KILLSWITCH_POLICY: &str = "killswitch.policy";
/// `killswitch.key_trust_root`
pub const KILLSWITCH_KEY_TRUST_ROOT: &str = "killswitch.key_trust_root";
/// `killswitch.authority_url`
pub const KILLSWITCH_AUTHORITY_URL: &str = "killswitch.authority_url";
/// `killswitch.authority_ca`
pub const KILLSWITCH_AUTHORITY_CA: &str = "killswitch.authority_ca";
/// `killswitch.client_cert`
pub const KILLSWITCH_CLIENT_CERT: &str = "killswitch.client_cert";
/// `killswitch.client_key`
pub const KILLSWITCH_CLIENT_KEY: &str = "killswitch.client_key";
/// `killswitch.generation_store`
pub const KILLSWITCH_GENERATION_STORE: &str = "killswitch.generation_store";
/// `killswitch.target_key_file`
pub const KILLSWITCH_TARGET_KEY_FILE: &str = "killswitch.target_key_file";
/// `killswitch.authority_db`
pub const KILLSWITCH_AUTHORITY_DB: &str = "killswitch.authority_db";
/// `killswitch.stream_recheck_secs`
pub const KILLSWITCH_STREAM_RECHECK_SECS: &str = "killswitch.stream_recheck_secs";
/// `killswitch.replay_window_ms`
pub const KILLSWITCH_REPLAY_WINDOW_MS: &str = "killswitch.replay_window_ms";
/// `killswitch.authority_envelope`
pub const KILLSWITCH_AUTHORITY_ENVELOPE: &str = "killswitch.authority_envelope";
/// `telemetry.otlp_endpoint`
pub const TELEMETRY_OTLP_ENDPOINT: &str = "telemetry.otlp_endpoint";
/// `telemetry.service_name`
pub const TELEMETRY_SERVICE_NAME: &str = "telemetry.service_name";
/// `telemetry.sampling_ratio`
pub const TELEMETRY_SAMPLING_RATIO: &str = "telemetry.sampling_ratio";
/// `telemetry.otlp_headers_file`
pub const TELEMETRY_OTLP_HEADERS_FILE: &str = "telemetry.otlp_headers_file";
/// `telemetry.otlp_headers`
pub const TELEMETRY_OTLP_HEADERS: &str = "telemetry.otlp_headers";
/// `telemetry.continue_incoming_traces`
pub const TELEMETRY_CONTINUE_INCOMING_TRACES: &str = "telemetry.continue_incoming_traces";
/// `audit.transport_refusal_interval_secs`
pub const AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS: &str = "audit.transport_refusal_interval_secs";
/// `audit.segment_dir`
pub const AUDIT_SEGMENT_DIR: &str = "audit.segment_dir";
/// `audit.durability`
pub const AUDIT_DURABILITY: &str = "audit.durability";
/// `audit.checkpoint_interval_secs`
pub const AUDIT_CHECKPOINT_INTERVAL_SECS: &str = "audit.checkpoint_interval_secs";
