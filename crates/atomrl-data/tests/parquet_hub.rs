//! GSM8K parquet files (written here with the parquet crate's writer) and the hub cache layout.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use atomrl_core::Error;
use atomrl_data::{
    load_gsm8k_parquet, resolve_hub_dataset, resolve_hub_dataset_shards, DataSource, Prompt,
};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// A fresh temporary folder for one test.
fn tmp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("atomrl_data_pq_{name}_"))
        .tempdir()
        .unwrap()
}

/// One column of cells (`None` = null, for OPTIONAL columns).
type Column = Vec<Option<String>>;

/// A column of non-null cells.
fn col(cells: &[&str]) -> Column {
    cells.iter().map(|s| Some(s.to_string())).collect()
}

/// Writes a parquet file with the given `message` schema (BYTE_ARRAY columns only);
/// `columns[c][r]` is row `r` of column `c`. Snappy-compressed, like the hub's files.
fn write_parquet(path: &Path, message: &str, columns: &[Column]) {
    let schema = parse_message_type(message).unwrap();
    let optional: Vec<bool> = schema
        .get_fields()
        .iter()
        .map(|f| f.is_optional())
        .collect();
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
    let mut rg = writer.next_row_group().unwrap();
    let mut c = 0;
    while let Some(mut w) = rg.next_column().unwrap() {
        let cells = &columns[c];
        let values: Vec<ByteArray> = cells
            .iter()
            .flatten()
            .map(|s| ByteArray::from(s.as_str()))
            .collect();
        let defs: Vec<i16> = cells.iter().map(|v| i16::from(v.is_some())).collect();
        w.typed::<ByteArrayType>()
            .write_batch(&values, optional[c].then_some(&defs[..]), None)
            .unwrap();
        w.close().unwrap();
        c += 1;
    }
    rg.close().unwrap();
    writer.close().unwrap();
}

const GSM8K_SCHEMA: &str = "message schema {
    REQUIRED BYTE_ARRAY question (UTF8);
    REQUIRED BYTE_ARRAY answer (UTF8);
}";

/// `n` GSM8K-shaped rows: "{prefix} question {i}: what is {i} plus {i}?" with answer 2i.
fn gsm8k_rows(prefix: &str, n: usize) -> Vec<Column> {
    let q = (0..n).map(|i| Some(format!("{prefix} question {i}: what is {i} plus {i}?")));
    let a = (0..n).map(|i| Some(format!("{i} + {i} = <<{i}+{i}={0}>>{0}\n#### {0}", 2 * i)));
    vec![q.collect(), a.collect()]
}

/// A hub cache with `datasets--{org}--{name}/refs/main` and the given files in its snapshot.
fn hub_cache(name: &str, repo_id: &str, files: &[(&str, &str, Vec<Column>)]) -> tempfile::TempDir {
    let cache_tmp = tmp_dir(name);
    let cache = cache_tmp.path();
    let repo = cache.join(format!("datasets--{}", repo_id.replace('/', "--")));
    let rev = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), format!("{rev}\n")).unwrap();
    // A stale snapshot that refs/main does not point at.
    std::fs::create_dir_all(repo.join("snapshots/deadbeef/main")).unwrap();
    let snap = repo.join("snapshots").join(rev);
    for (rel, schema, cols) in files {
        let path = snap.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        write_parquet(&path, schema, cols);
    }
    cache_tmp
}

fn file_error(err: Error) -> (String, String) {
    match err {
        Error::File { path, message } => (path, message),
        other => panic!("expected Error::File, got {other:?}"),
    }
}

#[test]
fn loads_a_gsm8k_parquet_file() {
    let dir_tmp = tmp_dir("load");
    let dir = dir_tmp.path();
    let path = dir.join("train.parquet");
    write_parquet(&path, GSM8K_SCHEMA, &gsm8k_rows("t", 5));
    let rows = load_gsm8k_parquet(&path).unwrap();
    assert_eq!(rows.len(), 5);
    assert_eq!(
        rows[3].prompt,
        Prompt::Text("t question 3: what is 3 plus 3?".into())
    );
    assert_eq!(rows[3].ground_truth, "6");
    assert_eq!(
        rows[3].completion.as_deref(),
        Some("3 + 3 = <<3+3=6>>6\n#### 6")
    );
    assert_eq!(
        DataSource::parse(path.to_str().unwrap()).unwrap(),
        DataSource::Parquet(path.clone())
    );
}

