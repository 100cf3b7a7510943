//! Answer extraction: which part of a completion is its final answer.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use atomrl_core::{Error, Result};
use regex::Regex;

use crate::normalize::normalize_text;
use crate::number::scan;
use crate::tags::Tags;

/// Where an answer can be taken from, tried in the order of [`ExtractOptions::order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnswerSource {
    /// The content of an `<answer>…</answer>` pair: the last opening tag that has a closing tag
    /// after it, up to the first closing tag after it (so nested and duplicated tags give the
    /// innermost last answer). Trimmed; empty content does not count.
    AnswerTag,
    /// The content of the last `\boxed{…}` (or `\fbox{…}`) with balanced braces. Trimmed; empty
    /// content does not count.
    Boxed,
    /// The rest of the line after the last `####` (GSM8K's answer marker). Trimmed; empty does
    /// not count.
    Gsm8k,
    /// The last number anywhere in the text (grammar of [`Number::find_all`](crate::Number::find_all),
    /// without plain-space thousands groups).
    LastNumber,
}

impl AnswerSource {
    /// Every source's canonical name, in the default order.
    pub const NAMES: [&'static str; 4] = ["answer_tag", "boxed", "gsm8k", "last_number"];

    /// The default order: answer tag, then boxed, then GSM8K `####`, then the last number.
    pub const DEFAULT_ORDER: [AnswerSource; 4] =
        [Self::AnswerTag, Self::Boxed, Self::Gsm8k, Self::LastNumber];

    /// Canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::AnswerTag => "answer_tag",
            Self::Boxed => "boxed",
            Self::Gsm8k => "gsm8k",
            Self::LastNumber => "last_number",
        }
    }

    /// Parses an order: names separated by commas (`"boxed,last_number"`).
    ///
    /// # Errors
    /// [`Error::UnknownChoice`] for an unknown name, [`Error::Value`] for an empty list or a
    /// name given twice.
    ///
    /// # Example
    /// ```
    /// use atomrl_reward::AnswerSource;
    /// let order = AnswerSource::parse_order("boxed, last_number")?;
    /// assert_eq!(order, vec![AnswerSource::Boxed, AnswerSource::LastNumber]);
    /// # Ok::<(), atomrl_reward::Error>(())
    /// ```
    pub fn parse_order(list: &str) -> Result<Vec<AnswerSource>> {
        let names: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        Self::order_from_names(&names)
    }

    pub(crate) fn order_from_names(names: &[&str]) -> Result<Vec<AnswerSource>> {
        let mut order = Vec::new();
        for name in names {
            let s: AnswerSource = name.parse()?;
            if order.contains(&s) {
                return Err(Error::value(
                    "extract_answer",
                    "order",
                    "each source at most once",
                    format!("`{name}` twice"),
                ));
            }
            order.push(s);
        }
        if order.is_empty() {
            return Err(Error::value(
                "extract_answer",
                "order",
                format!("at least one of {}", Self::NAMES.join(", ")),
                "an empty list",
            ));
        }
        Ok(order)
    }
}

impl fmt::Display for AnswerSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AnswerSource {
    type Err = Error;

    /// Parses a canonical name or an alias (`answer`, `box`, `hash`, `number`).
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "answer_tag" | "answer" => Self::AnswerTag,
            "boxed" | "box" => Self::Boxed,
            "gsm8k" | "hash" => Self::Gsm8k,
            "last_number" | "number" => Self::LastNumber,
            other => {
                return Err(Error::unknown_choice(
                    "extract_answer",
                    "order",
                    &Self::NAMES,
                    other,
                ))
            }
        })
    }
}

/// How answers are extracted: the sources to try, in order, and the tag names.
///
/// # Example
/// ```
/// use atomrl_reward::{extract_answer, AnswerSource, ExtractOptions};
/// let opts = ExtractOptions { order: vec![AnswerSource::Boxed], ..Default::default() };
/// assert_eq!(extract_answer("so \\boxed{12}", &opts).unwrap().text, "12");
/// assert!(extract_answer("so 12", &opts).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractOptions {
    /// Sources tried in this order; the first that yields a non-empty answer wins.
    pub order: Vec<AnswerSource>,
    /// Tag names (the answer tag is used by [`AnswerSource::AnswerTag`]).
    pub tags: Tags,
}

