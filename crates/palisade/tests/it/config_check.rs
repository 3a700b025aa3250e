//! `palisade config check` through the binary: every form of configuration error names its key
//! by the full dotted path (a table's key by its table, an upstream's by its index, a nested
//! table inside an upstream by both) with "did you mean" where a known key is close, and a
//! valid file is summarised as what will run, not as a Debug dump.

use std::process::{Command, Output};

use crate::harness::TempDir;

fn config_check(dir: &TempDir, text: &str, envs: &[(&str, &str)]) -> Output {
    let file = dir.0.join("palisade.toml");
    std::fs::write(&file, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["config", "check", file.to_str().unwrap()])
        .envs(envs.iter().copied())
        .output()
        .expect("run palisade")
}

const HTTP_UPSTREAM: &str = "[[upstreams]]\nid = \"fx\"\nurl = \"http://127.0.0.1:9/mcp\"\n";

/// The one error line a refused file gets: exit status 2, and nothing on stdout.
fn refused(dir: &TempDir, text: &str, envs: &[(&str, &str)]) -> String {
    let output = config_check(dir, text, envs);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
    assert!(output.stdout.is_empty(), "{text}: {}", String::from_utf8_lossy(&output.stdout));
    stderr.lines().find(|line| line.starts_with("error: ")).unwrap_or_else(|| panic!("{text}: {stderr}")).to_owned()
}

#[test]
fn every_configuration_error_names_its_full_key() {
    let dir = TempDir::new();
    let second = format!("{HTTP_UPSTREAM}[[upstreams]]\nid = \"fy\"\nurl = \"http://127.0.0.1:10/mcp\"\n");
    for (text, expected) in [
        // Unknown keys: top level, in a table, in a table of a table, in an array element, in a
        // table inside an array element; "did you mean" only where a key is close.
        ("colour = \"blue\"\n".to_owned(), "error: config: colour: unknown key (unknown field `colour`"),
        (
            format!("[pins]\nrelist_sec = 5\n{HTTP_UPSTREAM}"),
            "error: config: pins.relist_sec: unknown key; did you mean `relist_secs`?",
        ),
        (
            "[auth.dev_issuer]\nauto_aprove = true\n".to_owned(),
            "error: config: auth.dev_issuer.auto_aprove: unknown key; did you mean `auto_approve`?",
        ),
        (
            "[auth.dev_issuer]\nissuer_url = \"http://127.0.0.1:8080\"\n".to_owned(),
            "error: config: auth.dev_issuer.issuer_url: unknown key (unknown field `issuer_url`, expected one of \
             `enabled`",
        ),
        (format!("{second}prefx = \"b\"\n"), "error: config: upstreams[1].prefx: unknown key; did you mean `prefix`?"),
        (
            format!("{second}[upstreams.credential]\nkind = \"static\"\nheadr = \"X-Api-Key\"\n"),
            "error: config: upstreams[1].credential.headr: unknown key; did you mean `header`?",
        ),
        (
            "[[auth.issuers]]\nissuer = \"https://i\"\njwks_url = \"https://i/jwks\"\nalgorithm = [\"ES256\"]\n"
                .to_owned(),
            "error: config: auth.issuers[0].algorithm: unknown key; did you mean `algorithms`?",
        ),
        // Values of the wrong type.
        (
            "[auth]\ndev_issuer = \"yes\"\n".to_owned(),
            "error: config: auth.dev_issuer: invalid type: string \"yes\", expected true, false or an \
             [auth.dev_issuer] table",
        ),
        ("[limits]\npage_size = \"ten\"\n".to_owned(), "error: config: limits.page_size: invalid type: string"),
        (format!("{second}prefix = 5\n"), "error: config: upstreams[1].prefix: invalid type: integer `5`"),
        // Values the validators refuse.
        ("[auth]\nleeway_secs = 3600\n".to_owned(), "error: config: auth.leeway_secs: must be at most"),
        (
            format!("{second}command = \"/bin/true\"\n"),
            "error: config: upstreams[1].command: give either url (HTTP) or command (stdio), not both",
        ),
        // TOML the parser refuses, located by the line it is on: an array element's by its index.
        (format!("{second}url = \"http://127.0.0.1:11/mcp\"\n"), "error: config: upstreams[1].url: duplicate key"),
        (
            format!("{second}[upstreams.credential]\nkind = \"none\"\nkind = \"none\"\n"),
            "error: config: upstreams[1].credential.kind: duplicate key",
        ),
        ("[limits]\npage_size = \n".to_owned(), "error: config: limits.page_size: "),
    ] {
        let line = refused(&dir, &text, &[]);
        assert!(line.starts_with(expected), "{text}\n  got: {line}\n want: {expected}");
        assert!(!line.contains("untagged") && !line.contains("variant"), "{line}");
    }
    // A value from the environment: a variable that cannot be read is named itself; a value
    // the validator refuses is named by its key, saying which variable it came from.
    let line = refused(&dir, "", &[("PALISADE_DEV_ISSUER", "maybe")]);
    assert_eq!(line, "error: config: PALISADE_DEV_ISSUER: must be true or false");
    let line = refused(&dir, "listen = \"127.0.0.1:8080\"\n", &[("PALISADE_LISTEN", "nowhere")]);
    assert!(line.starts_with("error: config: listen: must be an IP address and port"), "{line}");
    assert!(line.ends_with(" (the value of PALISADE_LISTEN)"), "{line}");
}

