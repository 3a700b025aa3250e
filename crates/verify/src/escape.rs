//! What a target controls (tool names, error messages, anything a detail quotes), made safe to
//! show. One rule, [`hidden`], says which characters never reach an output as themselves: control
//! characters (C0 with ESC, DEL, C1), bidirectional controls, invisible formatting, line and
//! paragraph separators and noncharacters. Each output writes them its own visible way:
//!
//! - [`visible`], for the terminal (progress lines, the summary table) and inside every other
//!   format: `\u{1b}`, `\n`, … (so `ESC[2K ESC[1A` cannot erase or overwrite a line);
//! - [`markdown_cell`]: [`visible`], then every character Markdown or HTML reads as markup
//!   (`|`, `` ` ``, `\`, `*`, `_`, `[`, `]`, `!`, `~`, `<`, `>`, `&`) as an HTML entity, so a
//!   cell stays one cell of plain text;
//! - [`json`]: a document serde wrote, whose strings already carry C0 characters as `\u00XX`,
//!   with the rest of [`hidden`] (which serde leaves as they are) written `\uXXXX` too.

use std::borrow::Cow;

/// Whether `c` must not reach an output as itself: the one rule of what is hidden that the
/// gateway's review also shows ([`palisade_base::reveal::classify`]: controls, bidi, zero-width,
/// tag, variation-selector, other invisible, private-use, noncharacter and unassigned code
/// points).
pub fn hidden(c: char) -> bool {
    palisade_base::reveal::classify(c).is_some()
}

/// `text` with every [`hidden`] character written as a visible escape (`\n`, `\r`, `\t`, else
/// `\u{…}` in hexadecimal).
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => shown.push_str("\\n"),
            '\r' => shown.push_str("\\r"),
            '\t' => shown.push_str("\\t"),
            c if hidden(c) => shown.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => shown.push(c),
        }
    }
    Cow::Owned(shown)
}

/// `text` as the content of one Markdown table cell: [`visible`], and markup characters as
/// HTML entities.
pub fn markdown_cell(text: &str) -> String {
    let mut cell = String::with_capacity(text.len() + 16);
    for c in visible(text).chars() {
        match c {
            '&' => cell.push_str("&amp;"),
            '<' => cell.push_str("&lt;"),
            '>' => cell.push_str("&gt;"),
            '|' | '`' | '\\' | '*' | '_' | '[' | ']' | '!' | '~' => cell.push_str(&format!("&#{};", u32::from(c))),
            c => cell.push(c),
        }
    }
    cell
}

/// A JSON document serde wrote, with every [`hidden`] character left in its strings written as
/// `\uXXXX`. Outside strings serde writes only ASCII punctuation, digits, letters and white space,
/// so the white space it uses there (newline, carriage return, tab) is kept as it is.
pub fn json(document: &str) -> Cow<'_, str> {
    let escaped = |c: char| hidden(c) && !matches!(c, '\n' | '\r' | '\t');
    if !document.chars().any(escaped) {
        return Cow::Borrowed(document);
    }
    let mut out = String::with_capacity(document.len() + 16);
    for c in document.chars() {
        if escaped(c) {
            // One `\uXXXX` per UTF-16 unit: a surrogate pair outside the Basic Multilingual Plane
            // (tag characters, private use), as JSON writes them.
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str = "tool\u{1b}[2K\u{1b}[1A\r\nFAIL\u{9b}31m\u{202e}evil\u{7f}\u{e0041}";

    #[test]
    fn nothing_hidden_reaches_a_terminal() {
        let shown = visible(HOSTILE);
        assert_eq!(shown, "tool\\u{1b}[2K\\u{1b}[1A\\r\\nFAIL\\u{9b}31m\\u{202e}evil\\u{7f}\\u{e0041}");
        assert!(!shown.chars().any(hidden));
        assert!(matches!(visible("plain text, ünïcode"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_markdown_cell_is_plain_text() {
        let cell = markdown_cell("a|b `c` \\| [x](javascript:y) ![i](http://t/) <b>&amp; *_~\u{1b}");
        assert!(!cell.contains(['|', '`', '[', ']', '<', '>', '*', '_', '~', '!', '\u{1b}']), "{cell}");
        assert!(!cell.contains('\\'), "{cell}");
        assert!(cell.starts_with("a&#124;b &#96;c&#96; &#92;&#124;"), "{cell}");
        assert!(cell.contains("&lt;b&gt;&amp;amp;"), "{cell}");
        assert!(cell.ends_with("&#92;u{1b}"), "{cell}");
    }

    #[test]
    fn json_keeps_its_meaning_and_shows_nothing_hidden() {
        let value = serde_json::json!({ "name": HOSTILE, "list": [1, 2] });
        let written = serde_json::to_string_pretty(&value).unwrap();
        // serde escapes C0 itself, not C1, DEL or bidirectional controls.
        assert!(!written.contains('\u{1b}') && written.contains('\u{9b}'));
        let safe = json(&written);
        assert!(!safe.chars().any(|c| hidden(c) && !matches!(c, '\n' | '\r' | '\t')), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}
