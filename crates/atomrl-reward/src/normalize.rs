//! Character-level normalisation applied before answers are extracted and parsed.

use std::sync::OnceLock;

use regex::Regex;

/// The one "group space" every non-breaking or thin space is mapped to; inside a number it is a
/// thousands separator (`1 000`), elsewhere it behaves like a space.
pub(crate) const GROUP_SPACE: char = '\u{2009}';

/// Normalises `text` for answer extraction and number parsing:
///
/// - every Unicode decimal digit (category `Nd`: full-width `１２`, Arabic-Indic `١٢`,
///   Devanagari `१२`, mathematical bold `𝟏𝟐`, ...) becomes its ASCII digit;
/// - the Unicode minus `−` (U+2212), small and full-width hyphen-minus become `-`; full-width
///   `＋ ， ． ／ ＄ ％` become `+ , . / $ %`; the fraction slash `⁄` becomes `/`; the Arabic decimal
///   and thousands separators `٫ ٬` become `.` and `,`;
/// - no-break, figure, thin, hair, punctuation and narrow no-break spaces (U+00A0, U+2007,
///   U+2008, U+2009, U+200A, U+202F, U+205F) become one thin space, a thousands separator inside
///   numbers; the ideographic space U+3000 becomes a space;
/// - LaTeX: `{,}` becomes `,`, `\,` a thin space, `\!` is removed, `\%` and `\$` lose their
///   backslash, `\times` becomes `×`, `\cdot` becomes `·`, `\left` and `\right` are removed.
///
/// Anything else is kept as is, so tags and words are unchanged.
///
/// # Example
/// ```
/// use atomrl_reward::normalize_text;
/// assert_eq!(normalize_text("１２，３４５"), "12,345");
/// assert_eq!(normalize_text("−3\\,000"), "-3\u{2009}000");
/// ```
pub fn normalize_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        out.push(map_char(c));
    }
    if out.contains('{') || out.contains('\\') {
        for (from, to) in LATEX {
            if out.contains(from) {
                out = out.replace(from, to);
            }
        }
    }
    out
}

const LATEX: [(&str, &str); 9] = [
    ("{,}", ","),
    ("\\,", "\u{2009}"),
    ("\\!", ""),
    ("\\%", "%"),
    ("\\$", "$"),
    ("\\times", "×"),
    ("\\cdot", "·"),
    ("\\left", ""),
    ("\\right", ""),
];

fn map_char(c: char) -> char {
    if c.is_ascii() {
        return c;
    }
    match c {
        '\u{2212}' | '\u{FE63}' | '\u{FF0D}' => '-',
        '\u{FF0B}' => '+',
        '\u{FF0C}' | '\u{066C}' => ',',
        '\u{FF0E}' | '\u{066B}' => '.',
        '\u{FF0F}' | '\u{2044}' => '/',
        '\u{FF04}' => '$',
        '\u{FF05}' => '%',
        '\u{00A0}' | '\u{2007}' | '\u{2008}' | '\u{2009}' | '\u{200A}' | '\u{202F}'
        | '\u{205F}' => GROUP_SPACE,
        '\u{3000}' => ' ',
        _ if c.is_numeric() => unicode_digit(c).unwrap_or(c),
        _ => c,
    }
}

fn nd() -> &'static Regex {
    static ND: OnceLock<Regex> = OnceLock::new();
    ND.get_or_init(|| Regex::new(r"^\p{Nd}$").expect("valid regex"))
}

fn is_nd(c: char) -> bool {
    let mut buf = [0u8; 4];
    nd().is_match(c.encode_utf8(&mut buf))
}

/// The ASCII digit of a Unicode decimal digit. Unicode encodes every decimal digit set as 10
/// contiguous code points from 0 to 9, and adjacent sets start at their zero, so the value is the
/// distance from the start of the contiguous `Nd` run, modulo 10.
fn unicode_digit(c: char) -> Option<char> {
    if !is_nd(c) {
        return None;
    }
    let code = c as u32;
    let mut start = code;
    while start > 0 {
        match char::from_u32(start - 1) {
            Some(p) if is_nd(p) => start -= 1,
            _ => break,
        }
    }
    let value = (code - start) % 10;
    char::from_digit(value, 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicode_digits_become_ascii() {
        assert_eq!(normalize_text("１２３"), "123");
        assert_eq!(normalize_text("٤٢"), "42");
        assert_eq!(normalize_text("१०"), "10");
        assert_eq!(normalize_text("𝟏𝟐"), "12");
        assert_eq!(normalize_text("𝟗"), "9");
        // Not decimal digits: kept.
        assert_eq!(normalize_text("½ Ⅻ ²"), "½ Ⅻ ²");
    }

    #[test]
    fn spaces_signs_and_latex() {
        assert_eq!(normalize_text("1\u{00A0}000"), "1\u{2009}000");
        assert_eq!(normalize_text("\u{2212}5"), "-5");
        assert_eq!(normalize_text("1{,}000\\%"), "1,000%");
        assert_eq!(normalize_text("2\\times 10^3"), "2× 10^3");
        assert_eq!(normalize_text("<answer>x</answer>"), "<answer>x</answer>");
    }
}
