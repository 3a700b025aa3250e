//! Which keys of a configuration file a reload may change: [`RELOADABLE`], by dotted name, and
//! [`restart_only_changes`], every other key that differs between two versions of the file, by
//! its dotted name (`listen`, `pins.require_signed`, `web.tls_key_file`).

use std::collections::BTreeSet;

use toml::{Table, Value};

/// The keys a reload applies, dotted: the gateway's upstreams, the rate-limit rules, the policy
/// files and the argument view's bounds. Every other key (listen addresses, the store, issuers,
/// keys, `[gateway]`, `[pins]`, `[web]`, `policies.require_signed`, `policies.group_claims` —
/// read by the token verifier —, `[rate_limit]`'s store, …) takes effect only at a restart.
pub const RELOADABLE: &[&str] = &[
    "upstreams",
    "rate_limits",
    "policies.files",
    "policies.max_argument_depth",
    "policies.max_argument_bytes",
    "policies.max_argument_entries",
];

/// Every key outside [`RELOADABLE`] whose value differs between `old` and `new` (added, removed
/// or changed), dotted, in order; empty when a reload may apply `new`.
pub fn restart_only_changes(old: &Table, new: &Table) -> Vec<String> {
    let mut out = Vec::new();
    compare("", old, new, &mut out);
    out
}

fn compare(prefix: &str, old: &Table, new: &Table, out: &mut Vec<String>) {
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for key in keys {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        if RELOADABLE.contains(&path.as_str()) {
            continue;
        }
        let empty = Table::new();
        match (old.get(key), new.get(key)) {
            (Some(Value::Table(old)), Some(Value::Table(new))) => compare(&path, old, new, out),
            // A table added or removed whole: each of its keys, so adding `[policies] files`
            // is a reloadable change and adding `[pins] require_signed` is not.
            (Some(Value::Table(old)), None) => compare(&path, old, &empty, out),
            (None, Some(Value::Table(new))) => compare(&path, &empty, new, out),
            (old, new) if old == new => {}
            _ => out.push(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        text.parse().expect("toml")
    }

    #[test]
    fn upstreams_may_change_and_everything_else_is_named() {
        let old =
            table("listen = \"127.0.0.1:1\"\n[pins]\nrelist_secs = 1\n[[upstreams]]\nid = \"a\"\nurl = \"http://a\"\n");
        let same_but_upstreams =
            table("listen = \"127.0.0.1:1\"\n[pins]\nrelist_secs = 1\n[[upstreams]]\nid = \"b\"\nurl = \"http://b\"\n");
        assert!(restart_only_changes(&old, &same_but_upstreams).is_empty());
        let changed = table(
            "listen = \"127.0.0.1:2\"\n[pins]\nrelist_secs = 2\nrequire_signed = true\n[auth]\ndev_issuer = true\n",
        );
        assert_eq!(
            restart_only_changes(&old, &changed),
            ["auth.dev_issuer", "listen", "pins.relist_secs", "pins.require_signed"]
        );
        assert_eq!(
            restart_only_changes(&changed, &table("")),
            ["auth.dev_issuer", "listen", "pins.relist_secs", "pins.require_signed"]
        );
        let policies =
            table("[policies]\nfiles = [\"a.cedar\"]\nrequire_signed = true\n[[rate_limits]]\nname = \"a\"\n");
        let widened =
            table("[policies]\nfiles = [\"b.cedar\"]\nrequire_signed = true\n[[rate_limits]]\nname = \"b\"\n");
        assert!(restart_only_changes(&policies, &widened).is_empty());
        // Signing cannot be switched off by a reload.
        let unsigned = table("[policies]\nfiles = [\"b.cedar\"]\n");
        assert_eq!(restart_only_changes(&policies, &unsigned), ["policies.require_signed"]);
        // Policies configured for the first time reload; switching signing on does not.
        assert!(restart_only_changes(&table(""), &unsigned).is_empty());
        assert_eq!(restart_only_changes(&table(""), &policies), ["policies.require_signed"]);
    }
}