impl Default for ExtractOptions {
    fn default() -> Self {
        Self {
            order: AnswerSource::DEFAULT_ORDER.to_vec(),
            tags: Tags::default(),
        }
    }
}

/// An extracted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// Which rule found it.
    pub source: AnswerSource,
    /// The answer text, taken from the normalised completion ([`normalize_text`]) and trimmed.
    pub text: String,
}

/// Extracts the final answer of `completion`: the completion is normalised with
/// [`normalize_text`], then each source of `opts.order` is tried in turn (see
/// [`AnswerSource`] for each rule); the first non-empty result is returned.
///
/// # Example
/// ```
/// use atomrl_reward::{extract_answer, AnswerSource, ExtractOptions};
/// let opts = ExtractOptions::default();
/// let a = extract_answer("<think>\n3+4\n</think>\n<answer>\n7\n</answer>", &opts).unwrap();
/// assert_eq!((a.source, a.text.as_str()), (AnswerSource::AnswerTag, "7"));
/// let b = extract_answer("so it is $\\boxed{\\frac{1}{2}}$", &opts).unwrap();
/// assert_eq!((b.source, b.text.as_str()), (AnswerSource::Boxed, "\\frac{1}{2}"));
/// let c = extract_answer("48 + 24 = 72\n#### 72", &opts).unwrap();
/// assert_eq!(c.source, AnswerSource::Gsm8k);
/// let d = extract_answer("the answer is 1,000", &opts).unwrap();
/// assert_eq!((d.source, d.text.as_str()), (AnswerSource::LastNumber, "1,000"));
/// assert!(extract_answer("no idea", &opts).is_none());
/// ```
pub fn extract_answer(completion: &str, opts: &ExtractOptions) -> Option<Extracted> {
    let text = normalize_text(completion);
    opts.order.iter().find_map(|&source| {
        let found = match source {
            AnswerSource::AnswerTag => answer_tag(&text, &opts.tags),
            AnswerSource::Boxed => boxed(&text),
            AnswerSource::Gsm8k => gsm8k(&text),
            AnswerSource::LastNumber => last_number(&text),
        };
        found.map(|t| Extracted {
            source,
            text: t.to_string(),
        })
    })
}

fn non_empty(s: &str) -> Option<&str> {
    let s = s.trim();
    (!s.is_empty()).then_some(s)
}

fn answer_tag<'a>(text: &'a str, tags: &Tags) -> Option<&'a str> {
    let (open, close) = (tags.open_answer(), tags.close_answer());
    // The last opening tag with a closing tag after it is the last one that ends before the
    // last closing tag starts.
    let last_close = text.rfind(&close)?;
    let start = text[..last_close].rfind(&open)? + open.len();
    let len = text[start..].find(&close)?;
    non_empty(&text[start..start + len])
}

/// The content of the last balanced `\boxed{…}` / `\fbox{…}` in `text`.
pub(crate) fn boxed(text: &str) -> Option<&str> {
    let mut starts: Vec<usize> = text
        .match_indices("\\boxed")
        .chain(text.match_indices("\\fbox"))
        .map(|(i, m)| i + m.len())
        .collect();
    starts.sort_unstable();
    // A brace opened at or after `limit` never closes, so neither does any group that contains
    // it: scans stop there (keeps many unclosed `\boxed{` linear).
    let mut limit = text.len();
    for &after in starts.iter().rev() {
        let rest = &text[after..];
        let trimmed = rest.trim_start_matches(' ');
        if !trimmed.starts_with('{') {
            continue;
        }
        let open = after + (rest.len() - trimmed.len());
        if open >= limit {
            continue;
        }
        let mut depth = 0usize;
        let mut closed = false;
        for (k, c) in text[open..limit].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        if let Some(s) = non_empty(&text[open + 1..open + k]) {
                            return Some(s);
                        }
                        closed = true;
                        break;
                    }
                }
                _ => {}
            }
        }
        if !closed {
            limit = open;
        }
    }
    None
}

