//! The settings' unit tests: parsing, validation, the option table, the environment and flags.

use serde::Deserialize;

use super::audit::RawAudit;
use super::auth::{RawAuth, RawDevIssuer, RawDevIssuerTable, RawIssuer};
use super::delegation::RawDelegation;
use super::handles::{RawHandlePolicy, RawHandles};
use super::killswitch::RawKillSwitch;
use super::legacy::RawLegacy;
use super::limits::{RawHttp, RawLimits};
use super::options::{Fallback, Kind};
use super::rate_limits::{RawRateLimit, RawRateRule};
use super::telemetry::RawTelemetry;
use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

fn check(text: &str) -> Result<Settings, ConfigError> {
    let mut raw = parse(text)?;
    apply_env(&mut raw, &no_env)?;
    validate(raw)
}

#[test]
fn defaults_are_the_embedded_demo() {
    let settings = check("").unwrap();
    assert_eq!(settings.app, AppChoice::Demo);
    assert_eq!(settings.auth.mode, AuthMode::Bearer);
    assert!(settings.auth.dev_issuer);
    assert_eq!(settings.public_url, "http://127.0.0.1:8080/mcp");
    assert!(settings.store.starts_with("sqlite:"));
    assert!(matches!(settings.killswitch.mode, KillSwitchMode::Dev { .. }));
    assert_eq!(check("app = \"conformance\"").unwrap().killswitch.mode, KillSwitchMode::Off);
}

#[test]
fn a_file_with_upstreams_is_a_gateway_and_only_a_gateway_takes_upstreams() {
    let upstream = "[auth]\ndev_issuer = true\n[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\n";
    let settings = check(upstream).unwrap();
    assert_eq!(settings.app, AppChoice::Gateway);
    assert_eq!(settings.auth.mode, AuthMode::Bearer, "a gateway authenticates its callers by default");
    let gateway = settings.gateway.unwrap();
    assert_eq!(gateway.upstreams[0].id, "fx");
    assert_eq!(check(&format!("app = \"demo\"\n{upstream}")).unwrap_err().key, "upstreams");
    assert_eq!(check("app = \"gateway\"").unwrap_err().key, "upstreams");
    let bad = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\nprefix = \"A\"\n";
    assert_eq!(check(bad).unwrap_err().key, "upstreams[0].prefix");
    assert!(check(&format!("{upstream}color = \"red\"\n")).is_err(), "unknown keys are refused");
}

/// Path options that are not secret, each with why a stdio upstream may be granted it.
const PUBLIC_PATH_OPTIONS: &[&str] = &[
    "auth.dev_issuer.client_metadata_ca_file", // trust anchors (public certificates)
    "killswitch.root_public_key",              // a public key
    "killswitch.policy",                       // a signed, public policy
    "killswitch.key_trust_root",               // public keys
    "killswitch.authority_ca",                 // trust anchors
    "killswitch.client_cert",                  // a certificate chain (its key is protected)
];

