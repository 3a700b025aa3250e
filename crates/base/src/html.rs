//! HTML escaping of text placed in an element or a quoted attribute: the one escape every page
//! of the workspace uses (the development issuer's consent page, the gateway's web pages).

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by character references: safe inside an
/// element and inside a single- or double-quoted attribute value (never in an unquoted
/// attribute, a `<script>` or a `<style>`).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(escape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(escape("plain text, é"), "plain text, é");
        assert_eq!(escape(""), "");
    }
}
