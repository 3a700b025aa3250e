//! Names that imitate another's: a tool (prompt, resource) whose name reads like a name the
//! caller already trusts — `sеnd_email` with a Cyrillic `е`, `read_fiIe` with a capital `I`,
//! `g1thub_search` — so that a model or a person picks it instead. Two names imitate each other
//! when they differ, yet their [`skeleton`]s (each character mapped to the Latin letter it looks
//! like) are equal; case and separators alone (`read-file`, `readFile`) never count, since honest
//! servers differ in style. A name that mixes letters of two scripts is flagged on its own.
//!
//! The confusables are a short table of the letters that pass for Latin ones (Cyrillic, Greek,
//! fullwidth forms, `0`/`1`, capital `I`, `rn`, `vv`): Unicode's full confusables table would flag
//! honest non-Latin names, which a reviewer reads as themselves.

/// Tool names of widely deployed MCP servers (the reference servers and popular SaaS servers),
/// which an imitation would most likely copy: a definition whose name imitates one is flagged even
/// when no other tool of the same deployment carries it. Only compound names: a plain word
/// (`fetch`, `search`, `query`) is ordinary prose in any description.
pub const WELL_KNOWN: &[&str] = &[
    "read_file",
    "read_text_file",
    "read_multiple_files",
    "write_file",
    "edit_file",
    "list_directory",
    "directory_tree",
    "move_file",
    "search_files",
    "get_file_info",
    "create_directory",
    "git_status",
    "git_diff",
    "git_commit",
    "git_log",
    "create_issue",
    "create_pull_request",
    "search_repositories",
    "get_file_contents",
    "push_files",
    "create_or_update_file",
    "send_message",
    "send_email",
    "slack_post_message",
    "list_channels",
    "execute_command",
    "run_command",
    "create_entities",
    "read_graph",
    "browser_navigate",
    "get_current_time",
];

/// The name as its letters look: confusables mapped to the Latin letter they pass for, lower
/// case, separators (`_`, `-`, `.`, space) removed.
pub fn skeleton(name: &str) -> String {
    let mut mapped = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '_' | '-' | '.' | ' ') {
            continue;
        }
        mapped.push(confusable(c));
    }
    mapped.replace("rn", "m").replace("vv", "w")
}

/// The name with case and separators ignored, nothing else: two names equal here are one name
/// written in two styles, not an imitation.
fn loose(name: &str) -> String {
    name.chars().filter(|c| !matches!(c, '_' | '-' | '.' | ' ')).flat_map(char::to_lowercase).collect()
}

/// The Latin letter (lower case) `c` passes for, or `c` lower-cased.
fn confusable(c: char) -> char {
    let mapped = match c {
        'I' | '1' | '|' | 'ӏ' | 'Ӏ' | 'ǀ' | 'ι' | 'Ι' | 'І' | 'і' => 'l',
        '0' | 'о' | 'О' | 'ο' | 'Ο' | 'σ' | 'օ' => 'o',
        'а' | 'А' | 'α' | 'Α' | 'ɑ' => 'a',
        'е' | 'Е' | 'ε' | 'Ε' | 'ё' => 'e',
        'р' | 'Р' | 'ρ' | 'Ρ' => 'p',
        'с' | 'С' | 'ϲ' | 'Ϲ' => 'c',
        'у' | 'У' | 'γ' | 'Υ' | 'υ' => 'y',
        'х' | 'Х' | 'χ' | 'Χ' => 'x',
        'ѕ' | 'Ѕ' => 's',
        'ј' | 'Ј' => 'j',
        'ԁ' => 'd',
        'ɡ' => 'g',
        'һ' | 'Н' | 'Η' => 'h',
        'к' | 'К' | 'κ' | 'Κ' => 'k',
        'м' | 'М' | 'Μ' => 'm',
        'т' | 'Т' | 'τ' | 'Τ' => 't',
        'в' | 'В' | 'Β' => 'b',
        'ν' | 'Ν' => 'v',
        'ԝ' | 'ѡ' => 'w',
        'Ζ' => 'z',
        // Fullwidth ASCII.
        '\u{FF01}'..='\u{FF5E}' => char::from_u32(u32::from(c) - 0xFEE0).unwrap_or(c),
        other => other,
    };
    mapped.to_lowercase().next().unwrap_or(mapped)
}

