//! Named inputs and outputs of atomic functions, and their JSON / safetensors forms.
//!
//! JSON input is an object: tensors as nested arrays or `{"shape": [...], "data": [...]}`,
//! options as plain values. JSON output is an object: each tensor as
//! `{"shape": [...], "data": [flat row-major]}`, scalars as numbers, text as arrays of strings.
//! Non-finite numbers are written as Python's `json.dumps` writes them (`NaN`, `Infinity`,
//! `-Infinity`: [`Outputs::to_json_text`]), which is also what input parsing accepts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value};

use crate::error::{CandleContext, Error, Result};
use crate::registry::{ArgKind, FnSpec};

/// Named inputs of one call, checked against the function's [`FnSpec`].
#[derive(Debug, Clone)]
pub struct Inputs {
    func: &'static str,
    values: Map<String, Value>,
    tensors: BTreeMap<String, Tensor>,
    base_dir: Option<PathBuf>,
}

impl Inputs {
    /// Builds inputs from a JSON object; rejects fields the spec does not know and checks that
    /// every required argument is present.
    pub fn from_json(spec: &FnSpec, value: Value) -> Result<Self> {
        let Value::Object(values) = value else {
            return Err(Error::value(
                spec.name,
                "input",
                "a JSON object",
                json_kind(&value),
            ));
        };
        Self::from_parts(spec, values, BTreeMap::new())
    }

    /// Builds inputs from JSON values and already-loaded tensors (e.g. from safetensors).
    pub fn from_parts(
        spec: &FnSpec,
        values: Map<String, Value>,
        tensors: BTreeMap<String, Tensor>,
    ) -> Result<Self> {
        let known = || {
            spec.inputs
                .iter()
                .map(|a| a.name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        for key in values.keys().chain(tensors.keys()) {
            if spec.input(key).is_none() {
                return Err(Error::UnknownArgument {
                    func: spec.name.into(),
                    arg: key.clone(),
                    known: known(),
                });
            }
        }
        for arg in spec.inputs.iter().filter(|a| a.required) {
            let present = tensors.contains_key(arg.name)
                || values.get(arg.name).is_some_and(|v| !v.is_null());
            if !present {
                let what = match arg.kind {
                    ArgKind::Tensor => format!("tensor {} of {}", arg.shape, arg.dtype),
                    _ => format!("{} {}", arg.shape, arg.doc),
                };
                return Err(Error::missing(spec.name, arg.name, what));
            }
        }
        Ok(Self {
            func: spec.name,
            values,
            tensors,
            base_dir: None,
        })
    }

    /// Sets the folder relative paths are also resolved against (the input file's folder).
    pub fn with_base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base_dir = Some(dir.into());
        self
    }

    /// The function these inputs are for.
    pub fn func(&self) -> &'static str {
        self.func
    }

