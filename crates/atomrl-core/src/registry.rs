//! The registry through which every atomic crate describes and runs its functions.
//!
//! Each atomic crate exposes `pub fn functions() -> Vec<AtomicFn>`; the `atomrl-fn` binary
//! collects them. An [`AtomicFn`] pairs a static [`FnSpec`] (summary, formula, the shape of
//! every input and output, a worked example) with a `run` function from named [`Inputs`] to
//! named [`Outputs`]. The worked example is data: [`check_example`] runs it and compares the
//! result with the output printed in `--help`, so the help cannot drift from the behaviour.

use crate::compare::json_close;
use crate::error::Result;
use crate::value::{Inputs, Outputs};

/// What kind of value an argument takes; decides how it is parsed and shown in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A tensor: nested JSON arrays, `{"shape": [...], "data": [...]}`, or a safetensors entry.
    Tensor,
    /// A plain option: a number, string or boolean (also settable as a `--flag`).
    Option,
    /// Text data: a string or an array of strings.
    Text,
    /// A path to a file or folder; relative paths are also tried against the input file's
    /// folder and its parents.
    Path,
}

/// One input of an atomic function.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    /// Field name in the input JSON (snake_case); the flag is the kebab-case form.
    pub name: &'static str,
    /// Kind of value.
    pub kind: ArgKind,
    /// Shape in the `[N, T]` notation, or the value type for options (`usize`, `f64`, ...).
    pub shape: &'static str,
    /// Element type (`f32`, `u32`, `string`, ...).
    pub dtype: &'static str,
    /// Default value as shown to users; `None` with `required = false` means "absent".
    pub default: Option<&'static str>,
    /// Whether the argument must be given.
    pub required: bool,
    /// One-line description.
    pub doc: &'static str,
}

impl ArgSpec {
    /// A required tensor argument.
    pub const fn tensor(
        name: &'static str,
        shape: &'static str,
        dtype: &'static str,
        doc: &'static str,
    ) -> Self {
        Self {
            name,
            kind: ArgKind::Tensor,
            shape,
            dtype,
            default: None,
            required: true,
            doc,
        }
    }

    /// An optional tensor argument.
    pub const fn optional_tensor(
        name: &'static str,
        shape: &'static str,
        dtype: &'static str,
        doc: &'static str,
    ) -> Self {
        Self {
            name,
            kind: ArgKind::Tensor,
            shape,
            dtype,
            default: None,
            required: false,
            doc,
        }
    }

    /// An option with a default value.
    pub const fn option(
        name: &'static str,
        ty: &'static str,
        default: &'static str,
        doc: &'static str,
    ) -> Self {
        Self {
            name,
            kind: ArgKind::Option,
            shape: ty,
            dtype: ty,
            default: Some(default),
            required: false,
            doc,
        }
    }

    /// An option that must be given.
    pub const fn required_option(name: &'static str, ty: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ArgKind::Option,
            shape: ty,
            dtype: ty,
            default: None,
            required: true,
            doc,
        }
    }

    /// An option that may be absent (no default).
    pub const fn optional(name: &'static str, ty: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ArgKind::Option,
            shape: ty,
            dtype: ty,
            default: None,
            required: false,
            doc,
        }
    }

    /// Text data (a string or array of strings), required.
    pub const fn text(name: &'static str, shape: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ArgKind::Text,
            shape,
            dtype: "string",
            default: None,
            required: true,
            doc,
        }
    }

    /// A path argument, required.
    pub const fn path(name: &'static str, doc: &'static str) -> Self {
        Self {
            name,
            kind: ArgKind::Path,
            shape: "path",
            dtype: "path",
            default: None,
            required: true,
            doc,
        }
    }

    /// The same argument, made optional (for text and path arguments).
    pub const fn not_required(mut self) -> Self {
        self.required = false;
        self
    }
}

/// One output of an atomic function.
#[derive(Debug, Clone, Copy)]
pub struct OutputSpec {
    /// Key in the output JSON / safetensors file.
    pub name: &'static str,
    /// Shape in the `[N, T]` notation (`scalar` for numbers).
    pub shape: &'static str,
    /// Element type.
    pub dtype: &'static str,
    /// One-line description.
    pub doc: &'static str,
}

impl OutputSpec {
    /// Describes one output.
    pub const fn new(
        name: &'static str,
        shape: &'static str,
        dtype: &'static str,
        doc: &'static str,
    ) -> Self {
        Self {
            name,
            shape,
            dtype,
            doc,
        }
    }
}

/// Static description of an atomic function, shown by `atomrl-fn NAME --help`.
#[derive(Debug, Clone, Copy)]
pub struct FnSpec {
    /// The library function's own snake_case name.
    pub name: &'static str,
    /// The crate that implements it.
    pub crate_name: &'static str,
    /// One-line summary (shown by `atomrl-fn list`).
    pub summary: &'static str,
    /// The formula and semantics, several lines of plain text.
    pub formula: &'static str,
    /// Every input.
    pub inputs: &'static [ArgSpec],
    /// Every output.
    pub outputs: &'static [OutputSpec],
    /// A worked example's input, as JSON.
    pub example_input: &'static str,
    /// The output the example gives, as JSON (checked by [`check_example`]).
    pub example_output: &'static str,
}

impl FnSpec {
    /// The input named `name`, if any.
    pub fn input(&self, name: &str) -> Option<&ArgSpec> {
        self.inputs.iter().find(|a| a.name == name)
    }
}

/// An atomic function as registered with `atomrl-fn`.
#[derive(Debug, Clone, Copy)]
pub struct AtomicFn {
    /// Its description.
    pub spec: FnSpec,
    /// Runs it on named inputs.
    pub run: fn(&Inputs) -> Result<Outputs>,
}

impl AtomicFn {
    /// Runs the function on a JSON object of inputs (checked against the spec first).
    pub fn run_json(&self, input: serde_json::Value) -> Result<Outputs> {
        let inputs = Inputs::from_json(&self.spec, input)?;
        (self.run)(&inputs)
    }
}

/// Runs `f`'s worked example and compares the result with the output stored in its spec
/// (relative and absolute tolerance 1e-5). Returns a description of the first mismatch.
pub fn check_example(f: &AtomicFn) -> std::result::Result<(), String> {
    let input: serde_json::Value = serde_json::from_str(f.spec.example_input)
        .map_err(|e| format!("{}: example_input is not JSON: {e}", f.spec.name))?;
    let expected: serde_json::Value = serde_json::from_str(f.spec.example_output)
        .map_err(|e| format!("{}: example_output is not JSON: {e}", f.spec.name))?;
    let got = f
        .run_json(input)
        .map_err(|e| format!("{}: example failed: {e}", f.spec.name))?
        .to_json()
        .map_err(|e| format!("{}: example output: {e}", f.spec.name))?;
    json_close(&expected, &got, 1e-5, 1e-5)
        .map_err(|e| format!("{}: example output {e}", f.spec.name))
}
