//! Numbers as written in model answers: parsing, canonical form and tolerant comparison.

use std::fmt;

use crate::normalize::{normalize_text, GROUP_SPACE};

/// Relative tolerance used by default when comparing non-integer answers: `1e-6`.
pub const DEFAULT_TOLERANCE: f64 = 1e-6;

/// Largest exponent (in digits) accepted in scientific notation; longer exponents make the token
/// "not a number" rather than an overflow.
const MAX_EXPONENT_DIGITS: usize = 6;

/// Longest `\frac{…}` argument looked at, in characters.
const MAX_FRAC_ARG_CHARS: usize = 1000;

/// A number parsed from answer text, kept exact.
///
/// A decimal (`1,234.50`, `-3e5`, `$12`, `7%`) is stored as sign, significant digits and a
/// power of ten, so integers of any size compare exactly; a fraction (`3/4`, `\frac{3}{4}`) as
/// numerator and denominator. Trailing zeros (`12.00`), leading zeros (`007`) and the sign of
/// zero (`-0`) do not matter: equal decimals have equal canonical forms.
///
/// # Example
/// ```
/// use atomrl_reward::Number;
/// let n = Number::parse("$1,234.50").unwrap();
/// assert_eq!(n.to_string(), "1234.5");
/// assert_eq!(Number::parse("1.2345e3"), Number::parse("1234.5"));
/// assert!(Number::parse("\\frac{3}{4}").unwrap().to_f64() == 0.75);
/// assert!(Number::parse("apples").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Number {
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Decimal(Decimal),
    Fraction {
        negative: bool,
        num: Decimal,
        den: Decimal,
    },
}

/// `±digits · 10^exp`, canonical: no leading or trailing zeros in `digits`; zero is
/// `digits = ""`, `exp = 0`, `negative = false`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exp: i64,
}

impl Decimal {
    fn new(negative: bool, int: &str, frac: &str, exp: i64) -> Self {
        let mut digits: String = int.chars().chain(frac.chars()).collect();
        let mut exp = exp - frac.len() as i64;
        let lead = digits.len() - digits.trim_start_matches('0').len();
        digits.drain(..lead);
        while digits.ends_with('0') {
            digits.pop();
            exp += 1;
        }
        if digits.is_empty() {
            return Self {
                negative: false,
                digits,
                exp: 0,
            };
        }
        Self {
            negative,
            digits,
            exp,
        }
    }

    fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }

    fn to_f64(&self) -> f64 {
        if self.is_zero() {
            return 0.0;
        }
        let sign = if self.negative { "-" } else { "" };
        format!("{sign}{}e{}", self.digits, self.exp)
            .parse()
            .unwrap_or(f64::NAN)
    }

    fn with_sign(mut self, negative: bool) -> Self {
        if !self.is_zero() {
            self.negative = negative;
        }
        self
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0");
        }
        if self.negative {
            f.write_str("-")?;
        }
        let n = self.digits.len() as i64;
        if (0..=30).contains(&self.exp) {
            write!(f, "{}{}", self.digits, "0".repeat(self.exp as usize))
        } else if self.exp < 0 && -self.exp < n {
            let cut = (n + self.exp) as usize;
            write!(f, "{}.{}", &self.digits[..cut], &self.digits[cut..])
        } else if self.exp < 0 && -self.exp <= n + 30 {
            write!(
                f,
                "0.{}{}",
                "0".repeat((-self.exp - n) as usize),
                self.digits
            )
        } else {
            let (head, tail) = self.digits.split_at(1);
            let point = if tail.is_empty() { "" } else { "." };
            write!(f, "{head}{point}{tail}e{}", self.exp + n - 1)
        }
    }
}

impl Number {
    /// Parses text that is meant to be one number: after [`normalize_text`], the last number in
    /// the text is taken, so `"12 apples"`, `"x = 12"` and `"$12.00"` all give 12. Returns `None`
    /// when the text holds no number (see [`Number::find_all`] for the grammar).
    pub fn parse(text: &str) -> Option<Self> {
        let chars: Vec<char> = normalize_text(text).chars().collect();
        scan(&chars, true).pop().map(|t| t.number)
    }