#[test]
fn extra_columns_and_plain_byte_arrays_are_fine() {
    let dir_tmp = tmp_dir("extra");
    let dir = dir_tmp.path();
    let path = dir.join("x.parquet");
    let schema = "message schema {
        REQUIRED BYTE_ARRAY id (UTF8);
        REQUIRED BYTE_ARRAY answer;
        REQUIRED BYTE_ARRAY question;
    }";
    write_parquet(
        &path,
        schema,
        &[
            col(&["a", "b"]),
            col(&["so #### 7", "#### $1,000"]),
            col(&["q1", "q2"]),
        ],
    );
    let rows = load_gsm8k_parquet(&path).unwrap();
    assert_eq!(rows[0].prompt, Prompt::Text("q1".into()));
    assert_eq!(rows[0].ground_truth, "7");
    assert_eq!(rows[1].ground_truth, "1000");
}

#[test]
fn bad_rows_and_files_are_named() {
    let dir_tmp = tmp_dir("bad");
    let dir = dir_tmp.path();
    let missing = dir.join("missing_col.parquet");
    write_parquet(
        &missing,
        "message schema { REQUIRED BYTE_ARRAY question (UTF8); }",
        &[col(&["q"])],
    );
    let (path, message) = file_error(load_gsm8k_parquet(&missing).unwrap_err());
    assert!(path.ends_with("missing_col.parquet"), "{path}");
    assert!(
        message.contains("no `answer` column") && message.contains("has: question"),
        "{message}"
    );

    let nulls = dir.join("nulls.parquet");
    let schema = "message schema {
        REQUIRED BYTE_ARRAY question (UTF8);
        OPTIONAL BYTE_ARRAY answer (UTF8);
    }";
    write_parquet(
        &nulls,
        schema,
        &[col(&["q0", "q1"]), vec![Some("#### 1".to_string()), None]],
    );
    let (path, message) = file_error(load_gsm8k_parquet(&nulls).unwrap_err());
    assert!(path.ends_with("nulls.parquet"), "{path}");
    assert_eq!(message, "row 1: `answer` is null");

    let no_marker = dir.join("no_marker.parquet");
    write_parquet(
        &no_marker,
        GSM8K_SCHEMA,
        &[
            col(&["q0", "q1", "q2"]),
            col(&["#### 1", "#### 2", "just 3"]),
        ],
    );
    let (_, message) = file_error(load_gsm8k_parquet(&no_marker).unwrap_err());
    assert!(
        message.starts_with("row 2: `answer` has no `#### <answer>` line"),
        "{message}"
    );

    let empty = dir.join("empty.parquet");
    write_parquet(&empty, GSM8K_SCHEMA, &[vec![], vec![]]);
    let (_, message) = file_error(load_gsm8k_parquet(&empty).unwrap_err());
    assert_eq!(message, "no rows");
}

#[test]
fn resolves_the_real_gsm8k_layout_through_refs_main() {
    let cache_tmp = hub_cache(
        "gsm8k",
        "openai/gsm8k",
        &[
            (
                "main/train-00000-of-00001.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("train", 6),
            ),
            (
                "main/test-00000-of-00001.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("test", 3),
            ),
            (
                "socratic/test-00000-of-00001.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("socratic", 2),
            ),
        ],
    );
    let cache = cache_tmp.path();
    let path = resolve_hub_dataset(cache, "openai/gsm8k", Some("main"), "test").unwrap();
    assert!(path.ends_with(
        "datasets--openai--gsm8k/snapshots/0123456789abcdef0123456789abcdef01234567/main/test-00000-of-00001.parquet"
    ), "{}", path.display());

    // `openai/gsm8k` defaults to config `main`.
    let src = DataSource::parse("openai/gsm8k").unwrap();
    let test = src.load_from_cache(cache, "test").unwrap();
    assert_eq!(test.len(), 3);
    assert!(test[0]
        .prompt
        .as_text()
        .unwrap()
        .starts_with("test question"));
    assert_eq!(src.load_from_cache(cache, "train").unwrap().len(), 6);
    let socratic = DataSource::parse("openai/gsm8k:socratic").unwrap();
    assert_eq!(socratic.load_from_cache(cache, "test").unwrap().len(), 2);

    let (path, message) = file_error(src.load_from_cache(cache, "validation").unwrap_err());
    assert!(path.contains("snapshots/0123456789abcdef"), "{path}");
    assert!(
        message.contains("no `validation` split")
            && message.contains("main/validation-*.{parquet,jsonl}"),
        "{message}"
    );
}

