//! The text patterns the findings read with: instructions addressed to the model, exfiltration
//! cues, secrets, files and URLs, and where a sentence ends. Each is a constant; the tests compile
//! every one, so none can fail at run time. Matching is case-insensitive where it says `(?i)` and
//! always runs on text with hidden characters already removed (`crate::scan`).

use std::sync::LazyLock;

use regex::Regex;

/// Compiles constant patterns (each compiled by the tests, so none can fail at run time).
pub(crate) fn patterns(sources: &[&str]) -> Vec<Regex> {
    sources.iter().map(|source| Regex::new(source).expect("a constant pattern compiles")).collect()
}

/// Where a sentence ends: `.`, `!`, `?` or `;` before white space or the end, or a line break
/// (so a URL's dots do not split it).
pub(crate) static SENTENCE_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[.!?;]+(?:\s+|$)|\n").expect("a constant pattern compiles"));

pub(crate) static INSTRUCTIONS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    patterns(&[
        r"(?i)\b(?:ignore|disregard|forget|override|bypass)\s+(?:(?:all|any|the|your|these|those|every|of|my)\s+)*(?:previous|prior|above|earlier|preceding|other|system|existing|original)\s+(?:instructions?|rules|directions|guidelines|prompts?|context|polic(?:y|ies)|messages?)\b",
        r"(?i)\b(?:ignore|disregard|forget)\s+(?:all|everything)\s+(?:else|above|before)\b",
        r"(?i)\byou\s+(?:must|shall|are\s+(?:required|instructed)\s+to|should\s+(?:always|never))\b",
        r"(?i)\b(?:always|never)\s+(?:call|use|invoke|run|send|include|pass|read|forward|upload|ask|tell|mention|reveal)\b",
        r"(?i)\b(?:do\s+not|don't|dont|never)\s+(?:tell|inform|mention|reveal|show|notify|alert|let|ask)\b.{0,40}?\b(?:users?|humans?|operators?)\b",
        r"(?i)\bwithout\s+(?:telling|informing|asking|notifying|alerting|showing|mentioning)\b",
        r"(?i)\b(?:secretly|covertly)\b",
        r"(?i)\bsilently\s+(?:send|call|include|add|forward|copy|read|upload|pass|run|execute)\b",
        r"(?i)<\s*/?\s*(?:important|system|instructions?|admin|assistant|user|prompt|hidden|secret|im_start|im_end)\s*>",
        r"(?i)\[\s*/?\s*(?:system|important|instructions?|admin|inst)\s*\]",
        r"(?i)\b(?:system\s+prompt|new\s+instructions|you\s+are\s+now|from\s+now\s+on|pretend\s+(?:to\s+be|you\s+are)|as\s+an\s+ai)\b",
        r"(?i)\bbefore\s+(?:using|calling|invoking|running)\s+(?:this|any|the|another)\b",
        r"(?i)\b(?:very\s+|extremely\s+)?important\s*[:!]",
        r"(?i)\bthis\s+is\s+(?:very\s+|extremely\s+)?important\b",
    ])
});

pub(crate) static SECRETS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    patterns(&[
        r"(?i)(?:\b|_)(id_(?:rsa|dsa|ecdsa|ed25519))\b",
        r"(?i)(?:^|[^a-z0-9_])(\.(?:ssh|env|aws|kube|docker|gnupg|npmrc|netrc|pgpass|pypirc|git-credentials))\b",
        r"(?i)\b(?:ssh|private|secret|signing)[\s_-]*keys?\b",
        r"(?i)\bapi[\s_-]*keys?\b",
        r"(?i)\b(?:access|auth|bearer|refresh|session|oauth|github|gitlab|slack|api|secret|id)[\s_-]*tokens?\b",
        r"(?i)\bpass(?:words?|wd|phrases?)\b",
        r"(?i)\bcredentials?\b",
        r"(?i)\bsecrets?\b",
        r"(?i)\bkubeconfig\b",
        r"(?i)\b(?:seed|recovery)[\s_-]*phrases?\b",
        r"(?i)\bmnemonic\b",
        r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_(?:TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIALS)\b",
    ])
});