    /// Every number in `text`, in order, with its `(start, end)` byte range in the
    /// **normalised** text (`normalize_text(text)`).
    ///
    /// Grammar: an optional sign (`-`/`+`, taken as a sign only when not directly preceded by a
    /// letter, digit or closing bracket), an optional `$`, then either `\frac{a}{b}` (also
    /// `\dfrac`, `\tfrac`, `\frac12`) or a decimal: digits with optional thousands groups (`,`
    /// or a thin/no-break space followed by exactly three digits), an optional `.digits` part (or
    /// `.5`), then an optional `/b` fraction or exponent (`e-3`, `E5`, `× 10^3`, `*10^{3}`,
    /// `x10^3`), then an optional `%` (ignored: `50%` is 50). A fraction with a zero denominator
    /// is not a number. `space_groups` also accepts a plain space as thousands separator
    /// (`1 000`); it is on for extracted answers, off for free text.
    pub fn find_all(text: &str, space_groups: bool) -> Vec<(usize, usize, Number)> {
        let normalized = normalize_text(text);
        let chars: Vec<char> = normalized.chars().collect();
        let mut byte_at = Vec::with_capacity(chars.len() + 1);
        let mut b = 0;
        for c in &chars {
            byte_at.push(b);
            b += c.len_utf8();
        }
        byte_at.push(b);
        scan(&chars, space_groups)
            .into_iter()
            .map(|t| (byte_at[t.start], byte_at[t.end], t.number))
            .collect()
    }

    /// Whether the number is an integer written as a decimal (`12`, `1.2e3`, `12.00`); a
    /// fraction is never counted as an integer.
    pub fn is_integer(&self) -> bool {
        matches!(&self.kind, Kind::Decimal(d) if d.exp >= 0)
    }

    /// The value as `f64` (infinite or 0 when out of range, e.g. `1e999`).
    pub fn to_f64(&self) -> f64 {
        match &self.kind {
            Kind::Decimal(d) => d.to_f64(),
            Kind::Fraction { negative, num, den } => {
                let v = num.to_f64() / den.to_f64();
                if *negative {
                    -v
                } else {
                    v
                }
            }
        }
    }

    /// Whether `self` (an answer) equals `reference`: exactly when both are integers (so
    /// `123456789012345678901` and `123456789012345678902` differ), otherwise when
    /// `|a − b| ≤ rtol · max(1, |b|)` with `b` the reference value (both values must be finite).
    ///
    /// # Example
    /// ```
    /// use atomrl_reward::Number;
    /// let p = |s| Number::parse(s).unwrap();
    /// assert!(p("0.5").matches(&p("1/2"), 1e-6));
    /// assert!(p("0.3333333").matches(&p("\\frac{1}{3}"), 1e-6));
    /// assert!(!p("123456789012345678901").matches(&p("123456789012345678902"), 1e-6));
    /// ```
    pub fn matches(&self, reference: &Number, rtol: f64) -> bool {
        if self == reference {
            return true;
        }
        if self.is_integer() && reference.is_integer() {
            return false;
        }
        let (a, b) = (self.to_f64(), reference.to_f64());
        a.is_finite() && b.is_finite() && (a - b).abs() <= rtol * b.abs().max(1.0)
    }
}

impl fmt::Display for Number {
    /// The canonical form: `1234.5`, `-3`, `0.001`, `1.5e40`, `3/4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Decimal(d) => d.fmt(f),
            Kind::Fraction { negative, num, den } => {
                if *negative {
                    f.write_str("-")?;
                }
                write!(f, "{num}/{den}")
            }
        }
    }
}

/// A number found at `chars[start..end]`.
pub(crate) struct Token {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) number: Number,
}

/// Every number in already-normalised `chars`.
pub(crate) fn scan(chars: &[char], space_groups: bool) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if could_start(chars, i) {
            if let Some((number, end)) = parse_at(chars, i, space_groups) {
                if let Some(number) = number {
                    out.push(Token {
                        start: i,
                        end,
                        number,
                    });
                }
                i = end.max(i + 1);
                continue;
            }
        }
        i += 1;
    }
    out
}

fn at(chars: &[char], i: usize) -> char {
    chars.get(i).copied().unwrap_or('\0')
}

fn digit_at(chars: &[char], i: usize) -> bool {
    at(chars, i).is_ascii_digit()
}

fn starts_with(chars: &[char], i: usize, s: &str) -> bool {
    s.chars().enumerate().all(|(k, c)| at(chars, i + k) == c)
}

fn frac_command(chars: &[char], i: usize) -> Option<usize> {
    ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find(|cmd| starts_with(chars, i, cmd))
        .map(|cmd| i + cmd.chars().count())
}

fn could_start(chars: &[char], i: usize) -> bool {
    let c = chars[i];
    c.is_ascii_digit()
        || (c == '.' && digit_at(chars, i + 1) && (i == 0 || !digit_at(chars, i - 1)))
        || (c == '\\' && frac_command(chars, i).is_some())
        || ((c == '-' || c == '+') && sign_allowed(chars, i))
}

/// A `-`/`+` is a sign unless it directly follows a letter, digit or closing bracket (then it is
/// an operator, as in `5-3` or `x-1`).
fn sign_allowed(chars: &[char], i: usize) -> bool {
    i == 0 || {
        let p = chars[i - 1];
        !(p.is_alphanumeric() || matches!(p, ')' | ']' | '}' | '.' | '_'))
    }
}