#[test]
fn data_folder_root_files_and_shards() {
    let cache_tmp = hub_cache(
        "layouts",
        "someone/math",
        &[
            (
                "data/train-00000-of-00002.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("a", 2),
            ),
            (
                "data/train-00001-of-00002.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("b", 3),
            ),
            (
                "test-00000-of-00001.parquet",
                GSM8K_SCHEMA,
                gsm8k_rows("root", 1),
            ),
        ],
    );
    let cache = cache_tmp.path();
    let shards = resolve_hub_dataset_shards(cache, "someone/math", None, "train").unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards[0].ends_with("data/train-00000-of-00002.parquet"));
    let err = resolve_hub_dataset(cache, "someone/math", None, "train").unwrap_err();
    assert!(err.to_string().contains("2 shards"), "{err}");
    let src = DataSource::parse("someone/math").unwrap();
    let train = src.load_from_cache(cache, "train").unwrap();
    assert_eq!(train.len(), 5, "all shards, in order");
    assert!(train[0]
        .prompt
        .as_text()
        .unwrap()
        .starts_with("a question 0"));
    assert!(train[4]
        .prompt
        .as_text()
        .unwrap()
        .starts_with("b question 2"));
    let test = resolve_hub_dataset(cache, "someone/math", None, "test").unwrap();
    assert!(test.ends_with("test-00000-of-00001.parquet"));
}

#[test]
fn not_cached_says_how_to_download() {
    let cache_tmp = tmp_dir("empty_cache");
    let cache = cache_tmp.path();
    let (path, message) =
        file_error(resolve_hub_dataset(cache, "openai/gsm8k", Some("main"), "train").unwrap_err());
    assert!(path.ends_with("datasets--openai--gsm8k"), "{path}");
    assert!(
        message.contains("huggingface-cli download openai/gsm8k --repo-type dataset"),
        "{message}"
    );
    assert!(message.contains("atomrl-train"), "{message}");
    // A repo without refs/main but with a single snapshot is still found.
    let snap = cache.join("datasets--org--one/snapshots/abc/main");
    std::fs::create_dir_all(&snap).unwrap();
    write_parquet(
        &snap.join("train-00000-of-00001.parquet"),
        GSM8K_SCHEMA,
        &gsm8k_rows("x", 1),
    );
    assert!(resolve_hub_dataset(cache, "org/one", Some("main"), "train").is_ok());
}

/// The hub's layout of a conversational preference dataset (`trl-lib/ultrafeedback_binarized`):
/// `chosen` and `rejected` are lists of `{content, role}` structs, here with a score column.
const CONVERSATION_SCHEMA: &str = "message schema {
    REQUIRED group chosen (LIST) {
        REPEATED group list {
            REQUIRED group element {
                REQUIRED BYTE_ARRAY content (UTF8);
                REQUIRED BYTE_ARRAY role (UTF8);
            }
        }
    }
    REQUIRED group rejected (LIST) {
        REPEATED group list {
            REQUIRED group element {
                REQUIRED BYTE_ARRAY content (UTF8);
                REQUIRED BYTE_ARRAY role (UTF8);
            }
        }
    }
    REQUIRED DOUBLE score_chosen;
}";