#[test]
fn config_check_summarises_what_will_run() {
    let dir = TempDir::new();
    let data = dir.0.join("data");
    let text = format!(
        "listen = \"127.0.0.1:8800\"\ndata_dir = \"{data}\"\n\
         [auth]\nmode = \"bearer\"\n\
         [[auth.issuers]]\nissuer = \"https://idp.example.com\"\njwks_url = \"https://idp.example.com/jwks\"\n\
         algorithms = [\"ES256\"]\n\
         {HTTP_UPSTREAM}\
         [upstreams.credential]\nkind = \"static\"\nheader = \"X-Api-Key\"\nsecret_env = \"FX_KEY\"\n\
         [[upstreams]]\nid = \"local\"\ncommand = \"/bin/cat\"\nargs = [\"-u\"]\n\
         [web]\nlisten = \"127.0.0.1:8443\"\npublic_url = \"https://gateway.example.com/\"\n\
         tls_cert_file = \"{data}/cert.pem\"\ntls_key_file = \"{data}/key.pem\"\n",
        data = data.display()
    );
    let output = config_check(&dir, &text, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let expected = [
        "app:                gateway, fronting 2 upstreams".to_owned(),
        "listen:             http://127.0.0.1:8800 (public URL http://127.0.0.1:8800/mcp)".to_owned(),
        format!("store:              sqlite:{}/palisade.db", data.display()),
        "authentication:     bearer, issuers https://idp.example.com".to_owned(),
        "development issuer: off (never on by default for the gateway".to_owned(),
        format!("audit:              segment {}/audit-segment", data.display()),
        "upstream:           fx: Streamable HTTP http://127.0.0.1:9/mcp (2026-07-28, else the 2025 session wire, \
         static credential), names fx_…"
            .to_owned(),
        "upstream:           local: stdio, runs /bin/cat -u (confinement bubblewrap, network off,".to_owned(),
        "web pages:          https://127.0.0.1:8443 as https://gateway.example.com/ (review page off)".to_owned(),
    ];
    for line in expected {
        assert!(stdout.lines().any(|printed| printed.starts_with(&line)), "no line {line:?} in:\n{stdout}");
    }
    assert!(stdout.ends_with("ok\n"), "{stdout}");
    assert!(!stdout.contains("Settings {") && !stdout.contains("Some("), "no Debug forms: {stdout}");
    assert!(!stdout.contains("FX_KEY"), "not even a secret's source: {stdout}");

    // Without [web], the summary says the pages are off.
    let output = config_check(&dir, &format!("[auth]\ndev_issuer = true\n{HTTP_UPSTREAM}"), &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("web pages:          off (no [web] section)"), "{stdout}");
    assert!(stdout.contains("development issuer: on (auth.dev_issuer = true)"), "{stdout}");
}
