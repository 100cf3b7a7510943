//! [`Calculator`]: the built-in exact arithmetic tool.

mod number;
mod parser;

use num_rational::BigRational;
use serde_json::{json, Map, Value};

use crate::{Tool, ToolError};

/// The built-in calculator tool (`calculator`): evaluates an arithmetic expression exactly on
/// big rationals with a hand-written recursive-descent parser (never `eval`).
///
/// Accepted: unsigned integers and decimals (`12`, `3.75`, `.5`), `+ - * /`, `×`, `÷`, `−`
/// (U+2212), `^` and `**` for powers (right-associative and binding tighter than a unary sign
/// on its left, as in Python: `-2^2 = -4`, `2^3^2 = 512`), unary `+`/`-`, parentheses and
/// whitespace. Exponents must be integers with `|exponent| ≤ 100` (negative ones give
/// reciprocals).
///
/// Bounds (each an error, so a call never hangs or exhausts memory): at most
/// [`MAX_EXPRESSION_CHARS`](Self::MAX_EXPRESSION_CHARS) characters,
/// [`MAX_DEPTH`](Self::MAX_DEPTH) levels of parentheses,
/// [`MAX_LITERAL_DIGITS`](Self::MAX_LITERAL_DIGITS) digits per number, and
/// [`MAX_RESULT_DIGITS`](Self::MAX_RESULT_DIGITS) digits in the numerator and denominator of
/// every intermediate result (powers are refused *before* they are computed).
///
/// As a [`Tool`], its arguments must be exactly `{"expression": "<text>"}` (a JSON number is
/// also accepted and read as its text) and its output is [`Calculator::format`] of the value.
///
/// # Example
///
/// ```
/// use atomrl_tools::{Calculator, Tool};
///
/// let calc = Calculator;
/// let value = calc.evaluate("0.1 + 0.2")?;
/// assert_eq!(Calculator::format(&value), "0.3");
///
/// let args = serde_json::json!({"expression": "10 / 4"});
/// assert_eq!(calc.call(args.as_object().expect("object"))?, "2.5");
/// assert_eq!(
///     calc.evaluate("1/0").unwrap_err().to_string(),
///     "calculator: division by zero"
/// );
/// # Ok::<(), atomrl_tools::ToolError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculator;

impl Calculator {
    /// The tool's name, `calculator`.
    pub const NAME: &'static str = "calculator";
    /// Longest accepted expression, in characters (200).
    pub const MAX_EXPRESSION_CHARS: usize = parser::MAX_CHARS;
    /// Deepest accepted nesting of parentheses (20).
    pub const MAX_DEPTH: usize = parser::MAX_DEPTH;
    /// Most digits in one number literal (30).
    pub const MAX_LITERAL_DIGITS: usize = parser::MAX_LITERAL_DIGITS;
    /// Most decimal digits in the numerator or denominator of any intermediate or final
    /// result (300).
    pub const MAX_RESULT_DIGITS: usize = number::MAX_RESULT_DIGITS;
    /// Largest accepted `|exponent|` (100).
    pub const MAX_EXPONENT: u32 = number::MAX_EXPONENT;

    /// A calculator (the same as `Calculator` or `Calculator::default()`).
    ///
    /// ```
    /// use atomrl_tools::{Calculator, Tool};
    ///
    /// assert_eq!(Calculator::new().name(), "calculator");
    /// ```
    pub const fn new() -> Self {
        Self
    }

    /// Evaluates `expression` exactly.
    ///
    /// # Errors
    ///
    /// [`ToolError::Failed`] (tool `calculator`) for an empty expression, an unexpected
    /// character (named, with its 1-based position), unbalanced parentheses, a trailing
    /// operator, division by zero, a non-integer or too large exponent, and each bound
    /// above (too long, too deep, too many digits, result too large).
    ///
    /// ```
    /// use atomrl_tools::Calculator;
    ///
    /// let calc = Calculator;
    /// assert_eq!(Calculator::format(&calc.evaluate("-2^2")?), "-4");
    /// assert_eq!(Calculator::format(&calc.evaluate("(1/3)")?), "1/3");
    /// assert_eq!(
    ///     calc.evaluate("2 + x").unwrap_err().to_string(),
    ///     "calculator: unexpected character `x` at position 5"
    /// );
    /// # Ok::<(), atomrl_tools::ToolError>(())
    /// ```
    pub fn evaluate(&self, expression: &str) -> Result<BigRational, ToolError> {
        parser::parse(expression)
            .and_then(|expr| parser::eval(&expr))
            .map_err(|reason| ToolError::failed(Self::NAME, reason))
    }