    /// Whether `name` was given (and is not `null`).
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.values.get(name).is_some_and(|v| !v.is_null())
    }

    /// The raw JSON value of `name`, if given.
    pub fn json(&self, name: &str) -> Option<&Value> {
        self.values.get(name).filter(|v| !v.is_null())
    }

    /// A float tensor (converted to f32, on the CPU).
    pub fn float_tensor(&self, name: &str) -> Result<Tensor> {
        self.opt_float_tensor(name)?
            .ok_or_else(|| Error::missing(self.func, name, "a tensor"))
    }

    /// A float tensor if given.
    pub fn opt_float_tensor(&self, name: &str) -> Result<Option<Tensor>> {
        if let Some(t) = self.tensors.get(name) {
            return t.to_dtype(DType::F32).map(Some).ctx(self.func);
        }
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        let (shape, data) = parse_tensor(self.func, name, v)?;
        let data: Vec<f32> = data.into_iter().map(|x| x as f32).collect();
        Tensor::from_vec(data, shape, &Device::Cpu)
            .map(Some)
            .ctx(self.func)
    }

    /// A tensor of token ids (u32); every element must be a non-negative integer.
    pub fn id_tensor(&self, name: &str) -> Result<Tensor> {
        let t = match self.tensors.get(name) {
            Some(t) => t.to_dtype(DType::F64).ctx(self.func)?,
            None => {
                let v = self
                    .json(name)
                    .ok_or_else(|| Error::missing(self.func, name, "a tensor of token ids"))?;
                let (shape, data) = parse_tensor(self.func, name, v)?;
                Tensor::from_vec(data, shape, &Device::Cpu).ctx(self.func)?
            }
        };
        let flat = crate::shape::flat_f64(self.func, &t)?;
        if let Some((i, x)) = flat
            .iter()
            .enumerate()
            .find(|(_, x)| x.fract() != 0.0 || **x < 0.0 || **x > u32::MAX as f64)
        {
            return Err(Error::value(
                self.func,
                format!("{name}[{}]", crate::shape::unravel(i, t.dims())),
                "a non-negative integer token id",
                x,
            ));
        }
        t.to_dtype(DType::U32).ctx(self.func)
    }

    /// Ragged lists of token ids (`[[1, 2], [3]]`).
    pub fn id_lists(&self, name: &str) -> Result<Vec<Vec<u32>>> {
        let v = self
            .json(name)
            .ok_or_else(|| Error::missing(self.func, name, "arrays of token ids"))?;
        let rows = v.as_array().ok_or_else(|| {
            Error::value(
                self.func,
                name,
                "an array of arrays of token ids",
                json_kind(v),
            )
        })?;
        rows.iter()
            .enumerate()
            .map(|(i, row)| {
                let row = row.as_array().ok_or_else(|| {
                    Error::value(
                        self.func,
                        format!("{name}[{i}]"),
                        "an array of token ids",
                        json_kind(row),
                    )
                })?;
                row.iter()
                    .enumerate()
                    .map(|(j, x)| {
                        x.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .ok_or_else(|| {
                                Error::value(
                                    self.func,
                                    format!("{name}[{i}][{j}]"),
                                    "a non-negative integer token id",
                                    x,
                                )
                            })
                    })
                    .collect()
            })
            .collect()
    }

    /// A non-negative integer option (`4` or `4.0`).
    pub fn usize(&self, name: &str) -> Result<usize> {
        self.opt_usize(name)?
            .ok_or_else(|| Error::missing(self.func, name, "a non-negative integer"))
    }

    /// A non-negative integer option if given.
    pub fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        let n = v
            .as_f64()
            .filter(|x| *x >= 0.0 && x.fract() == 0.0 && *x <= usize::MAX as f64);
        n.map(|x| Some(x as usize))
            .ok_or_else(|| Error::value(self.func, name, "a non-negative integer", v))
    }

    /// A number option.
    pub fn f64(&self, name: &str) -> Result<f64> {
        self.opt_f64(name)?
            .ok_or_else(|| Error::missing(self.func, name, "a number"))
    }

    /// A number option if given.
    pub fn opt_f64(&self, name: &str) -> Result<Option<f64>> {
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        v.as_f64()
            .map(Some)
            .ok_or_else(|| Error::value(self.func, name, "a number", v))
    }

    /// A boolean option if given.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| Error::value(self.func, name, "true or false", v))
    }

    /// A string option if given.
    pub fn opt_str(&self, name: &str) -> Result<Option<&str>> {
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| Error::value(self.func, name, "a string", v))
    }

    /// An array of strings (a single string is accepted as an array of one).
    pub fn strings(&self, name: &str) -> Result<Vec<String>> {
        self.opt_strings(name)?
            .ok_or_else(|| Error::missing(self.func, name, "an array of strings"))
    }

    /// An array of strings if given.
    pub fn opt_strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        let Some(v) = self.json(name) else {
            return Ok(None);
        };
        match v {
            Value::String(s) => Ok(Some(vec![s.clone()])),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    x.as_str().map(str::to_owned).ok_or_else(|| {
                        Error::value(self.func, format!("{name}[{i}]"), "a string", json_kind(x))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            other => Err(Error::value(
                self.func,
                name,
                "an array of strings",
                json_kind(other),
            )),
        }
    }

    /// A path option, resolved: as given if it exists, else against the input file's folder and
    /// each of its parents.
    pub fn path(&self, name: &str) -> Result<PathBuf> {
        let raw = self
            .opt_str(name)?
            .ok_or_else(|| Error::missing(self.func, name, "a path"))?;
        let given = PathBuf::from(raw);
        if given.exists() || given.is_absolute() {
            return Ok(given);
        }
        let mut dir = self.base_dir.as_deref();
        while let Some(d) = dir {
            let candidate = d.join(&given);
            if candidate.exists() {
                return Ok(candidate);
            }
            dir = d.parent();
        }
        Err(Error::value(self.func, name, "an existing path", raw))
    }
}