pub(crate) static FILES: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    patterns(&[
        r#"(?:^|[\s"'(`=:,])((?:~|\$HOME|\$\{HOME\}|%USERPROFILE%|%APPDATA%|%HOMEPATH%)[/\\][^\s"'`)]*)"#,
        // The home directory itself, as a command's argument (`chmod -R 0666 ~;`).
        r#"(?:^|[\s"'(`=:,])(~)(?:[;&|\s"'`)]|$)"#,
        r#"(?:^|[\s"'(`=:,])(/(?:etc|home|root|var|usr|tmp|proc|sys|dev|opt|srv|mnt|Users|Library|private|bin|boot)\b(?:/[^\s"'`)]*)?)"#,
        r#"\b[A-Za-z]:\\[^\s"'`)]*"#,
        r#"(?:^|[\s"'(`=:,])(\.\.[/\\][^\s"'`)]*)"#,
        r#"(?i)\bfile:/[^\s"'`)]*"#,
    ])
});

pub(crate) static URLS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    patterns(&[
        r#"(?i)\b(?:https?|wss?|s?ftp)://[^\s"'<>`]+"#,
        r#"(?i)\bwww\.[a-z0-9-]+(?:\.[a-z0-9-]+)+[^\s"'<>`]*"#,
        r#"(?i)\bdata:[a-z]+/[^\s"'<>`]+"#,
    ])
});

/// Cues of exfiltration: data of the user's (contents, history, keys) to be sent somewhere, or
/// smuggled into an argument the user will not read. Each names both the data and where it goes,
/// so that "sends a message to a channel" (a messaging tool's purpose) is not one.
pub(crate) static EXFILTRATION: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    patterns(&[
        // "send/forward/upload … (contents|history|keys|…) … to http://, an e-mail address, a webhook"
        r"(?i)\b(?:send|sends|forward|upload|post|transmit|exfiltrate|leak|email|e-mail|copy|report)\b(?:[^.\n]|\.\S){0,80}?\b(?:contents?|conversation|chat|history|messages|files?|keys?|tokens?|credentials?|secrets?|passwords?|environment|env|data)\b(?:[^.\n]|\.\S){0,80}?\bto\s+(?:https?://\S+|\S+@\S+\.[a-z]{2,}|(?:a|an|the|this|our|my)?\s*(?:webhook|remote|external|attacker|collection|logging)\b)",
        // "include/embed/append … (contents|history|keys|…) in/into/as … the (sidenote|url|query|…)"
        r"(?i)\b(?:include|embed|put|append|add|pass|attach|insert|encode|hide)\b(?:[^.\n]|\.\S){0,80}?\b(?:contents?|conversation|chat|history|previous\s+messages|files?|keys?|tokens?|credentials?|secrets?|passwords?|mcp\.json|id_rsa|environment\s+variables)\b(?:[^.\n]|\.\S){0,80}?\b(?:in|into|to|as|inside|within)\s+(?:the\s+|a\s+|an\s+)?(?:'|\x22|`)?(?:sidenote|side\s+note|note|notes|url|query|query\s+string|parameter|argument|field|header|comment|metadata|request|image\s+url)\b",
        // The parameter name of the published tool-poisoning attacks.
        r"(?i)\bside[\s_-]?note\b",
        // "read … (mcp.json|id_rsa|.env|…) and pass/send it"
        r"(?i)\bread\b(?:[^.\n]|\.\S){0,60}?(?:mcp\.json|id_rsa|\.ssh|\.env\b|credentials|\.aws|\.kube)(?:[^.\n]|\.\S){0,80}?\b(?:and|then)\s+(?:pass|send|include|forward|provide|upload|return)\b",
        // Any recipient or destination changed by the description: "change/redirect the recipient to"
        r"(?i)\b(?:change|redirect|replace|set|override)\s+(?:the\s+|all\s+|every\s+)?(?:recipient|destination|receiver|to\s+address|phone\s+number|email\s+address|account|endpoint)s?\b(?:[^.\n]|\.\S){0,40}?\bto\b",
    ])
});