/// Writes rows of `(chosen, rejected, score)` conversations (`(role, content)` messages) with
/// [`CONVERSATION_SCHEMA`]: each leaf column carries the messages' repetition levels.
/// `(role, content)` messages.
type Conversation<'a> = Vec<(&'a str, &'a str)>;

fn write_conversations(path: &Path, rows: &[(Conversation<'_>, Conversation<'_>, f64)]) {
    let schema = parse_message_type(CONVERSATION_SCHEMA).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), props).unwrap();
    let mut rg = writer.next_row_group().unwrap();
    let mut c = 0;
    while let Some(mut w) = rg.next_column().unwrap() {
        if c == 4 {
            let scores: Vec<f64> = rows.iter().map(|r| r.2).collect();
            w.typed::<parquet::data_type::DoubleType>()
                .write_batch(&scores, None, None)
                .unwrap();
        } else {
            // Columns: chosen.content, chosen.role, rejected.content, rejected.role.
            let (mut values, mut defs, mut reps) = (Vec::new(), Vec::new(), Vec::new());
            for row in rows {
                let side = if c < 2 { &row.0 } else { &row.1 };
                for (i, (role, content)) in side.iter().enumerate() {
                    values.push(ByteArray::from(if c % 2 == 0 { *content } else { *role }));
                    defs.push(1);
                    reps.push(i16::from(i > 0));
                }
            }
            w.typed::<ByteArrayType>()
                .write_batch(&values, Some(&defs), Some(&reps))
                .unwrap();
        }
        w.close().unwrap();
        c += 1;
    }
    rg.close().unwrap();
    writer.close().unwrap();
}

#[test]
fn loads_preference_pairs_from_parquet_and_names_bad_rows() {
    let dir_tmp = tmp_dir("preference");
    let dir = dir_tmp.path();
    let path = dir.join("train_prefs.parquet");
    let user = ("user", "Say hi.");
    write_conversations(
        &path,
        &[
            (
                vec![user, ("assistant", "Hi!")],
                vec![user, ("assistant", "No.")],
                8.0,
            ),
            (
                vec![("user", "2+2?"), ("assistant", "4")],
                vec![("user", "2+2?"), ("assistant", "5")],
                9.5,
            ),
        ],
    );
    let rows = atomrl_data::load_parquet(&path).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[1].prompt,
        Prompt::Messages(vec![atomrl_data::ChatMessage::new("user", "2+2?")])
    );
    let p = rows[0].preference.as_ref().unwrap();
    assert_eq!((p.chosen.as_str(), p.rejected.as_str()), ("Hi!", "No."));
    // Through the data source, as a file path.
    let loaded = DataSource::parse(path.to_str().unwrap())
        .unwrap()
        .load("train")
        .unwrap();
    assert_eq!(loaded, rows);

    // A pair whose sides are the same is refused, naming the file and the row.
    let same = dir.join("same.parquet");
    write_conversations(
        &same,
        &[
            (
                vec![user, ("assistant", "Hi!")],
                vec![user, ("assistant", "No.")],
                1.0,
            ),
            (
                vec![user, ("assistant", "Hi!")],
                vec![user, ("assistant", "Hi!")],
                1.0,
            ),
        ],
    );
    let (at, message) = file_error(atomrl_data::load_parquet(&same).unwrap_err());
    assert!(at.ends_with("same.parquet"), "{at}");
    assert!(
        message.starts_with("row 1: ") && message.contains("identical"),
        "{message}"
    );

    // Plain string columns: the standard form.
    let plain = dir.join("plain.parquet");
    write_parquet(
        &plain,
        "message schema {
            REQUIRED BYTE_ARRAY prompt (UTF8);
            REQUIRED BYTE_ARRAY chosen (UTF8);
            REQUIRED BYTE_ARRAY rejected (UTF8);
        }",
        &[col(&["q1", "q2"]), col(&["a", "b"]), col(&["c", ""])],
    );
    let (_, message) = file_error(atomrl_data::load_parquet(&plain).unwrap_err());
    assert!(
        message.starts_with("row 1: `rejected` is empty"),
        "{message}"
    );
}
