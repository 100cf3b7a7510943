//! Tokenizer and recursive-descent parser of calculator expressions (never `eval`).
//!
//! Grammar (as in Python: `^` binds tighter than a unary sign on its left and is
//! right-associative, so `-2^2 = -4`, `2^3^2 = 512`, `2^-1 = 0.5`):
//!
//! ```text
//! expr   := term (("+" | "-") term)*
//! term   := unary (("*" | "/") unary)*
//! unary  := ("+" | "-") unary | power
//! power  := atom ("^" unary)?
//! atom   := NUMBER | "(" expr ")"
//! ```
//!
//! `**` is `^`, `×` is `*`, `÷` is `/` and `−` (U+2212) is `-`. Positions in messages are
//! 1-based character positions.

use num_rational::BigRational;

use super::number;

/// Longest expression, in characters.
pub(crate) const MAX_CHARS: usize = 200;
/// Deepest nesting of parentheses.
pub(crate) const MAX_DEPTH: usize = 20;
/// Most digits in one number literal.
pub(crate) const MAX_LITERAL_DIGITS: usize = 30;

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Num(BigRational),
    Neg(Box<Expr>),
    Bin(BinOp, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(BigRational),
    Plus,
    Minus,
    Star,
    Slash,
    Caret,
    LParen,
    RParen,
}

/// A token, its 1-based position and its text as written.
#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    pos: usize,
    text: String,
}