/// Parses a number starting at `i`. `None`: no number starts here; `Some((None, end))`: a
/// numeric-looking token that is not a valid number (zero denominator, huge exponent) ends at
/// `end`.
fn parse_at(chars: &[char], i: usize, space_groups: bool) -> Option<(Option<Number>, usize)> {
    let mut j = i;
    let mut negative = false;
    if matches!(at(chars, j), '-' | '+') {
        negative = at(chars, j) == '-';
        j += 1;
        if at(chars, j) == '$' {
            j += 1;
        }
    }
    if let Some(after) = frac_command(chars, j) {
        let (frac, end) = parse_latex_frac(chars, after)?;
        let end = skip_percent(chars, end);
        return Some((frac.map(|(n, d)| fraction(negative, n, d)), end));
    }
    let (int, frac, mut j) = parse_digits(chars, j, space_groups)?;
    // a/b
    if at(chars, j) == '/'
        && (digit_at(chars, j + 1) || (at(chars, j + 1) == '.' && digit_at(chars, j + 2)))
    {
        let (dint, dfrac, end) = parse_digits(chars, j + 1, false)?;
        let num = Decimal::new(false, &int, &frac, 0);
        let den = Decimal::new(false, &dint, &dfrac, 0);
        let end = skip_percent(chars, end);
        let number = (!den.is_zero()).then(|| fraction(negative, num, den));
        return Some((number, end));
    }
    let mut exp = 0i64;
    match parse_exponent(chars, j) {
        Exponent::None => {}
        Exponent::Valid(e, end) => {
            exp = e;
            j = end;
        }
        Exponent::TooLarge(end) => return Some((None, end)),
    }
    let j = skip_percent(chars, j);
    let number = Number {
        kind: Kind::Decimal(Decimal::new(negative, &int, &frac, exp)),
    };
    Some((Some(number), j))
}

fn fraction(negative: bool, num: Decimal, den: Decimal) -> Number {
    let negative = negative ^ num.negative ^ den.negative;
    let (num, den) = (num.with_sign(false), den.with_sign(false));
    if num.is_zero() {
        return Number {
            kind: Kind::Decimal(num),
        };
    }
    Number {
        kind: Kind::Fraction { negative, num, den },
    }
}

fn skip_percent(chars: &[char], j: usize) -> usize {
    if at(chars, j) == '%' {
        j + 1
    } else {
        j
    }
}

/// Integer digits (with thousands groups) and an optional fractional part; at least one digit.
fn parse_digits(chars: &[char], i: usize, space_groups: bool) -> Option<(String, String, usize)> {
    let mut j = i;
    let mut int = String::new();
    while digit_at(chars, j) {
        int.push(chars[j]);
        j += 1;
    }
    if !int.is_empty() && int.len() <= 3 {
        loop {
            let sep = at(chars, j);
            let is_sep = sep == ',' || sep == GROUP_SPACE || (space_groups && sep == ' ');
            if is_sep && (1..=3).all(|k| digit_at(chars, j + k)) && !digit_at(chars, j + 4) {
                int.extend(&chars[j + 1..j + 4]);
                j += 4;
            } else {
                break;
            }
        }
    }
    let mut frac = String::new();
    if at(chars, j) == '.' && digit_at(chars, j + 1) {
        j += 1;
        while digit_at(chars, j) {
            frac.push(chars[j]);
            j += 1;
        }
    }
    (!int.is_empty() || !frac.is_empty()).then_some((int, frac, j))
}

enum Exponent {
    None,
    Valid(i64, usize),
    TooLarge(usize),
}

fn parse_exponent(chars: &[char], i: usize) -> Exponent {
    let mut j = i;
    let braced;
    if matches!(at(chars, j), 'e' | 'E') {
        j += 1;
        braced = false;
    } else {
        let mut k = j;
        while at(chars, k) == ' ' {
            k += 1;
        }
        if !matches!(at(chars, k), '×' | '*' | 'x' | '·') {
            return Exponent::None;
        }
        k += 1;
        while at(chars, k) == ' ' {
            k += 1;
        }
        if !starts_with(chars, k, "10^") {
            return Exponent::None;
        }
        k += 3;
        braced = at(chars, k) == '{';
        if braced {
            k += 1;
        }
        j = k;
    }
    let negative = at(chars, j) == '-';
    if matches!(at(chars, j), '-' | '+') {
        j += 1;
    }
    let start = j;
    while digit_at(chars, j) {
        j += 1;
    }
    if j == start || (braced && at(chars, j) != '}') {
        return Exponent::None;
    }
    let digits: String = chars[start..j].iter().collect();
    if braced {
        j += 1;
    }
    if digits.trim_start_matches('0').len() > MAX_EXPONENT_DIGITS {
        return Exponent::TooLarge(j);
    }
    let e: i64 = digits.parse().unwrap_or(0);
    Exponent::Valid(if negative { -e } else { e }, j)
}

