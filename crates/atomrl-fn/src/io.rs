//! Reading inputs (JSON file, stdin, safetensors) and writing outputs (stdout, JSON,
//! safetensors).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use atomrl_core::{Error, FnSpec, Inputs, Outputs, Result};
use candle_core::{Device, Tensor};
use serde_json::{Map, Value};

/// Where the inputs come from.
pub enum Source {
    /// JSON on standard input (`--input -`).
    Stdin,
    /// A `.json` or `.safetensors` file.
    File(PathBuf),
    /// No file: flags only.
    None,
}

/// Loads inputs from `source`, then applies `flags` (name → JSON value) on top.
pub fn load_inputs(spec: &FnSpec, source: &Source, flags: Map<String, Value>) -> Result<Inputs> {
    let (mut values, tensors, base_dir) = match source {
        Source::None => (Map::new(), BTreeMap::new(), None),
        Source::Stdin => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::file("<stdin>", e))?;
            (parse_object("<stdin>", &text)?, BTreeMap::new(), None)
        }
        Source::File(path) => {
            let base = path.parent().map(Path::to_path_buf);
            if path.extension().is_some_and(|e| e == "safetensors") {
                let (values, tensors) = read_safetensors(path)?;
                (values, tensors, base)
            } else {
                let text =
                    std::fs::read_to_string(path).map_err(|e| Error::file(path.display(), e))?;
                (
                    parse_object(&path.display().to_string(), &text)?,
                    BTreeMap::new(),
                    base,
                )
            }
        }
    };
    values.extend(flags);
    let inputs = Inputs::from_parts(spec, values, tensors)?;
    Ok(match base_dir {
        Some(dir) => inputs.with_base_dir(dir),
        None => inputs,
    })
}

fn parse_object(origin: &str, text: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str::<Value>(&quote_non_finite_literals(text)) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(Error::file(
            origin,
            format!("expected a JSON object of inputs, got {}", kind(&other)),
        )),
        Err(e) => Err(Error::file(origin, format!("invalid JSON: {e}"))),
    }
}

/// Python's `json.dumps` writes `NaN`, `Infinity` and `-Infinity`, which JSON does not allow.
/// They are turned into the strings `"NaN"`, ... (which tensor parsing reads as non-finite
/// numbers) so that the function's own finiteness check names the offending element instead
/// of the whole file failing to parse. Hand-written because it must track string literals.
fn quote_non_finite_literals(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("NaN") && !text.contains("Infinity") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if let Some(lit) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|l| rest.starts_with(l))
        {
            out.push('"');
            out.push_str(lit);
            out.push('"');
            rest = &rest[lit.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Tensors of a safetensors file, and options from its string metadata (each value parsed as
/// JSON, or kept as a string).
fn read_safetensors(path: &Path) -> Result<(Map<String, Value>, BTreeMap<String, Tensor>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::file(path.display(), e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::file(path.display(), format!("not a safetensors file: {e}")))?;
    let mut values = Map::new();
    for (k, v) in meta.metadata().iter().flatten() {
        values.insert(k.clone(), flag_value(v));
    }
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| Error::file(path.display(), e))?;
    Ok((values, tensors.into_iter().collect()))
}

/// A flag's value: JSON if it parses (`4`, `true`, `[1, 2]`), else the raw string (`grpo`).
pub fn flag_value(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// Writes outputs: to `path` (`.safetensors` or JSON) or, without a path, as one JSON line on
/// stdout. NaN and infinities are written as Python writes them (`NaN`, `Infinity`), and a
/// warning on stderr names each output that holds any: the value is the function's, but a
/// caller should not miss it.
pub fn write_outputs(func: &str, outputs: &Outputs, path: Option<&Path>) -> Result<()> {
    for (name, count) in outputs.non_finite()? {
        eprintln!("{}", non_finite_warning(func, &name, count));
    }
    match path {
        Some(p) if p.extension().is_some_and(|e| e == "safetensors") => outputs.save_safetensors(p),
        Some(p) => std::fs::write(p, outputs.to_json_text()? + "\n")
            .map_err(|e| Error::file(p.display(), e)),
        None => {
            println!("{}", outputs.to_json_text()?);
            Ok(())
        }
    }
}

fn non_finite_warning(func: &str, output: &str, count: usize) -> String {
    let what = if count == 1 {
        "a value that is".to_string()
    } else {
        format!("{count} values that are")
    };
    format!(
        "warning: {func}: output `{output}` has {what} not finite (NaN or infinite: an input \
         too large for f32, or a -inf logit chosen)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_non_finite_literals_become_strings_outside_string_literals() {
        let t = r#"{"r": [1, NaN, -Infinity], "s": "NaN \" Infinity"}"#;
        assert_eq!(
            quote_non_finite_literals(t),
            r#"{"r": [1, "NaN", "-Infinity"], "s": "NaN \" Infinity"}"#
        );
    }
}
