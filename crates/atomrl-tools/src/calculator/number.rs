//! Exact rational numbers for the calculator: literals, size bounds, powers and formatting.

use num_bigint::{BigInt, Sign};
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Most decimal digits in the numerator or denominator of any (intermediate) result.
pub(crate) const MAX_RESULT_DIGITS: usize = 300;
/// Largest `|exponent|` of a power.
pub(crate) const MAX_EXPONENT: u32 = 100;

/// Bits of `10^300` (the smallest 301-digit number): numbers with fewer bits have at most
/// 300 digits, numbers with more have at least 301.
const BITS_OF_LIMIT: u64 = 997;

/// Whether `|x|` has more than [`MAX_RESULT_DIGITS`] decimal digits (exact).
fn int_too_large(x: &BigInt) -> bool {
    let bits = x.bits();
    match bits.cmp(&BITS_OF_LIMIT) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => x.magnitude().to_string().len() > MAX_RESULT_DIGITS,
    }
}

/// `Err("result too large …")` when the numerator or denominator of `x` has more than
/// [`MAX_RESULT_DIGITS`] digits.
pub(crate) fn check_size(x: BigRational) -> Result<BigRational, String> {
    if int_too_large(x.numer()) || int_too_large(x.denom()) {
        Err(format!(
            "result too large: more than {MAX_RESULT_DIGITS} digits"
        ))
    } else {
        Ok(x)
    }
}

/// The value of a literal of decimal digits with `frac_digits` of them after the point.
pub(crate) fn from_literal(digits: &str, frac_digits: usize) -> Option<BigRational> {
    let numer = if digits.is_empty() {
        BigInt::zero()
    } else {
        digits.parse::<BigInt>().ok()?
    };
    let denom = num_traits::pow(BigInt::from(10u8), frac_digits);
    Some(BigRational::new(numer, denom))
}

/// `base ^ exponent`, exact, refusing non-integer and large exponents and results that would
/// exceed the size bound *before* computing them.
pub(crate) fn pow(base: &BigRational, exponent: &BigRational) -> Result<BigRational, String> {
    if !exponent.is_integer() {
        return Err("non-integer exponent".to_string());
    }
    let e = exponent
        .to_integer()
        .to_i64()
        .filter(|e| e.unsigned_abs() <= u64::from(MAX_EXPONENT))
        .ok_or_else(|| format!("exponent too large: |exponent| must be at most {MAX_EXPONENT}"))?;
    // Bounded by the check above.
    let abs_e = u32::try_from(e.unsigned_abs()).unwrap_or(MAX_EXPONENT);
    if base.is_zero() {
        return if e < 0 {
            Err("division by zero".to_string())
        } else if e == 0 {
            Ok(BigRational::one())
        } else {
            Ok(BigRational::zero())
        };
    }
    // |p^e| >= 2^((bits(p) - 1) * e): refuse when that lower bound already exceeds the limit.
    let bits = base.numer().bits().max(base.denom().bits());
    if bits.saturating_sub(1).saturating_mul(u64::from(abs_e)) >= BITS_OF_LIMIT {
        return Err(format!(
            "result too large: more than {MAX_RESULT_DIGITS} digits"
        ));
    }
    let numer = num_traits::pow(base.numer().clone(), abs_e as usize);
    let denom = num_traits::pow(base.denom().clone(), abs_e as usize);
    let value = if e < 0 {
        BigRational::new(denom, numer)
    } else {
        BigRational::new(numer, denom)
    };
    check_size(value)
}

/// Removes every factor `p` from `x`, returning the rest and how many were removed.
fn strip_factor(mut x: BigInt, p: u32) -> (BigInt, usize) {
    let p = BigInt::from(p);
    let mut count = 0;
    while !x.is_zero() && (&x % &p).is_zero() {
        x /= &p;
        count += 1;
    }
    (x, count)
}

/// Formats `value` exactly: an integer as plain digits (`-42`), a non-integer whose reduced
/// denominator has only the prime factors 2 and 5 as an exact decimal (`2.5`, `-0.04`),
/// anything else as the reduced fraction `7/3` (`-7/3`). Never scientific notation.
pub(crate) fn format(value: &BigRational) -> String {
    if value.is_integer() {
        return value.numer().to_string();
    }
    let denom = value.denom().clone();
    let (rest, twos) = strip_factor(denom.clone(), 2);
    let (rest, fives) = strip_factor(rest, 5);
    if !rest.is_one() {
        return format!("{}/{}", value.numer(), denom);
    }
    let places = twos.max(fives);
    let scale = num_traits::pow(BigInt::from(10u8), places);
    // Exact: `denom` divides `10^places`.
    let scaled = value.numer().abs() * (scale / &denom);
    let digits = scaled.to_string();
    let digits = if digits.len() <= places {
        format!("{}{}", "0".repeat(places + 1 - digits.len()), digits)
    } else {
        digits
    };
    let (int_part, frac_part) = digits.split_at(digits.len() - places);
    let sign = if value.numer().sign() == Sign::Minus {
        "-"
    } else {
        ""
    };
    format!("{sign}{int_part}.{frac_part}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i64, d: i64) -> BigRational {
        BigRational::new(BigInt::from(n), BigInt::from(d))
    }

    #[test]
    fn formats() {
        assert_eq!(format(&r(-42, 1)), "-42");
        assert_eq!(format(&r(0, 1)), "0");
        assert_eq!(format(&r(5, 2)), "2.5");
        assert_eq!(format(&r(1, 8)), "0.125");
        assert_eq!(format(&r(-1, 25)), "-0.04");
        assert_eq!(format(&r(7, 3)), "7/3");
        assert_eq!(format(&r(-7, 6)), "-7/6");
        assert_eq!(format(&r(1001, 100)), "10.01");
        assert_eq!(format(&r(-3, 2)), "-1.5");
    }

    #[test]
    fn size_bound_is_exact() {
        let big = num_traits::pow(BigInt::from(10), 300);
        let ok = BigRational::from_integer(&big - 1);
        assert!(check_size(ok).is_ok());
        assert!(check_size(BigRational::from_integer(big.clone())).is_err());
        assert!(check_size(BigRational::new(BigInt::one(), big)).is_err());
    }

    #[test]
    fn powers() {
        assert_eq!(pow(&r(2, 1), &r(10, 1)), Ok(r(1024, 1)));
        assert_eq!(pow(&r(2, 1), &r(-2, 1)), Ok(r(1, 4)));
        assert_eq!(pow(&r(0, 1), &r(0, 1)), Ok(r(1, 1)));
        assert_eq!(pow(&r(0, 1), &r(-1, 1)), Err("division by zero".into()));
        assert_eq!(pow(&r(2, 1), &r(1, 2)), Err("non-integer exponent".into()));
        assert!(pow(&r(2, 1), &r(101, 1)).is_err());
        assert!(pow(&r(1000, 1), &r(100, 1)).is_err());
        assert!(pow(&r(10, 1), &r(100, 1)).is_ok());
    }

    #[test]
    fn literals() {
        assert_eq!(from_literal("375", 2), Some(r(15, 4)));
        assert_eq!(from_literal("5", 1), Some(r(1, 2)));
    }
}