fn gsm8k(text: &str) -> Option<&str> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(r"####[ \t]*([^\n]*)").expect("valid regex"));
    re.captures_iter(text)
        .filter_map(|c| c.get(1).and_then(|m| non_empty(m.as_str())))
        .last()
}

fn last_number(text: &str) -> Option<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let plain: Vec<char> = chars.iter().map(|&(_, c)| c).collect();
    let token = scan(&plain, false).pop()?;
    let start = chars[token.start].0;
    let end = chars.get(token.end).map_or(text.len(), |&(b, _)| b);
    Some(&text[start..end])
}

/// The reference answer of a GSM8K solution: the text after the last `####` on its line,
/// trimmed, with `,` thousands separators and `$` removed. `None` when there is no `####` or
/// nothing after it.
///
/// # Example
/// ```
/// use atomrl_reward::extract_gsm8k_ground_truth;
/// let sol = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72";
/// assert_eq!(extract_gsm8k_ground_truth(sol).as_deref(), Some("72"));
/// assert_eq!(extract_gsm8k_ground_truth("#### $1,200").as_deref(), Some("1200"));
/// assert_eq!(extract_gsm8k_ground_truth("no marker"), None);
/// ```
pub fn extract_gsm8k_ground_truth(solution: &str) -> Option<String> {
    gsm8k(solution)
        .map(|s| {
            s.chars()
                .filter(|c| !matches!(c, ',' | '$'))
                .collect::<String>()
                .trim()
                .to_string()
        })
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(text: &str) -> Option<(AnswerSource, String)> {
        extract_answer(text, &ExtractOptions::default()).map(|e| (e.source, e.text))
    }

    #[test]
    fn answer_tag_rules() {
        assert_eq!(ex("<answer>1</answer><answer> 2 </answer>").unwrap().1, "2");
        assert_eq!(ex("<answer>a<answer>12</answer></answer>").unwrap().1, "12");
        assert_eq!(ex("<answer>1</answer> then <answer>2").unwrap().1, "1");
        // Empty tag content falls through to the next source.
        assert_eq!(
            ex("<answer> </answer> 5"),
            Some((AnswerSource::LastNumber, "5".into()))
        );
    }

    #[test]
    fn boxed_rules() {
        assert_eq!(boxed("\\boxed{\\frac{1}{2}} and \\boxed{3}"), Some("3"));
        assert_eq!(boxed("\\boxed{3} and \\boxed{4"), Some("3"));
        assert_eq!(boxed("\\boxed {7}"), Some("7"));
        assert_eq!(boxed("\\fbox{8}"), Some("8"));
        assert_eq!(boxed("\\boxed{}"), None);
        assert_eq!(boxed("\\boxed{\\boxed{5} \\boxed{"), Some("5"));
        assert_eq!(boxed("\\boxed{ {1} \\boxed{ } }"), Some("{1} \\boxed{ }"));
    }

    #[test]
    fn degenerate_inputs_stay_linear() {
        let started = std::time::Instant::now();
        for unit in [
            "<answer>",
            "\\boxed{",
            "</answer>",
            "####",
            "1,",
            "\\frac{1}{",
            "-",
        ] {
            let text = unit.repeat(20_000);
            let _ = extract_answer(&text, &ExtractOptions::default());
            let _ = crate::correctness::whole_number(&text);
        }
        assert!(
            started.elapsed().as_secs_f64() < 2.0,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn order_is_configurable_and_validated() {
        let opts = ExtractOptions {
            order: AnswerSource::parse_order("last_number,answer_tag").unwrap(),
            ..Default::default()
        };
        let e = extract_answer("<answer>3</answer> 4", &opts).unwrap();
        assert_eq!(e.text, "4");
        assert!(AnswerSource::parse_order("boxed,foo")
            .unwrap_err()
            .to_string()
            .contains("foo"));
        assert!(AnswerSource::parse_order("boxed,boxed").is_err());
        assert!(AnswerSource::parse_order(" , ").is_err());
    }
}