/// Parses a tensor given as nested arrays or as `{"shape": [...], "data": [...]}`.
fn parse_tensor(func: &str, name: &str, v: &Value) -> Result<(Vec<usize>, Vec<f64>)> {
    if let Value::Object(obj) = v {
        let shape = obj
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|s| {
                s.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                Error::value(
                    func,
                    format!("{name}.shape"),
                    "an array of non-negative integers",
                    obj.get("shape").unwrap_or(&Value::Null),
                )
            })?;
        let data = obj.get("data").and_then(Value::as_array).ok_or_else(|| {
            Error::value(
                func,
                format!("{name}.data"),
                "a flat array of numbers",
                obj.get("data").unwrap_or(&Value::Null),
            )
        })?;
        // Checked: a shape whose product wraps (`[2^32, 2^32]` is 0 in usize) would match an
        // empty `data` and reach candle with a tensor of 2^64 elements.
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel != Some(data.len()) {
            let expected = numel.map_or_else(
                || "a shape whose element count fits in memory".to_string(),
                |n| format!("{n} numbers for shape {shape:?}"),
            );
            let got = match numel {
                Some(_) => format!("{} numbers", data.len()),
                None => format!("shape {shape:?}"),
            };
            return Err(Error::value(func, format!("{name}.data"), expected, got));
        }
        let data = data
            .iter()
            .enumerate()
            .map(|(i, x)| number(func, name, &i.to_string(), x))
            .collect::<Result<Vec<_>>>()?;
        return Ok((shape, data));
    }
    let mut shape = Vec::new();
    let mut probe = v;
    while let Value::Array(items) = probe {
        shape.push(items.len());
        match items.first() {
            Some(first) => probe = first,
            None => break,
        }
    }
    let mut data = Vec::with_capacity(shape.iter().product());
    flatten_nested(func, name, v, &shape, &mut Vec::new(), &mut data)?;
    Ok((shape, data))
}

