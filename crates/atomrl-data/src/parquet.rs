//! GSM8K parquet files (the format the hub serves datasets in), read with the parquet crate's
//! row API.

use std::path::Path;
use std::sync::Arc;

use atomrl_core::{Error, Result};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use crate::example::{short, Example};

/// The two columns of a GSM8K file.
const COLUMNS: [&str; 2] = ["question", "answer"];

/// Loads a GSM8K parquet file: string (or UTF-8 byte-array) columns `question` and `answer`,
/// other columns ignored. Each row becomes [`Example::from_gsm8k`]: the question is the
/// prompt, the number after `####` the ground truth, the answer text the completion.
///
/// # Errors
/// [`Error::File`] naming `path` when the file cannot be opened, is not parquet, lacks a column,
/// or is empty; and the row index (0-based, as in `datasets`) when a row is null, not text, or
/// has no `#### <answer>`.
///
/// ```
/// let err = atomrl_data::load_gsm8k_parquet("no/such.parquet".as_ref()).unwrap_err();
/// assert!(err.to_string().starts_with("no/such.parquet:"));
/// ```
pub fn load_gsm8k_parquet(path: &Path) -> Result<Vec<Example>> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::file(&name, e))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| Error::file(&name, format!("not a readable parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema();
    let mut fields = Vec::new();
    for col in COLUMNS {
        match schema.get_fields().iter().find(|f| f.name() == col) {
            Some(f) => fields.push(Arc::clone(f)),
            None => {
                let have: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
                return Err(Error::file(
                    &name,
                    format!(
                        "no `{col}` column (a GSM8K file has `question` and `answer`; this one \
                         has: {})",
                        have.join(", ")
                    ),
                ));
            }
        }
    }
    let projection = Type::group_type_builder(schema.name())
        .with_fields(fields)
        .build()
        .map_err(|e| Error::file(&name, e))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| Error::file(&name, e))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let at = |m: String| Error::file(&name, format!("row {i}: {m}"));
        let row = row.map_err(|e| at(e.to_string()))?;
        let mut question = None;
        let mut answer = None;
        for (col, value) in row.get_column_iter() {
            let text = text(col, value).map_err(at)?;
            match col.as_str() {
                "question" => question = Some(text),
                _ => answer = Some(text),
            }
        }
        let (Some(question), Some(answer)) = (question, answer) else {
            return Err(at("missing `question` or `answer`".into()));
        };
        let Some(ground_truth) = atomrl_reward::extract_gsm8k_ground_truth(&answer) else {
            return Err(at(format!(
                "`answer` has no `#### <answer>` line: {:?}",
                short(&answer)
            )));
        };
        out.push(Example {
            prompt: question.into(),
            ground_truth,
            completion: Some(answer),
            preference: None,
        });
    }
    if out.is_empty() {
        return Err(Error::file(&name, "no rows"));
    }
    Ok(out)
}

/// Loads a parquet dataset in any row shape [`crate::load_jsonl`] accepts (the hub serves
/// datasets as parquet): a GSM8K file (`question`, `answer`) through [`load_gsm8k_parquet`];
/// any other file row by row, each row read as a JSON object (strings, numbers, lists of
/// `{"role", "content"}` structs), so that preference files such as
/// `trl-lib/ultrafeedback_binarized` (`chosen` / `rejected` conversations) and `prompt` /
/// `messages` rows load as their JSON Lines forms do.
///
/// # Errors
/// [`Error::File`] naming the file (and `row N`) when it cannot be read, is not parquet, has no
/// rows, or a row is not in an accepted shape (the JSON Lines messages).
///
/// ```
/// let path = std::env::temp_dir().join("atomrl_doctest_not.parquet");
/// std::fs::write(&path, b"text").unwrap();
/// let err = atomrl_data::load_parquet(&path).unwrap_err().to_string();
/// assert!(err.contains("not a readable parquet file"), "{err}");
/// ```
pub fn load_parquet(path: &Path) -> Result<Vec<Example>> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| Error::file(&name, e))?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| Error::file(&name, format!("not a readable parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema();
    let has = |col: &str| schema.get_fields().iter().any(|f| f.name() == col);
    if COLUMNS.iter().all(|c| has(c)) {
        return load_gsm8k_parquet(path);
    }
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| Error::file(&name, e))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let at = |m: String| Error::file(&name, format!("row {i}: {m}"));
        let row = row.map_err(|e| at(e.to_string()))?;
        out.push(crate::jsonl::example_from_value(&row.to_json_value()).map_err(at)?);
    }
    if out.is_empty() {
        return Err(Error::file(&name, "no rows"));
    }
    Ok(out)
}

fn text(col: &str, value: &Field) -> Result<String, String> {
    match value {
        Field::Str(s) => Ok(s.clone()),
        Field::Bytes(b) => String::from_utf8(b.data().to_vec())
            .map_err(|_| format!("`{col}` is not valid UTF-8 text")),
        Field::Null => Err(format!("`{col}` is null")),
        other => Err(format!("`{col}` must be a string, got {other}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn not_parquet_is_an_error() {
        let path =
            std::env::temp_dir().join(format!("atomrl_not_parquet_{}.parquet", std::process::id()));
        std::fs::write(&path, b"hello").unwrap();
        let err = load_gsm8k_parquet(&path).unwrap_err().to_string();
        assert!(err.contains("not a readable parquet file"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