    /// Formats a value exactly: an integer as plain digits (`-42`), a non-integer whose
    /// reduced denominator has only the prime factors 2 and 5 as an exact decimal (`2.5`,
    /// `0.125`, `-0.04`), anything else as the reduced fraction (`7/3`). Never scientific
    /// notation.
    ///
    /// ```
    /// use atomrl_tools::{BigRational, Calculator};
    ///
    /// let third = BigRational::new(1.into(), 3.into());
    /// assert_eq!(Calculator::format(&third), "1/3");
    /// let eighth = BigRational::new((-1).into(), 8.into());
    /// assert_eq!(Calculator::format(&eighth), "-0.125");
    /// ```
    pub fn format(value: &BigRational) -> String {
        number::format(value)
    }

    /// Reads the `expression` argument: exactly one key, `expression`, holding a string (or a
    /// number, read as its JSON text).
    fn expression(arguments: &Map<String, Value>) -> Result<String, ToolError> {
        if let Some(extra) = arguments.keys().find(|k| k.as_str() != "expression") {
            return Err(ToolError::invalid_arguments(
                Self::NAME,
                format!("unexpected argument `{extra}`; expected only `expression`"),
            ));
        }
        match arguments.get("expression") {
            None => Err(ToolError::invalid_arguments(
                Self::NAME,
                "missing `expression`",
            )),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(_) => Err(ToolError::invalid_arguments(
                Self::NAME,
                "`expression` must be a string",
            )),
        }
    }
}