fn flatten_nested(
    func: &str,
    name: &str,
    v: &Value,
    shape: &[usize],
    index: &mut Vec<usize>,
    out: &mut Vec<f64>,
) -> Result<()> {
    let depth = index.len();
    let at = || {
        index
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if depth == shape.len() {
        out.push(number(func, name, &at(), v)?);
        return Ok(());
    }
    let Value::Array(items) = v else {
        return Err(Error::value(
            func,
            format!("{name}[{}]", at()),
            format!(
                "an array of {} elements (rectangular nesting)",
                shape[depth]
            ),
            json_kind(v),
        ));
    };
    if items.len() != shape[depth] {
        return Err(Error::value(
            func,
            format!("{name}[{}]", at()),
            format!("{} elements (rows must have equal lengths)", shape[depth]),
            format!("{} elements", items.len()),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        index.push(i);
        flatten_nested(func, name, item, shape, index, out)?;
        index.pop();
    }
    Ok(())
}

fn number(func: &str, name: &str, at: &str, v: &Value) -> Result<f64> {
    // Non-finite numbers arrive as strings (JSON has no NaN); let finiteness checks name them.
    match v.as_str() {
        Some("NaN") => Ok(f64::NAN),
        Some("Infinity") => Ok(f64::INFINITY),
        Some("-Infinity") => Ok(f64::NEG_INFINITY),
        _ => v
            .as_f64()
            .ok_or_else(|| Error::value(func, format!("{name}[{at}]"), "a number", json_kind(v))),
    }
}

fn json_kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(a) => format!("an array of {} elements", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// One named output value.
#[derive(Debug, Clone)]
pub enum OutputValue {
    /// A tensor, written as `{"shape": [...], "data": [...]}`.
    Tensor(Tensor),
    /// A number.
    Scalar(f64),
    /// An integer.
    Int(i64),
    /// Text, written as an array of strings.
    Strings(Vec<String>),
    /// Any other JSON value.
    Json(Value),
}

/// The named outputs of one call, in a fixed order.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    items: Vec<(String, OutputValue)>,
}

impl Outputs {
    /// No outputs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tensor output.
    pub fn tensor(mut self, name: &str, t: &Tensor) -> Self {
        self.items
            .push((name.into(), OutputValue::Tensor(t.clone())));
        self
    }

    /// Adds a scalar output.
    pub fn scalar(mut self, name: &str, x: f64) -> Self {
        self.items.push((name.into(), OutputValue::Scalar(x)));
        self
    }

    /// Adds an integer output.
    pub fn int(mut self, name: &str, x: i64) -> Self {
        self.items.push((name.into(), OutputValue::Int(x)));
        self
    }

    /// Adds a text output.
    pub fn strings(mut self, name: &str, s: Vec<String>) -> Self {
        self.items.push((name.into(), OutputValue::Strings(s)));
        self
    }

    /// Adds a raw JSON output.
    pub fn json(mut self, name: &str, v: Value) -> Self {
        self.items.push((name.into(), OutputValue::Json(v)));
        self
    }

    /// The outputs in order.
    pub fn items(&self) -> &[(String, OutputValue)] {
        &self.items
    }

    /// The output named `name`.
    pub fn get(&self, name: &str) -> Option<&OutputValue> {
        self.items.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The JSON form: an object with one key per output. A JSON value cannot hold NaN or an
    /// infinity, so here they are `null`; [`Outputs::to_json_text`] keeps them.
    ///
    /// ```
    /// use atomrl_core::value::Outputs;
    /// let out = Outputs::new().scalar("loss", 0.5).to_json()?;
    /// assert_eq!(out["loss"], 0.5);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn to_json(&self) -> Result<Value> {
        self.to_json_with(|_| Value::Null)
    }

    /// The JSON text of [`Outputs::to_json`] on one line, with non-finite numbers written as
    /// Python's `json.dumps` writes them (`NaN`, `Infinity`, `-Infinity`) instead of `null`:
    /// an f32 loss that overflowed reads back in Python as `inf`, not as a missing value.
    ///
    /// ```
    /// use atomrl_core::value::Outputs;
    /// let text = Outputs::new().scalar("loss", f64::INFINITY).scalar("kl", f64::NAN).to_json_text()?;
    /// assert_eq!(text, r#"{"loss":Infinity,"kl":NaN}"#);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn to_json_text(&self) -> Result<String> {
        let value = self.to_json_with(non_finite_marker)?;
        let text = serde_json::to_string(&value).map_err(|e| Error::file("<JSON output>", e))?;
        Ok(NON_FINITE_LITERALS.iter().fold(text, |text, lit| {
            text.replace(&format!("\"\\u0001{lit}\""), lit)
        }))
    }

    /// The outputs holding NaN or an infinity, each with how many of its elements are.
    ///
    /// ```
    /// use atomrl_core::value::Outputs;
    /// let out = Outputs::new().scalar("loss", f64::INFINITY).scalar("kl", 0.0);
    /// assert_eq!(out.non_finite()?, vec![("loss".to_string(), 1)]);
    /// # Ok::<(), atomrl_core::Error>(())
    /// ```
    pub fn non_finite(&self) -> Result<Vec<(String, usize)>> {
        let mut found = Vec::new();
        for (name, v) in &self.items {
            let count = match v {
                OutputValue::Tensor(t) if t.dtype().is_float() => t
                    .flatten_all()
                    .and_then(|f| f.to_dtype(DType::F64))
                    .and_then(|f| f.to_vec1::<f64>())
                    .ctx("non_finite")?
                    .iter()
                    .filter(|x| !x.is_finite())
                    .count(),
                OutputValue::Scalar(x) => usize::from(!x.is_finite()),
                _ => 0,
            };
            if count > 0 {
                found.push((name.clone(), count));
            }
        }
        Ok(found)
    }

    fn to_json_with(&self, non_finite: fn(f64) -> Value) -> Result<Value> {
        let mut obj = Map::new();
        for (name, v) in &self.items {
            let json = match v {
                OutputValue::Tensor(t) => tensor_json(t, non_finite)?,
                OutputValue::Scalar(x) => f64_json(*x, non_finite),
                OutputValue::Int(x) => Value::from(*x),
                OutputValue::Strings(s) => Value::from(s.clone()),
                OutputValue::Json(v) => v.clone(),
            };
            obj.insert(name.clone(), json);
        }
        Ok(Value::Object(obj))
    }

    /// Writes the tensor and scalar outputs (scalars as rank-0 f64 tensors) to a safetensors
    /// file; text outputs are stored in the file's metadata as JSON.
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        let mut tensors = std::collections::HashMap::new();
        for (name, v) in &self.items {
            let t = match v {
                OutputValue::Tensor(t) => t.clone(),
                OutputValue::Scalar(x) => Tensor::new(*x, &Device::Cpu).ctx("save_safetensors")?,
                OutputValue::Int(x) => Tensor::new(*x, &Device::Cpu).ctx("save_safetensors")?,
                OutputValue::Strings(_) | OutputValue::Json(_) => continue,
            };
            tensors.insert(name.clone(), t);
        }
        candle_core::safetensors::save(&tensors, path).map_err(|e| Error::file(path.display(), e))
    }
}

/// `{"shape": [...], "data": [...]}` with the tensor's own element type (f32 stays f32 so that
/// the printed decimals are the shortest that round-trip); NaN and infinities are `null`.
///
/// ```
/// use atomrl_core::value::tensor_to_json;
/// let t = candle_core::Tensor::new(&[[0.5f32, 1.0]], &candle_core::Device::Cpu)?;
/// assert_eq!(tensor_to_json(&t)?, serde_json::json!({"shape": [1, 2], "data": [0.5, 1.0]}));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn tensor_to_json(t: &Tensor) -> Result<Value> {
    tensor_json(t, |_| Value::Null)
}

