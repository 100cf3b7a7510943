//! Tolerant comparison of JSON outputs, for golden tests and worked examples.

use serde_json::Value;

/// Checks that every key of `expected` is in `got` with a close value: numbers within
/// `atol + rtol * |expected|`, tensors (`{"shape", "data"}`) with equal shapes and close data,
/// strings and booleans equal. Extra keys in `got` are allowed.
///
/// Returns a description of the first difference, naming its path (`loss`, `advantages[3]`).
pub fn json_close(expected: &Value, got: &Value, rtol: f64, atol: f64) -> Result<(), String> {
    close_at("", expected, got, rtol, atol)
}

fn close_at(path: &str, expected: &Value, got: &Value, rtol: f64, atol: f64) -> Result<(), String> {
    match (expected, got) {
        (Value::Number(e), Value::Number(g)) => {
            let (e, g) = (
                e.as_f64().unwrap_or(f64::NAN),
                g.as_f64().unwrap_or(f64::NAN),
            );
            if (e - g).abs() <= atol + rtol * e.abs() {
                Ok(())
            } else {
                Err(format!("at `{path}`: expected {e}, got {g}"))
            }
        }
        (Value::Object(e), Value::Object(g)) => {
            for (k, ev) in e {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let gv = g.get(k).ok_or_else(|| format!("missing key `{sub}`"))?;
                close_at(&sub, ev, gv, rtol, atol)?;
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(g)) => {
            if e.len() != g.len() {
                return Err(format!(
                    "at `{path}`: expected {} elements, got {}",
                    e.len(),
                    g.len()
                ));
            }
            for (i, (ev, gv)) in e.iter().zip(g).enumerate() {
                close_at(&format!("{path}[{i}]"), ev, gv, rtol, atol)?;
            }
            Ok(())
        }
        (e, g) if e == g => Ok(()),
        (e, g) => Err(format!("at `{path}`: expected {e}, got {g}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tolerances_and_paths() {
        let e = json!({"loss": 1.0, "t": {"shape": [2], "data": [1.0, 2.0]}});
        assert!(json_close(
            &e,
            &json!({"loss": 1.000001, "t": {"shape": [2], "data": [1.0, 2.0]}, "x": 3}),
            1e-5,
            0.0
        )
        .is_ok());
        let err = json_close(
            &e,
            &json!({"loss": 1.0, "t": {"shape": [2], "data": [1.0, 2.5]}}),
            1e-5,
            1e-5,
        )
        .unwrap_err();
        assert!(err.contains("t.data[1]"), "{err}");
        assert!(json_close(&e, &json!({"t": 1}), 1e-5, 1e-5)
            .unwrap_err()
            .contains("missing key `loss`"));
    }
}