impl Tool for Calculator {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn description(&self) -> &str {
        "Evaluates an arithmetic expression exactly: integers, decimals and fractions with \
         + - * / ^ and parentheses."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The arithmetic expression to evaluate, e.g. \"(3 + 4.5) * 2 / 7\" or \"2^10\"."
                }
            },
            "required": ["expression"]
        })
    }

    fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
        let expression = Self::expression(arguments)?;
        self.evaluate(&expression).map(|v| Self::format(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc(s: &str) -> String {
        match Calculator.evaluate(s) {
            Ok(v) => Calculator::format(&v),
            Err(e) => panic!("{s:?}: {e}"),
        }
    }

    fn fail(s: &str) -> String {
        match Calculator.evaluate(s) {
            Ok(v) => panic!("{s:?} evaluated to {v}"),
            Err(ToolError::Failed { tool, reason }) => {
                assert_eq!(tool, "calculator");
                reason
            }
            Err(e) => panic!("{s:?}: unexpected error kind {e:?}"),
        }
    }

    #[test]
    fn exactness() {
        assert_eq!(calc("0.1+0.2"), "0.3");
        assert_eq!(calc("1/3*3"), "1");
        assert_eq!(calc("2^10"), "1024");
        assert_eq!(calc("2**10"), "1024");
        assert_eq!(calc("2^-2"), "0.25");
        assert_eq!(calc("(1/3)"), "1/3");
        assert_eq!(calc("-2^2"), "-4");
        assert_eq!(calc("(-2)^2"), "4");
        assert_eq!(calc("2^3^2"), "512");
        assert_eq!(calc("10/4"), "2.5");
        assert_eq!(calc("7÷2"), "3.5");
        assert_eq!(calc("3×4"), "12");
        assert_eq!(calc("5 − 7"), "-2");
        assert_eq!(calc(".5 + 3.75"), "4.25");
        assert_eq!(calc("-1/25"), "-0.04");
        assert_eq!(calc("1/8"), "0.125");
        assert_eq!(calc("2/3 + 1/6"), "5/6");
        assert_eq!(calc("0^0"), "1");
        assert_eq!(calc("(2/3)^-2"), "2.25");
        assert_eq!(calc("12"), "12");
        assert_eq!(calc("007"), "7");
    }

    #[test]
    fn precedence_and_unary() {
        assert_eq!(calc("2+3*4"), "14");
        assert_eq!(calc("(2+3)*4"), "20");
        assert_eq!(calc("2*3^2"), "18");
        assert_eq!(calc("8/2/2"), "2");
        assert_eq!(calc("8-2-2"), "4");
        assert_eq!(calc("-3 * -3"), "9");
        assert_eq!(calc("--3"), "3");
        assert_eq!(calc("+3"), "3");
        assert_eq!(calc("2^-1"), "0.5");
        assert_eq!(calc("-2^-2"), "-0.25");
        assert_eq!(calc("2^-3^2"), "0.001953125");
        assert_eq!(calc("2 ** 3"), "8");
        assert_eq!(calc("1 - -1"), "2");
        assert_eq!(calc("-(2+3)"), "-5");
        // Right-associative: 2^(2^-1) = 2^0.5.
        assert_eq!(fail("2 ^ 2 ^ -1"), "non-integer exponent");
    }

    #[test]
    fn errors() {
        assert_eq!(fail(""), "empty expression");
        assert_eq!(fail("2 $ 3"), "unexpected character `$` at position 3");
        assert_eq!(fail("(2"), "unbalanced parentheses: missing `)`");
        assert_eq!(
            fail("2)"),
            "unbalanced parentheses: unexpected `)` at position 2"
        );
        assert_eq!(fail("2 *"), "trailing operator `*` at position 3");
        assert_eq!(fail("1/0"), "division by zero");
        assert_eq!(fail("1/(2-2)"), "division by zero");
        assert_eq!(fail("0^-1"), "division by zero");
        assert_eq!(fail("2^0.5"), "non-integer exponent");
        assert_eq!(
            fail("2^101"),
            "exponent too large: |exponent| must be at most 100"
        );
        assert_eq!(fail("1e5"), "unexpected character `e` at position 2");
        assert_eq!(fail("1,000"), "unexpected character `,` at position 2");
        assert_eq!(fail("2 3"), "unexpected `3` at position 3");
        assert_eq!(fail("2* *3"), "unexpected `*` at position 4");
        assert_eq!(fail("−"), "trailing operator `−` at position 1");
    }

    #[test]
    fn bounds_are_fast() {
        let start = std::time::Instant::now();
        assert!(fail("2^100000").starts_with("exponent too large"));
        assert!(fail("2^2^2^2^2^2").starts_with("exponent too large"));
        assert_eq!(fail("99999^99"), "result too large: more than 300 digits");
        assert_eq!(
            fail("(10^99)^-1 * (10^99)^-1 * (10^99)^-1 * 10^-5"),
            "result too large: more than 300 digits"
        );
        let big = "999999999999999999999999999999";
        assert!(Calculator.evaluate(&[big; 6].join("*")).is_ok());
        assert_eq!(calc(&format!("{big}^10")).len(), 300);
        assert_eq!(fail("(10^30)^10"), "result too large: more than 300 digits");
        assert!(Calculator.evaluate("10^100 * 10^100 * 10^99").is_ok());
        assert_eq!(
            fail("10^100 * 10^100 * 10^100"),
            "result too large: more than 300 digits"
        );
        assert_eq!(
            fail("1 / (10^100 * 10^100 * 10^100)"),
            "result too large: more than 300 digits"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn tool_arguments() {
        let call = |v: Value| Calculator.call(v.as_object().expect("object"));
        assert_eq!(call(json!({"expression": "1+1"})), Ok("2".into()));
        assert_eq!(call(json!({"expression": 42})), Ok("42".into()));
        assert_eq!(
            call(json!({})).unwrap_err().to_string(),
            "calculator: invalid arguments: missing `expression`"
        );
        assert_eq!(
            call(json!({"expression": ["1"]})).unwrap_err().to_string(),
            "calculator: invalid arguments: `expression` must be a string"
        );
        assert_eq!(
            call(json!({"expression": "1", "x": 2}))
                .unwrap_err()
                .to_string(),
            "calculator: invalid arguments: unexpected argument `x`; expected only `expression`"
        );
        assert_eq!(
            call(json!({"expression": "1/0"})).unwrap_err().to_string(),
            "calculator: division by zero"
        );
    }

    #[test]
    fn schema() {
        let p = Calculator.parameters();
        assert_eq!(p["type"], "object");
        assert_eq!(p["required"], json!(["expression"]));
        assert_eq!(p["properties"]["expression"]["type"], "string");
    }
}