#[test]
fn every_secret_file_option_is_kept_from_stdio_upstreams() {
    // Every path option is classified: protected, or listed above as public.
    for spec in OPTIONS.iter().filter(|spec| spec.kind == Kind::Path) {
        assert!(
            spec.protected != PUBLIC_PATH_OPTIONS.contains(&spec.key),
            "{}: a path option is either protected or listed as public, not both or neither",
            spec.key
        );
    }
    // A configuration setting every protected option to its own file.
    let dir = std::env::temp_dir().join(format!("palisade-protected-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str| dir.join(name).display().to_string();
    std::fs::write(file("otlp-headers"), "Authorization: Bearer collector-secret\n").unwrap();
    let text = format!(
        "data_dir = \"{data}\"\nsecret_file = \"{secret}\"\n[auth]\nmode = \"none\"\n\
         [handles]\nsubject_key_file = \"{subject}\"\n[audit]\nsegment_dir = \"{segment}\"\n\
         [telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\notlp_headers_file = \"{headers}\"\n\
         [killswitch]\nmode = \"authority\"\nroot_public_key = \"/k/root.pub\"\npolicy = \"/k/policy\"\n\
         key_trust_root = \"/k/trust\"\nauthority_url = \"https://authority.example\"\nauthority_ca = \"/k/ca.pem\"\n\
         client_cert = \"/k/client.pem\"\nclient_key = \"{client_key}\"\ntarget_key_file = \"{target}\"\n\
         authority_db = \"{authority_db}\"\n\
         [[upstreams]]\nid = \"files\"\ncommand = \"/bin/true\"\n",
        data = file("data"),
        secret = file("server-secret"),
        subject = file("subject-key"),
        segment = file("segment"),
        headers = file("otlp-headers"),
        client_key = file("client.key"),
        target = file("target-key"),
        authority_db = file("authority.db"),
    );
    let mut settings = check(&text).unwrap();
    settings.protect_from_stdio_upstreams(None);
    let listed = settings.protected_option_paths();
    let protected_keys: std::collections::BTreeSet<&str> =
        OPTIONS.iter().filter(|spec| spec.protected).map(|spec| spec.key).collect();
    let listed_keys: std::collections::BTreeSet<&str> = listed.iter().map(|(key, _)| *key).collect();
    assert_eq!(listed_keys, protected_keys, "Settings::protected_option_paths names every protected option");
    let gateway = settings.gateway.as_ref().unwrap();
    for (key, path) in listed {
        let path = path.unwrap_or_else(|| panic!("{key} is set in the sample but has no value"));
        assert!(path.starts_with(&dir), "{key}: {}", path.display());
        assert!(gateway.protected_paths.contains(&path), "{key} ({}) is not protected", path.display());
    }
    assert!(gateway.protected_paths.contains(&dir.join("otlp-headers")), "the collector's credentials");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_development_issuer_runs_only_on_loopback_and_never_by_default_for_the_gateway() {
    let upstream = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9001/mcp\"\n";
    let issuer = "[[auth.issuers]]\nissuer = \"https://i\"\njwks_url = \"https://i/jwks\"\nalgorithms = [\"ES256\"]\n";
    let on = |text: &str| check(text).unwrap_or_else(|e| panic!("{text}: {e}")).auth.dev_issuer;
    // The demo on loopback: on by default; beside real issuers or off loopback: off.
    assert!(on(""));
    assert!(!on(issuer));
    assert!(!on(&format!("listen = \"0.0.0.0:8080\"\n{issuer}")));
    assert!(!on(&format!("public_url = \"https://mcp.example.com/mcp\"\n{issuer}")));
    // The gateway: never by default, not even on loopback.
    assert!(!on(&format!("{issuer}{upstream}")));
    assert_eq!(check(upstream).unwrap_err().key, "auth.issuers");
    // Named: on loopback only, with or without real issuers.
    assert!(on(&format!("[auth]\ndev_issuer = true\n{upstream}")));
    assert!(on(&format!("[auth]\ndev_issuer = true\n{issuer}{upstream}")));
    assert!(on("listen = \"[::1]:8080\"\npublic_url = \"http://localhost:8080/mcp\"\n[auth]\ndev_issuer = true"));
    for text in [
        "listen = \"0.0.0.0:8080\"\n[auth]\ndev_issuer = true",
        "listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nenabled = true",
        "listen = \"10.0.0.1:8080\"\n[auth]\ndev_issuer = true",
        "public_url = \"https://mcp.example.com/mcp\"\n[auth]\ndev_issuer = true",
        "public_url = \"http://127.0.0.1.example.com/mcp\"\n[auth]\ndev_issuer = true",
    ] {
        assert_eq!(check(text).unwrap_err().key, "auth.dev_issuer", "{text}");
        assert_eq!(check(&format!("{text}\n{upstream}")).unwrap_err().key, "auth.dev_issuer", "{text}");
    }
}

#[test]
fn a_misspelt_key_is_named_by_its_full_path_with_the_key_it_is_close_to() {
    let upstream = "[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    for (text, key, near) in [
        ("[pins]\nrelist_sec = 5\n", "pins.relist_sec", Some("relist_secs")),
        (&format!("{upstream}{upstream}prefx = \"b\"\n") as &str, "upstreams[1].prefx", Some("prefix")),
        ("[auth.dev_issuer]\nauto_aprove = true\n", "auth.dev_issuer.auto_aprove", Some("auto_approve")),
        ("[auth]\ndev_isuer = true\n", "auth.dev_isuer", Some("dev_issuer")),
        ("colour = \"blue\"\n", "colour", None),
        ("[limits]\nmax_connections = -1\n", "limits.max_connections", None),
        ("[auth.dev_issuer]\nauto_approve = \"yes\"\n", "auth.dev_issuer.auto_approve", None),
    ] {
        let error = parse(text).unwrap_err();
        assert_eq!(error.key, key, "{text}: {error}");
        match near {
            Some(near) => assert!(error.reason.contains(&format!("did you mean `{near}`?")), "{text}: {error}"),
            None => assert!(!error.reason.contains("did you mean"), "{text}: {error}"),
        }
        assert!(!error.reason.contains("untagged"), "{text}: {error}");
    }
}

/// TOML the parser refuses is located by its line: the table above it, an array-of-tables
/// element by its index, as the deserializer's paths name it.
#[test]
fn a_syntax_error_is_named_by_the_full_path_of_its_line() {
    let upstream = "[[upstreams]]\nid = \"a\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    for (text, key) in [
        (format!("{upstream}{upstream}url = \"x\"\n"), "upstreams[1].url"),
        (
            format!("{upstream}[upstreams.credential]\nkind = \"none\"\nkind = \"none\"\n"),
            "upstreams[0].credential.kind",
        ),
        (
            format!("{upstream}{upstream}[upstreams.credential]\nkind = \"none\"\nkind = \"none\"\n"),
            "upstreams[1].credential.kind",
        ),
        ("[limits]\npage_size = 1\npage_size = 2\n".to_owned(), "limits.page_size"),
        ("[[auth.issuers]]\nissuer = \"a\"\nissuer = \"b\"\n".to_owned(), "auth.issuers[0].issuer"),
        ("listen = \nstore = \"x\"\n".to_owned(), "listen"),
    ] {
        assert_eq!(parse(&text).unwrap_err().key, key, "{text}");
    }
}

#[test]
fn bad_values_name_their_key() {
    for (text, key) in [
        ("app = \"shop\"", "app"),
        ("listen = \"nowhere\"", "listen"),
        ("[limits]\nrequest_timeout_secs = 0", "limits.request_timeout_secs"),
        ("[limits]\npage_size = 0", "limits.page_size"),
        ("[limits]\nheader_read_timeout_secs = 0", "limits.header_read_timeout_secs"),
        ("[limits]\nheader_read_timeout_secs = 301", "limits.header_read_timeout_secs"),
        ("[limits]\nbody_read_timeout_secs = 0", "limits.body_read_timeout_secs"),
        ("[limits]\nbody_read_timeout_secs = 100000", "limits.body_read_timeout_secs"),
        ("[limits]\nidle_timeout_secs = 0", "limits.idle_timeout_secs"),
        ("[limits]\nidle_timeout_secs = 86400", "limits.idle_timeout_secs"),
        ("[limits]\nmax_connections = 0", "limits.max_connections"),
        ("[limits]\nmax_connections = 10000000", "limits.max_connections"),
        ("[limits]\nmax_connections = -1", "limits.max_connections"),
        ("[limits]\nmax_streams_per_principal = 0", "limits.max_streams_per_principal"),
        ("[limits]\nmax_listen_filter_entries = 100000", "limits.max_listen_filter_entries"),
        ("[audit]\ntransport_refusal_interval_secs = 0", "audit.transport_refusal_interval_secs"),
        ("[audit]\ntransport_refusal_interval_secs = 86400", "audit.transport_refusal_interval_secs"),
        ("[audit]\ncheckpoint_interval_secs = 0", "audit.checkpoint_interval_secs"),
        ("[audit]\ndurability = \"always\"", "audit.durability"),
        ("[audit]\nretention = 1", "audit.retention"),
        ("[auth]\nleeway_secs = 3600", "auth.leeway_secs"),
        ("[auth]\nmode = \"magic\"", "auth.mode"),
        (
            "[[auth.issuers]]\nissuer = \"https://i\"\njwks_url = \"https://i/jwks\"\nalgorithms = [\"HS256\"]",
            "auth.issuers[0].algorithms",
        ),
        ("[auth]\ndev_issuer = false", "auth.issuers"),
        ("[auth.dev_issuer]\nenabled = false", "auth.issuers"),
        ("listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nauto_approve = true", "auth.dev_issuer.auto_approve"),
        (
            "listen = \"0.0.0.0:8080\"\n[auth.dev_issuer]\nclient_metadata_allow_loopback = true",
            "auth.dev_issuer.client_metadata_allow_loopback",
        ),
        ("listen = \"0.0.0.0:8080\"\n[auth]\njwks_allow_loopback = true", "auth.jwks_allow_loopback"),
        ("[auth.dev_issuer]\naccess_token_ttl_secs = 86400", "auth.dev_issuer.access_token_ttl_secs"),
        ("[auth.dev_issuer]\ndefault_subject = \"a b\"", "auth.dev_issuer.default_subject"),
        ("app = \"conformance\"\nlisten = \"0.0.0.0:8080\"", "listen"),
        ("store = \"mysql://x\"", "store"),
        ("unknown_key = 1", "unknown_key"),
        ("public_url = \"http://x/mcp#frag\"", "public_url"),
        ("events_redis = \"http://cache:6379\"", "events_redis"),
        ("[handles]\nretention_secs = 1", "handles.retention_secs"),
        (
            "[handles.policies.basket]\nttl_secs = 0\nallowed_scopes = [\"a\"]\nmax_scopes = 1\npolicy_version = 1",
            "handles.policies.basket",
        ),
        (
            "[handles.policies.basket]\nttl_secs = 60\nallowed_scopes = [\"a\", \"a\"]\nmax_scopes = 1\npolicy_version = 1",
            "handles.policies.basket",
        ),
        (
            "[handles.policies.basket]\nttl_secs = 60\nallowed_scopes = [\"a\"]\nmax_scopes = 1\npolicy_version = 0",
            "handles.policies.basket",
        ),
        ("[handles]\nsubject_key = \"x\"", "handles.subject_key"),
        ("[killswitch]\nmode = \"maybe\"", "killswitch.mode"),
        ("[killswitch]\nmode = \"authority\"", "killswitch.authority_url"),
        ("[killswitch]\nmode = \"authority\"\nauthority_url = \"http://a:1\"", "killswitch.authority_url"),
        ("[killswitch]\nmode = \"authority\"\nauthority_url = \"https://a:1\"", "killswitch.root_public_key"),
        (
            "[killswitch]\nmode = \"authority\"\nauthority_url = \"https://a:1\"\ngeneration_store = \"mem:\"",
            "killswitch.generation_store",
        ),
        ("[killswitch]\nserver_release = \"\"", "killswitch.server_release"),
        ("[killswitch]\nstream_recheck_secs = 0", "killswitch.stream_recheck_secs"),
        ("[killswitch]\nreplay_window_ms = 60001", "killswitch.replay_window_ms"),
        ("[killswitch]\nauthority_envelope = \"both\"", "killswitch.authority_envelope"),
        ("[legacy]\nversions = []", "legacy.versions"),
        ("[legacy]\nversions = [\"2024-11-05\"]", "legacy.versions"),
        ("[legacy]\nidle_timeout_secs = 1", "legacy.idle_timeout_secs"),
        ("[legacy]\nidle_timeout_secs = 600\nabsolute_timeout_secs = 60", "legacy.absolute_timeout_secs"),
        ("[legacy]\nsticky = true", "legacy.sticky"),
        ("[telemetry]\notlp_endpoint = \"\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = \"collector:4318\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = \"grpc://collector:4317\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = \"file:///tmp/spans\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = \"http://user:secret@collector:4318\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\notlp_endpoint = \"http://collector:4318/?token=x\"", "telemetry.otlp_endpoint"),
        ("[telemetry]\nservice_name = \"\"", "telemetry.service_name"),
        ("[telemetry]\nsampling_ratio = 1.5", "telemetry.sampling_ratio"),
        ("[telemetry]\nsampling_ratio = -0.1", "telemetry.sampling_ratio"),
        ("[telemetry]\nsampling_ratio = nan", "telemetry.sampling_ratio"),
        ("[telemetry]\notlp_headers_file = \"/nonexistent/otlp-headers\"", "telemetry.otlp_headers_file"),
        // Collector credentials never come from the file itself.
        ("[telemetry]\notlp_headers = \"authorization=x\"", "telemetry.otlp_headers"),
        ("[telemetry]\nendpoint = \"http://collector:4318\"", "telemetry.endpoint"),
    ] {
        let error = check(text).unwrap_err();
        assert_eq!(error.key, key, "{text}: {error}");
    }
}

#[test]
fn transport_limits_default_and_are_configurable() {
    let defaults = check("").unwrap();
    assert_eq!(
        (
            defaults.limits.header_read_timeout_secs,
            defaults.limits.body_read_timeout_secs,
            defaults.limits.idle_timeout_secs,
            defaults.limits.max_connections,
            defaults.audit.transport_refusal_interval_secs
        ),
        (10, 30, 60, 1024, 10)
    );
    let file = "[limits]\nheader_read_timeout_secs = 5\nbody_read_timeout_secs = 20\nidle_timeout_secs = 120\n\
                max_connections = 64\n[audit]\ntransport_refusal_interval_secs = 30";
    let custom = check(file).unwrap();
    assert_eq!(
        (
            custom.limits.header_read_timeout_secs,
            custom.limits.body_read_timeout_secs,
            custom.limits.idle_timeout_secs,
            custom.limits.max_connections,
            custom.audit.transport_refusal_interval_secs
        ),
        (5, 20, 120, 64, 30)
    );
    let env = |key: &str| match key {
        "PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS" => Some("3".to_owned()),
        "PALISADE_LIMITS_BODY_READ_TIMEOUT_SECS" => Some("4".to_owned()),
        "PALISADE_LIMITS_IDLE_TIMEOUT_SECS" => Some("5".to_owned()),
        "PALISADE_LIMITS_MAX_CONNECTIONS" => Some("6".to_owned()),
        "PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS" => Some("7".to_owned()),
        _ => None,
    };
    let mut raw = parse(file).unwrap();
    apply_env(&mut raw, &env).unwrap();
    let overridden = validate(raw).unwrap();
    assert_eq!(
        (
            overridden.limits.header_read_timeout_secs,
            overridden.limits.body_read_timeout_secs,
            overridden.limits.idle_timeout_secs,
            overridden.limits.max_connections,
            overridden.audit.transport_refusal_interval_secs
        ),
        (3, 4, 5, 6, 7)
    );
    for (key, value, expected) in [
        ("PALISADE_LIMITS_IDLE_TIMEOUT_SECS", "soon", "PALISADE_LIMITS_IDLE_TIMEOUT_SECS"),
        ("PALISADE_LIMITS_MAX_CONNECTIONS", "-3", "PALISADE_LIMITS_MAX_CONNECTIONS"),
        ("PALISADE_LIMITS_MAX_CONNECTIONS", "0", "limits.max_connections"),
        ("PALISADE_LIMITS_HEADER_READ_TIMEOUT_SECS", "0", "limits.header_read_timeout_secs"),
        ("PALISADE_AUDIT_TRANSPORT_REFUSAL_INTERVAL_SECS", "0", "audit.transport_refusal_interval_secs"),
    ] {
        let bad_env = |k: &str| (k == key).then(|| value.to_owned());
        let mut raw = RawConfig::default();
        let error = apply_env(&mut raw, &bad_env).and_then(|()| validate(raw).map(drop)).unwrap_err();
        assert_eq!(error.key, expected, "{key}={value}");
    }
}

#[test]
fn the_session_wire_is_on_by_default_and_configurable() {
    let defaults = check("").unwrap().legacy;
    assert!(defaults.enabled);
    assert_eq!(defaults.versions, ["2025-11-25", "2025-06-18"]);
    let custom = check(
        "[legacy]\nenabled = false\nversions = [\"2025-06-18\"]\nidle_timeout_secs = 60\nabsolute_timeout_secs = 3600",
    )
    .unwrap()
    .legacy;
    assert!(!custom.enabled);
    assert_eq!(custom.versions, ["2025-06-18"]);
    assert_eq!((custom.idle_timeout.as_secs(), custom.absolute_timeout.as_secs()), (60, 3600));
}

#[test]
fn telemetry_is_off_by_default_and_appends_the_traces_path() {
    assert_eq!(check("").unwrap().telemetry, None);
    assert_eq!(check("[telemetry]\nsampling_ratio = 0.5").unwrap().telemetry, None);
    for (endpoint, url) in [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://otel.example.com/otlp/", "https://otel.example.com/otlp/v1/traces"),
        ("https://otel.example.com/v1/traces", "https://otel.example.com/v1/traces"),
    ] {
        let settings = check(&format!("[telemetry]\notlp_endpoint = \"{endpoint}\"")).unwrap();
        let telemetry = settings.telemetry.unwrap();
        assert_eq!(telemetry.traces_url, url);
        assert_eq!(telemetry.service_name, "palisade");
        assert!((telemetry.sampling_ratio - 1.0).abs() < f64::EPSILON);
        assert!(telemetry.headers.0.is_empty());
        assert!(telemetry.continue_incoming_traces);
    }
    let off = "[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\ncontinue_incoming_traces = false";
    assert!(!check(off).unwrap().telemetry.unwrap().continue_incoming_traces);
}

#[test]
fn telemetry_from_the_environment_and_headers_never_shown() {
    let env = |key: &str| match key {
        "PALISADE_TELEMETRY_OTLP_ENDPOINT" => Some("http://127.0.0.1:4318".to_owned()),
        "PALISADE_TELEMETRY_SERVICE_NAME" => Some("edge".to_owned()),
        "PALISADE_TELEMETRY_SAMPLING_RATIO" => Some("0.25".to_owned()),
        "PALISADE_TELEMETRY_OTLP_HEADERS" => Some("Authorization=Bearer very-secret==, x-tenant=a".to_owned()),
        "PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES" => Some("FALSE".to_owned()),
        _ => None,
    };
    let mut raw = parse("[telemetry]\notlp_endpoint = \"https://elsewhere:4318\"").unwrap();
    apply_env(&mut raw, &env).unwrap();
    let settings = validate(raw).unwrap();
    let telemetry = settings.telemetry.clone().unwrap();
    assert_eq!(telemetry.traces_url, "http://127.0.0.1:4318/v1/traces");
    assert_eq!(telemetry.service_name, "edge");
    assert!((telemetry.sampling_ratio - 0.25).abs() < f64::EPSILON);
    assert!(!telemetry.continue_incoming_traces);
    assert_eq!(
        telemetry.headers.0,
        [("authorization".to_owned(), "Bearer very-secret==".to_owned()), ("x-tenant".to_owned(), "a".to_owned())]
    );
    // `palisade config check` prints the settings: header names only.
    let shown = format!("{settings:#?}");
    assert!(shown.contains("authorization") && !shown.contains("very-secret"), "{shown}");

    for (key, value, expected) in [
        ("PALISADE_TELEMETRY_SAMPLING_RATIO", "often", "PALISADE_TELEMETRY_SAMPLING_RATIO"),
        ("PALISADE_TELEMETRY_SAMPLING_RATIO", "2", "telemetry.sampling_ratio"),
        ("PALISADE_TELEMETRY_OTLP_ENDPOINT", "ftp://collector", "telemetry.otlp_endpoint"),
        ("PALISADE_TELEMETRY_OTLP_HEADERS", "Bearer very-secret", "PALISADE_TELEMETRY_OTLP_HEADERS"),
        ("PALISADE_TELEMETRY_OTLP_HEADERS", "authorization=very-secret\u{7f}", "PALISADE_TELEMETRY_OTLP_HEADERS"),
        ("PALISADE_TELEMETRY_OTLP_HEADERS", "bad name=very-secret", "PALISADE_TELEMETRY_OTLP_HEADERS"),
        ("PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES", "yes", "PALISADE_TELEMETRY_CONTINUE_INCOMING_TRACES"),
    ] {
        let bad_env = |k: &str| (k == key).then(|| value.to_owned());
        let mut raw = RawConfig::default();
        let error = apply_env(&mut raw, &bad_env).and_then(|()| validate(raw).map(drop)).unwrap_err();
        assert_eq!(error.key, expected, "{key}={value}");
        assert!(!error.to_string().contains("very-secret"), "a header value is never echoed: {error}");
    }
}

#[test]
fn collector_headers_from_a_file() {
    let dir = std::env::temp_dir().join(format!("palisade-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("headers");
    std::fs::write(&good, "# collector credentials\nAuthorization: Basic dXNlcjpwYXNz\n\nX-Scope-OrgID: shop\n")
        .unwrap();
    let bad = dir.join("bad-headers");
    std::fs::write(&bad, "Authorization Basic very-secret\n").unwrap();
    let config = |file: &std::path::Path| {
        format!("[telemetry]\notlp_endpoint = \"http://127.0.0.1:4318\"\notlp_headers_file = \"{}\"", file.display())
    };
    let headers = check(&config(&good)).unwrap().telemetry.unwrap().headers;
    assert_eq!(
        headers.0,
        [
            ("authorization".to_owned(), "Basic dXNlcjpwYXNz".to_owned()),
            ("x-scope-orgid".to_owned(), "shop".to_owned())
        ]
    );
    let error = check(&config(&bad)).unwrap_err();
    assert_eq!(error.key, "telemetry.otlp_headers_file");
    assert!(!error.to_string().contains("very-secret"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn environment_overrides_the_file() {
    let env = |key: &str| match key {
        "PALISADE_APP" => Some("conformance".to_owned()),
        "PALISADE_REQUEST_TIMEOUT_SECS" => Some("5".to_owned()),
        _ => None,
    };
    let mut raw = parse("app = \"demo\"").unwrap();
    apply_env(&mut raw, &env).unwrap();
    let settings = validate(raw).unwrap();
    assert_eq!(settings.app, AppChoice::Conformance);
    assert_eq!(settings.limits.request_timeout_secs, 5);
    assert_eq!(settings.auth.mode, AuthMode::None);
    let bad_env = |key: &str| (key == "PALISADE_REQUEST_TIMEOUT_SECS").then(|| "soon".to_owned());
    let mut raw = RawConfig::default();
    assert_eq!(apply_env(&mut raw, &bad_env).unwrap_err().key, "PALISADE_REQUEST_TIMEOUT_SECS");
    // Booleans: true/false, 1/0, on/off in any case; anything else names the key.
    for (value, expected) in [("on", Some(true)), ("OFF", Some(false)), ("1", Some(true)), ("maybe", None)] {
        let env = |key: &str| (key == "PALISADE_DEV_ISSUER").then(|| value.to_owned());
        let mut raw = RawConfig::default();
        match expected {
            Some(expected) => {
                apply_env(&mut raw, &env).unwrap();
                assert_eq!(raw.auth.dev_issuer, Some(RawDevIssuer::Enabled(expected)), "{value}");
            }
            None => assert_eq!(apply_env(&mut raw, &env).unwrap_err().key, "PALISADE_DEV_ISSUER"),
        }
    }
}

/// Collects a derived `Deserialize` struct's field names: serde hands them to
/// `deserialize_struct`, and nothing is deserialized.
struct FieldNames<'a>(&'a mut Vec<&'static str>);

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stop")
    }
}

impl std::error::Error for Stop {}

impl serde::de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> serde::Deserializer<'de> for FieldNames<'_> {
    type Error = Stop;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.0.extend(fields);
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

fn fields<T: for<'de> Deserialize<'de>>(prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    assert!(T::deserialize(FieldNames(&mut names)).is_err());
    assert!(!names.is_empty(), "{prefix}: not a struct");
    names.iter().map(|name| if prefix.is_empty() { (*name).to_owned() } else { format!("{prefix}.{name}") }).collect()
}

/// Every key the file accepts (what serde reads) is in [`OPTIONS`], and every option of the
/// table the file accepts is a key the file reads: one list, no drift.
#[test]
fn the_option_table_is_exactly_the_file_keys() {
    // The gateway's sections are file-only tables (a list of upstreams has no environment or
    // flag form): crates/gateway/src/config.rs documents them, README's gateway section shows them.
    let sections = [
        "limits",
        "http",
        "auth",
        "handles",
        "killswitch",
        "legacy",
        "telemetry",
        "audit",
        "delegation",
        "policies",
        "rate_limit",
        "rate_limits",
        "gateway",
        "pins",
        "upstreams",
        "web",
    ];
    let mut file_keys: Vec<String> =
        fields::<RawConfig>("").into_iter().filter(|key| !sections.contains(&key.as_str())).collect();
    file_keys.extend(fields::<RawLimits>("limits"));
    file_keys.extend(fields::<RawHttp>("http"));
    file_keys.extend(fields::<RawAuth>("auth"));
    file_keys.extend(fields::<RawDevIssuerTable>("auth.dev_issuer"));
    file_keys.extend(fields::<RawIssuer>("auth.issuers[]"));
    file_keys.extend(
        fields::<RawHandles>("handles")
            .into_iter()
            .map(|key| if key == "handles.policies" { "handles.policies.<type>".to_owned() } else { key }),
    );
    file_keys.extend(fields::<RawHandlePolicy>("handles.policies.<type>"));
    file_keys.extend(fields::<RawKillSwitch>("killswitch"));
    file_keys.extend(fields::<RawLegacy>("legacy"));
    file_keys.extend(fields::<RawTelemetry>("telemetry"));
    file_keys.extend(fields::<RawAudit>("audit"));
    file_keys.extend(fields::<RawDelegation>("delegation"));
    file_keys.extend(fields::<super::policies::RawPolicies>("policies"));
    file_keys.extend(fields::<RawRateLimit>("rate_limit"));
    file_keys.push("rate_limits".to_owned());
    file_keys.extend(fields::<RawRateRule>("rate_limits[]"));
    file_keys.sort();
    let mut table: Vec<String> = OPTIONS.iter().filter(|spec| spec.in_file).map(|spec| spec.key.to_owned()).collect();
    table.sort();
    assert_eq!(table, file_keys);
    let mut unique: Vec<&str> = OPTIONS.iter().map(|spec| spec.key).collect();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), OPTIONS.len(), "an option is listed twice");
    for name in OPTIONS.iter().filter_map(|spec| spec.env) {
        assert!(name.starts_with("PALISADE_"), "{name}");
        assert_eq!(OPTIONS.iter().filter(|spec| spec.env == Some(name)).count(), 1, "{name} twice");
    }
    // An environment-only option is refused in the file.
    for spec in OPTIONS.iter().filter(|spec| !spec.in_file) {
        let (section, name) = spec.key.rsplit_once('.').unwrap();
        assert_eq!(parse(&format!("[{section}]\n{name} = \"x\"")).unwrap_err().key, spec.key);
    }
}

/// A sample value of `kind`, as a string (environment, flag) and as TOML.
fn sample(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Text | Kind::Path => ("sample", "\"sample\""),
        Kind::Integer => ("7", "7"),
        Kind::Number => ("0.5", "0.5"),
        Kind::Bool => ("true", "true"),
        Kind::List => ("sample", "[\"sample\"]"),
        Kind::Table => unreachable!("a table has no environment variable or flag"),
    }
}

/// `key = value` as a TOML document.
fn toml_line(key: &str, value: &str) -> String {
    match key.rsplit_once('.') {
        Some((section, name)) => format!("[{section}]\n{name} = {value}"),
        None => format!("{key} = {value}"),
    }
}

/// An option's environment variable and flag set exactly what its file key sets.
#[test]
fn environment_and_flags_set_the_key_they_are_listed_for() {
    for spec in OPTIONS.iter().filter(|spec| spec.in_file && spec.set.is_some()) {
        let (text, toml) = sample(spec.kind);
        let from_file = format!("{:?}", parse(&toml_line(spec.key, toml)).unwrap());
        if let Some(name) = spec.env {
            let mut raw = RawConfig::default();
            apply_env(&mut raw, &|key: &str| (key == name).then(|| text.to_owned())).unwrap();
            assert_eq!(format!("{raw:?}"), from_file, "{name}");
        }
        if let Some(flag) = spec.flag {
            let mut raw = RawConfig::default();
            ConfigFlags(vec![(spec, text.to_owned())]).apply(&mut raw).unwrap();
            assert_eq!(format!("{raw:?}"), from_file, "--{flag}");
        }
    }
}

/// A documented default is the one applied: writing it changes nothing.
#[test]
fn documented_defaults_are_the_defaults() {
    let defaults = format!("{:?}", check("").unwrap());
    let mut checked = 0;
    for spec in OPTIONS {
        let Fallback::Value(value) = spec.default else { continue };
        let toml = match spec.kind {
            Kind::Text | Kind::Path => format!("\"{value}\""),
            _ => value.to_owned(),
        };
        let text = toml_line(spec.key, &toml);
        assert_eq!(format!("{:?}", check(&text).unwrap()), defaults, "{text}");
        checked += 1;
    }
    assert!(checked > 20, "{checked}");
}

/// The configuration flags parse through clap, and a bad one is named by its flag.
#[test]
fn flags_parse_and_name_themselves_in_errors() {
    use clap::{Args as _, FromArgMatches as _};
    let command = ConfigFlags::augment_args(clap::Command::new("t"));
    let args = ["t", "--listen", "127.0.0.1:9", "--allow-host", "a", "--allow-host", "b", "--page-size", "5"];
    let flags = ConfigFlags::from_arg_matches(&command.clone().get_matches_from(args)).unwrap();
    let mut raw = parse("[http]\nallowed_hosts = [\"file\"]").unwrap();
    flags.apply(&mut raw).unwrap();
    assert_eq!(raw.listen.as_deref(), Some("127.0.0.1:9"));
    assert_eq!(raw.http.allowed_hosts, ["file", "a", "b"]);
    assert_eq!(raw.limits.page_size, Some(5));
    let flags = ConfigFlags::from_arg_matches(&command.get_matches_from(["t", "--max-body-bytes", "big"])).unwrap();
    assert_eq!(flags.apply(&mut RawConfig::default()).unwrap_err().key, "--max-body-bytes");
}

#[test]
fn metrics_listen_is_validated() {
    assert_eq!(check("").unwrap().metrics_listen, None);
    let settings = check("metrics_listen = \"127.0.0.1:9464\"").unwrap();
    assert_eq!(settings.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    for text in ["metrics_listen = \"nowhere\"", "listen = \"127.0.0.1:9000\"\nmetrics_listen = \"127.0.0.1:9000\""] {
        assert_eq!(check(text).unwrap_err().key, "metrics_listen", "{text}");
    }
    let env = |key: &str| (key == "PALISADE_METRICS_LISTEN").then(|| "10.0.0.1:9464".to_owned());
    let mut raw = RawConfig::default();
    apply_env(&mut raw, &env).unwrap();
    assert_eq!(validate(raw).unwrap().metrics_listen, Some("10.0.0.1:9464".parse().unwrap()));
}

/// The line before README's option list.
const README_BEGIN: &str = "<!-- options: generated by `cargo run -p xtask -- readme-config`; edit OPTIONS in crates/host/src/settings/options.rs -->";
/// The line after it.
const README_END: &str = "<!-- options: end -->";

/// README's option list is [`options_markdown`]; `cargo run -p xtask -- readme-config` rewrites it.
#[test]
fn readme_lists_every_option() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let (_, rest) = readme.split_once(README_BEGIN).expect("README has the option list's begin marker");
    let (block, _) = rest.split_once(README_END).expect("README has the option list's end marker");
    assert!(
        block.trim() == options_markdown().trim(),
        "README's option list is stale: run `cargo run -p xtask -- readme-config`"
    );
}
