//! Long help of one function: summary, formula, inputs, outputs and the worked example.

use atomrl_core::{ArgKind, FnSpec};

/// The text shown by `atomrl-fn NAME --help` before clap's usage and flag list.
pub fn long_about(spec: &FnSpec) -> String {
    let mut s = format!("{}\n[crate {}]\n\nFORMULA\n", spec.summary, spec.crate_name);
    for line in spec.formula.lines() {
        s.push_str(&format!("  {line}\n"));
    }
    s.push_str("\nINPUTS (JSON fields; each is also a --flag)\n");
    let rows: Vec<[String; 5]> = spec
        .inputs
        .iter()
        .map(|a| {
            let default = match (a.required, a.default) {
                (true, _) => "required".to_string(),
                (false, Some(d)) => d.to_string(),
                (false, None) => "(absent)".to_string(),
            };
            let shape = match a.kind {
                ArgKind::Tensor | ArgKind::Text => a.shape.to_string(),
                ArgKind::Option | ArgKind::Path => String::new(),
            };
            [
                a.name.to_string(),
                shape,
                a.dtype.to_string(),
                default,
                a.doc.to_string(),
            ]
        })
        .collect();
    s.push_str(&table(
        &["name", "shape", "dtype", "default", "meaning"],
        &rows,
    ));
    s.push_str("\nOUTPUTS\n");
    let rows: Vec<[String; 5]> = spec
        .outputs
        .iter()
        .map(|o| {
            [
                o.name.into(),
                o.shape.into(),
                o.dtype.into(),
                String::new(),
                o.doc.into(),
            ]
        })
        .collect();
    s.push_str(&table(&["name", "shape", "dtype", "", "meaning"], &rows));
    s.push_str(
        "\nTensors are read as nested arrays or {\"shape\": [...], \"data\": [...]} and written as\n\
         {\"shape\": [...], \"data\": [flat row-major]}; N = prompts x group size, T = completion length.",
    );
    s
}

/// The worked example, shown after the flag list.
pub fn example(spec: &FnSpec) -> String {
    format!(
        "EXAMPLE\n  $ echo '{}' | atomrl-fn {} --input -\n  {}\n\n\
         Other forms: --input batch.json | --input batch.safetensors (options as flags or in the\n\
         file's metadata) and --output out.json | out.safetensors.",
        spec.example_input, spec.name, spec.example_output
    )
}

fn table(header: &[&str; 5], rows: &[[String; 5]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut l = String::from(" ");
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(&format!(" {cell}"));
            } else {
                l.push_str(&format!(" {cell:<w$}"));
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut s = line(*header);
    for row in rows {
        s.push_str(&line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
    }
    s
}