/// Python's spellings of the non-finite numbers, as `json.dumps` writes them.
const NON_FINITE_LITERALS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];

/// A string standing for a non-finite number until [`Outputs::to_json_text`] writes the bare
/// literal: a control character first, so no text output of a function can look like one.
fn non_finite_marker(x: f64) -> Value {
    let lit = match x {
        x if x.is_nan() => "NaN",
        x if x > 0.0 => "Infinity",
        _ => "-Infinity",
    };
    Value::String(format!("\u{1}{lit}"))
}

fn tensor_json(t: &Tensor, non_finite: fn(f64) -> Value) -> Result<Value> {
    let func = "tensor_to_json";
    let flat = t.flatten_all().ctx(func)?;
    let data = match t.dtype() {
        DType::F32 => Value::from(
            flat.to_vec1::<f32>()
                .ctx(func)?
                .into_iter()
                .map(|x| f32_json(x, non_finite))
                .collect::<Vec<_>>(),
        ),
        DType::F64 => Value::from(
            flat.to_vec1::<f64>()
                .ctx(func)?
                .into_iter()
                .map(|x| f64_json(x, non_finite))
                .collect::<Vec<_>>(),
        ),
        DType::U8 | DType::U32 | DType::I64 => Value::from(
            flat.to_dtype(DType::I64)
                .ctx(func)?
                .to_vec1::<i64>()
                .ctx(func)?,
        ),
        _ => Value::from(
            flat.to_dtype(DType::F32)
                .ctx(func)?
                .to_vec1::<f32>()
                .ctx(func)?
                .into_iter()
                .map(|x| f32_json(x, non_finite))
                .collect::<Vec<_>>(),
        ),
    };
    Ok(serde_json::json!({ "shape": t.dims(), "data": data }))
}