fn tokenize(chars: &[char]) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let pos = i + 1;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || c == '.' {
            let start = i;
            let mut digits = String::new();
            let mut frac_digits = 0usize;
            let mut seen_point = false;
            while i < chars.len() && (chars[i].is_ascii_digit() || (chars[i] == '.' && !seen_point))
            {
                if chars[i] == '.' {
                    seen_point = true;
                } else {
                    digits.push(chars[i]);
                    if seen_point {
                        frac_digits += 1;
                    }
                }
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            if digits.is_empty() || chars.get(i) == Some(&'.') {
                let pos = if digits.is_empty() { pos } else { i + 1 };
                return Err(format!("unexpected character `.` at position {pos}"));
            }
            if digits.len() > MAX_LITERAL_DIGITS {
                return Err(format!(
                    "number too long at position {pos}: {} digits, at most {MAX_LITERAL_DIGITS}",
                    digits.len()
                ));
            }
            let value = number::from_literal(&digits, frac_digits)
                .ok_or_else(|| format!("invalid number `{text}` at position {pos}"))?;
            tokens.push(Token {
                tok: Tok::Num(value),
                pos,
                text,
            });
            continue;
        }
        let (tok, len) = match c {
            '+' => (Tok::Plus, 1),
            '-' | '\u{2212}' => (Tok::Minus, 1),
            '*' if chars.get(i + 1) == Some(&'*') => (Tok::Caret, 2),
            '*' | '\u{00d7}' => (Tok::Star, 1),
            '/' | '\u{00f7}' => (Tok::Slash, 1),
            '^' => (Tok::Caret, 1),
            '(' => (Tok::LParen, 1),
            ')' => (Tok::RParen, 1),
            _ => {
                return Err(format!(
                    "unexpected character `{}` at position {pos}",
                    c.escape_debug()
                ))
            }
        };
        tokens.push(Token {
            tok,
            pos,
            text: chars[i..i + len].iter().collect(),
        });
        i += len;
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    next: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.next).map(|t| &t.tok)
    }

    fn expr(&mut self) -> Result<Expr, String> {
        let mut left = self.term()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Plus) => BinOp::Add,
                Some(Tok::Minus) => BinOp::Sub,
                _ => return Ok(left),
            };
            self.next += 1;
            let right = self.term()?;
            left = Expr::Bin(op, Box::new(left), Box::new(right));
        }
    }

    fn term(&mut self) -> Result<Expr, String> {
        let mut left = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Star) => BinOp::Mul,
                Some(Tok::Slash) => BinOp::Div,
                _ => return Ok(left),
            };
            self.next += 1;
            let right = self.unary()?;
            left = Expr::Bin(op, Box::new(left), Box::new(right));
        }
    }

    fn unary(&mut self) -> Result<Expr, String> {
        match self.peek() {
            Some(Tok::Plus) => {
                self.next += 1;
                self.unary()
            }
            Some(Tok::Minus) => {
                self.next += 1;
                Ok(Expr::Neg(Box::new(self.unary()?)))
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Result<Expr, String> {
        let base = self.atom()?;
        if self.peek() == Some(&Tok::Caret) {
            self.next += 1;
            let exponent = self.unary()?;
            return Ok(Expr::Bin(BinOp::Pow, Box::new(base), Box::new(exponent)));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Expr, String> {
        let Some(token) = self.tokens.get(self.next).cloned() else {
            return Err(self.at_end());
        };
        self.next += 1;
        match token.tok {
            Tok::Num(value) => Ok(Expr::Num(value)),
            Tok::LParen => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(format!(
                        "expression too deeply nested: at most {MAX_DEPTH} levels of parentheses"
                    ));
                }
                let inner = self.expr()?;
                match self.tokens.get(self.next) {
                    Some(Token {
                        tok: Tok::RParen, ..
                    }) => {
                        self.next += 1;
                        self.depth -= 1;
                        Ok(inner)
                    }
                    Some(other) => Err(unexpected(other)),
                    None => Err("unbalanced parentheses: missing `)`".to_string()),
                }
            }
            _ => Err(unexpected(&token)),
        }
    }

    /// The error for an input that ends where an operand is expected.
    fn at_end(&self) -> String {
        match self.tokens.last() {
            None => "empty expression".to_string(),
            Some(Token {
                tok: Tok::LParen, ..
            }) => "unbalanced parentheses: missing `)`".to_string(),
            Some(last) => format!("trailing operator `{}` at position {}", last.text, last.pos),
        }
    }
}

fn unexpected(token: &Token) -> String {
    if token.tok == Tok::RParen {
        format!(
            "unbalanced parentheses: unexpected `)` at position {}",
            token.pos
        )
    } else {
        format!("unexpected `{}` at position {}", token.text, token.pos)
    }
}

/// Parses `expression` into an [`Expr`], checking the length, nesting and literal bounds.
pub(crate) fn parse(expression: &str) -> Result<Expr, String> {
    let chars: Vec<char> = expression.chars().take(MAX_CHARS + 1).collect();
    if chars.len() > MAX_CHARS {
        return Err(format!(
            "expression too long: at most {MAX_CHARS} characters"
        ));
    }
    let tokens = tokenize(&chars)?;
    let mut parser = Parser {
        tokens,
        next: 0,
        depth: 0,
    };
    let expr = parser.expr()?;
    match parser.tokens.get(parser.next) {
        None => Ok(expr),
        Some(token) => Err(unexpected(token)),
    }
}

/// Evaluates `expr` exactly, every intermediate result bounded to
/// [`number::MAX_RESULT_DIGITS`] digits.
pub(crate) fn eval(expr: &Expr) -> Result<BigRational, String> {
    match expr {
        Expr::Num(value) => number::check_size(value.clone()),
        Expr::Neg(inner) => Ok(-eval(inner)?),
        Expr::Bin(op, left, right) => {
            let a = eval(left)?;
            let b = eval(right)?;
            match op {
                BinOp::Add => number::check_size(a + b),
                BinOp::Sub => number::check_size(a - b),
                BinOp::Mul => number::check_size(a * b),
                BinOp::Div => {
                    if num_traits::Zero::is_zero(&b) {
                        Err("division by zero".to_string())
                    } else {
                        number::check_size(a / b)
                    }
                }
                BinOp::Pow => number::pow(&a, &b),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        match parse(s) {
            Ok(e) => panic!("{s:?} parsed as {e:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(err(""), "empty expression");
        assert_eq!(err("   "), "empty expression");
        assert_eq!(err("2 + a"), "unexpected character `a` at position 5");
        assert_eq!(err("2 +"), "trailing operator `+` at position 3");
        assert_eq!(err("(1 + 2"), "unbalanced parentheses: missing `)`");
        assert_eq!(err("(("), "unbalanced parentheses: missing `)`");
        assert_eq!(
            err("1 + 2)"),
            "unbalanced parentheses: unexpected `)` at position 6"
        );
        assert_eq!(err("2 * / 3"), "unexpected `/` at position 5");
        assert_eq!(err("2(3)"), "unexpected `(` at position 2");
        assert_eq!(err("1.2.3"), "unexpected character `.` at position 4");
        assert_eq!(err("."), "unexpected character `.` at position 1");
        assert_eq!(
            err("()"),
            "unbalanced parentheses: unexpected `)` at position 2"
        );
    }

    #[test]
    fn bounds() {
        let long = format!("1{}", "+1".repeat(100));
        assert_eq!(long.chars().count(), 201);
        assert_eq!(err(&long), "expression too long: at most 200 characters");
        let ok = format!("1{}", "+1".repeat(99) + "0");
        assert!(parse(&ok).is_ok());
        let deep = format!("{}1{}", "(".repeat(21), ")".repeat(21));
        assert_eq!(
            err(&deep),
            "expression too deeply nested: at most 20 levels of parentheses"
        );
        let fine = format!("{}1{}", "(".repeat(20), ")".repeat(20));
        assert!(parse(&fine).is_ok());
        let digits = "1".repeat(31);
        assert_eq!(
            err(&digits),
            "number too long at position 1: 31 digits, at most 30"
        );
        assert!(parse(&"9".repeat(30)).is_ok());
    }
}
