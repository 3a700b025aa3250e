//! The gateway's protected paths (its secrets, data and audit directories, configuration) named
//! as a stdio launch's argument: `palisade upstreams show` refuses the launch instead of hashing
//! the file and printing its digest, and `upstreams approve` cannot approve it.

use crate::gateway_boundary::GatewayUnderTest;

#[test]
fn a_launch_naming_the_server_secret_is_refused_not_hashed_and_shown() {
    // `true` ignores its arguments: only the launch's naming of the file matters.
    let gateway = GatewayUnderTest::new("");
    let data = gateway.config.trim_end_matches("palisade.toml").to_owned() + "data";
    let secret = format!("{data}/server-secret");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let sha: String = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, "ab".repeat(32).as_bytes())
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let text = std::fs::read_to_string(&gateway.config).unwrap();
    let entry = format!("[[upstreams]]\nid = \"files\"\ncommand = \"/bin/true\"\nargs = [\"--key\", \"{secret}\"]\n");
    std::fs::write(&gateway.config, format!("{text}{entry}")).unwrap();

    let shown = gateway.cli(&["upstreams", "show", "files"]);
    let out = format!("{}{}", String::from_utf8_lossy(&shown.stdout), String::from_utf8_lossy(&shown.stderr));
    assert!(!shown.status.success(), "{out}");
    assert!(out.contains("args[1]") && out.contains("which the gateway protects"), "{out}");
    assert!(!out.contains(&sha), "the secret's digest is never shown: {out}");

    let approved = gateway.cli(&["upstreams", "approve", "files", "--reviewer", "alice", "--digest", "000000000000"]);
    assert!(!approved.status.success());
    let out = format!("{}{}", String::from_utf8_lossy(&approved.stdout), String::from_utf8_lossy(&approved.stderr));
    assert!(out.contains("which the gateway protects"), "{out}");
    assert!(!out.contains(&sha), "{out}");
}