fn f32_json(x: f32, non_finite: fn(f64) -> Value) -> Value {
    // JSON numbers are f64; going through f32's shortest round-trip decimal prints 0.8660239
    // rather than the widened 0.8660238981246948.
    if !x.is_finite() {
        return non_finite(f64::from(x));
    }
    format!("{x}").parse::<f64>().map_or_else(
        |_| non_finite(f64::from(x)),
        |wide| f64_json(wide, non_finite),
    )
}

fn f64_json(x: f64, non_finite: fn(f64) -> Value) -> Value {
    serde_json::Number::from_f64(x).map_or_else(|| non_finite(x), Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{ArgSpec, OutputSpec};
    use serde_json::json;

    const SPEC: FnSpec = FnSpec {
        name: "f",
        crate_name: "atomrl-core",
        summary: "",
        formula: "",
        inputs: &[
            ArgSpec::tensor("x", "[N, T]", "f32", "values"),
            ArgSpec::option("k", "usize", "2", "an option"),
        ],
        outputs: &[OutputSpec::new("y", "[N]", "f32", "")],
        example_input: "{}",
        example_output: "{}",
    };

    #[test]
    fn a_shape_whose_element_count_overflows_is_refused() {
        let huge = json!({"x": {"shape": [4294967296u64, 4294967296u64], "data": []}});
        let i = Inputs::from_json(&SPEC, huge).unwrap();
        let e = i.float_tensor("x").unwrap_err().to_string();
        assert!(
            e.contains("`x.data`") && e.contains("fits in memory"),
            "{e}"
        );
    }

    #[test]
    fn nested_and_flat_tensors_parse_the_same() {
        let a = Inputs::from_json(&SPEC, json!({"x": [[1, 2, 3], [4, 5, 6]]})).unwrap();
        let b = Inputs::from_json(
            &SPEC,
            json!({"x": {"shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}}),
        )
        .unwrap();
        let (ta, tb) = (a.float_tensor("x").unwrap(), b.float_tensor("x").unwrap());
        assert_eq!(ta.dims(), &[2, 3]);
        assert_eq!(ta.to_vec2::<f32>().unwrap(), tb.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn ragged_rows_and_non_numbers_are_named() {
        let i = Inputs::from_json(&SPEC, json!({"x": [[1, 2], [3]]})).unwrap();
        let e = i.float_tensor("x").unwrap_err().to_string();
        assert!(e.contains("`x[1]`") && e.contains("2 elements"), "{e}");
        let i = Inputs::from_json(&SPEC, json!({"x": [[1, null]]})).unwrap();
        assert!(i
            .float_tensor("x")
            .unwrap_err()
            .to_string()
            .contains("`x[0, 1]` must be a number"));
    }

    #[test]
    fn unknown_and_missing_fields_are_rejected() {
        let e = Inputs::from_json(&SPEC, json!({"x": [1], "kk": 1}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown argument `kk`") && e.contains("x, k"),
            "{e}"
        );
        let e = Inputs::from_json(&SPEC, json!({"k": 1}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing required argument `x`"), "{e}");
    }

    #[test]
    fn integer_options_accept_integral_floats_only() {
        let i = Inputs::from_json(&SPEC, json!({"x": [1], "k": 4.0})).unwrap();
        assert_eq!(i.usize("k").unwrap(), 4);
        let i = Inputs::from_json(&SPEC, json!({"x": [1], "k": 2.5})).unwrap();
        assert!(i.usize("k").is_err());
    }

    #[test]
    fn outputs_serialise_tensors_flat() {
        let t = Tensor::new(&[[0.5f32, 1.0], [2.0, 3.0]], &Device::Cpu).unwrap();
        let out = Outputs::new()
            .tensor("t", &t)
            .scalar("s", 0.25)
            .to_json()
            .unwrap();
        assert_eq!(
            out,
            json!({"t": {"shape": [2, 2], "data": [0.5, 1.0, 2.0, 3.0]}, "s": 0.25})
        );
    }
}