/// The scripts a name's letters come from, by block (Latin, Greek, Cyrillic, Armenian, Cherokee,
/// fullwidth); digits, separators and other characters count for none.
fn scripts(name: &str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for c in name.chars().filter(|c| c.is_alphabetic()) {
        let script = match u32::from(c) {
            0x0041..=0x024F | 0x1E00..=0x1EFF => "Latin",
            0x0370..=0x03FF | 0x1F00..=0x1FFF => "Greek",
            0x0400..=0x052F => "Cyrillic",
            0x0530..=0x058F => "Armenian",
            0x13A0..=0x13FF => "Cherokee",
            0xFF00..=0xFFEF => "fullwidth",
            _ => "other",
        };
        if !out.contains(&script) {
            out.push(script);
        }
    }
    out
}

/// Why `name` imitates another name, given the lower-case names of the other tools the caller
/// knows (and [`WELL_KNOWN`]): the names it passes for, or the scripts it mixes. Empty: none.
pub(crate) fn imitations<'a>(name: &str, others: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out = Vec::new();
    let mixed = scripts(name);
    if mixed.len() > 1 || mixed.contains(&"fullwidth") {
        out.push(format!("mixes letters of {} ({})", mixed.join(" and "), code_points(name)));
    }
    let (own_skeleton, own_loose) = (skeleton(name), loose(name));
    if own_skeleton.chars().count() < 3 {
        return out;
    }
    let mut imitated: Vec<&str> = Vec::new();
    for other in others.into_iter().chain(WELL_KNOWN.iter().copied()) {
        if loose(other) != own_loose && skeleton(other) == own_skeleton && !imitated.contains(&other) {
            imitated.push(other);
        }
    }
    for other in imitated {
        out.push(format!("reads as \"{other}\" ({})", code_points(name)));
    }
    out
}

/// The characters of `name` that are not plain ASCII letters, digits or separators, or the
/// ASCII look-alikes (`0`, `1`, `I`), with their positions: `U+0435 at 1`.
fn code_points(name: &str) -> String {
    let odd: Vec<String> = name
        .chars()
        .enumerate()
        .filter(|(_, c)| !c.is_ascii() || matches!(c, '0' | '1' | 'I' | '|'))
        .map(|(at, c)| format!("U+{:04X} at {at}", u32::from(c)))
        .collect();
    if odd.is_empty() { "letters that look alike".to_owned() } else { odd.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn look_alike_names_share_a_skeleton_and_styles_do_not_count() {
        assert_eq!(skeleton("sеnd_email"), "sendemail");
        assert_eq!(skeleton("read_fiIe"), "readfile");
        assert_eq!(skeleton("ＲＥＡＤ_file"), "readfile");
        assert_eq!(skeleton("g1thub"), "glthub");
        assert_eq!(
            imitations("sеnd_email", []),
            ["mixes letters of Latin and Cyrillic (U+0435 at 1)", "reads as \"send_email\" (U+0435 at 1)"]
        );
        assert_eq!(imitations("read_fiIe", ["search"]), ["reads as \"read_file\" (U+0049 at 7)"]);
        assert_eq!(imitations("docs_seаrch", ["docs_search"]).len(), 2);
        // Style differences and honest names are not imitations.
        for honest in
            ["read-file", "ReadFile", "read_file", "get_weather", "list_items", "s3_list_buckets", "天気", "météo"]
        {
            assert!(imitations(honest, ["read_file", "list_ltems_x"]).is_empty(), "{honest}");
        }
        // Greek alone is a script of its own, not a mix.
        assert!(imitations("λογισμός", []).is_empty());
        assert!(!imitations("ｒｅａｄ", []).is_empty(), "fullwidth letters pass for ASCII");
    }
}