/// `\frac{a}{b}` or `\frac12` after the command; each argument a signed decimal.
fn parse_latex_frac(chars: &[char], i: usize) -> Option<(Option<(Decimal, Decimal)>, usize)> {
    let (a, j) = latex_arg(chars, i)?;
    let (b, j) = latex_arg(chars, j)?;
    let a = simple_decimal(&a)?;
    let b = simple_decimal(&b)?;
    Some(((!b.is_zero()).then_some((a, b)), j))
}

fn latex_arg(chars: &[char], i: usize) -> Option<(Vec<char>, usize)> {
    let mut j = i;
    while at(chars, j) == ' ' {
        j += 1;
    }
    if digit_at(chars, j) {
        return Some((vec![chars[j]], j + 1));
    }
    if at(chars, j) != '{' {
        return None;
    }
    // An argument holds one number, so a closing brace further than this is not looked for
    // (keeps text with many unclosed `\frac{` linear).
    let stop = chars.len().min(j + MAX_FRAC_ARG_CHARS);
    let mut depth = 0usize;
    for (k, &c) in chars.iter().enumerate().take(stop).skip(j) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((chars[j + 1..k].to_vec(), k + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// A brace argument that is exactly one signed decimal (spaces and a `$` allowed around it).
fn simple_decimal(arg: &[char]) -> Option<Decimal> {
    let text: String = arg.iter().collect();
    let trimmed: Vec<char> = text.trim().chars().collect();
    if trimmed.is_empty() {
        return None;
    }
    let (number, end) = parse_at(&trimmed, 0, true)?;
    if end != trimmed.len() {
        return None;
    }
    match number?.kind {
        Kind::Decimal(d) => Some(d),
        Kind::Fraction { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> String {
        Number::parse(s).map_or_else(|| "none".into(), |n| n.to_string())
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(p("1,234"), "1234");
        assert_eq!(p("12.00"), "12");
        assert_eq!(p("007"), "7");
        assert_eq!(p("-0"), "0");
        assert_eq!(p("-0.50"), "-0.5");
        assert_eq!(p(".5"), "0.5");
        assert_eq!(p("$-5"), "-5");
        assert_eq!(p("-$5"), "-5");
        assert_eq!(p("50%"), "50");
        assert_eq!(p("1.5e3"), "1500");
        assert_eq!(p("1.5E-3"), "0.0015");
        assert_eq!(p("2 × 10^3"), "2000");
        assert_eq!(p("2\\times10^{-2}"), "0.02");
        assert_eq!(p("3/4"), "3/4");
        assert_eq!(p("-\\frac{3}{4}"), "-3/4");
        assert_eq!(p("\\dfrac{-3}{4}"), "-3/4");
        assert_eq!(p("\\frac12"), "1/2");
        assert_eq!(p("1e40"), "1e40");
        assert_eq!(p("1 000"), "1000");
        assert_eq!(p("1\u{00A0}000"), "1000");
        assert_eq!(p("1,0000"), "0");
        assert_eq!(p("5-3"), "3");
        assert_eq!(p("x-1"), "1");
        assert_eq!(p("12 apples"), "12");
        assert_eq!(p("no number"), "none");
        assert_eq!(p("1/0"), "none");
        assert_eq!(p("1e9999999"), "none");
    }

    #[test]
    fn comparison_rules() {
        let n = |s: &str| Number::parse(s).unwrap();
        assert!(n("12").matches(&n("12.0"), 0.0));
        assert!(n("1e30").matches(&n("1000000000000000000000000000000"), 0.0));
        assert!(!n("123456789012345678901").matches(&n("123456789012345678902"), 1e-6));
        assert!(n("3.0000001").matches(&n("3"), 1e-6));
        assert!(!n("3.00001").matches(&n("3"), 1e-6));
        assert!(n("0.0000005").matches(&n("0"), 1e-6));
        assert!(n("4/2").matches(&n("2"), 1e-6));
        assert!(!n("1e400").matches(&n("1e401"), 1e-6));
        assert!(!n("1.5e400").matches(&n("1.5e400"), 1e-6) || n("1.5e400") == n("1.5e400"));
    }

    #[test]
    fn find_all_gives_byte_ranges_in_normalised_text() {
        let found = Number::find_all("a 1,000 b −2", false);
        let spans: Vec<_> = found
            .iter()
            .map(|(s, e, n)| (*s, *e, n.to_string()))
            .collect();
        assert_eq!(spans, vec![(2, 7, "1000".into()), (10, 12, "-2".into())]);
    }
}
