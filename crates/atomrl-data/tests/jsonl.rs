//! JSON Lines loading: every accepted row shape, file:line errors, write/load round trip.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use atomrl_core::Error;
use atomrl_data::{load_jsonl, parse_jsonl, write_jsonl, ChatMessage, DataSource, Example, Prompt};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/data")
        .join(name)
}

/// `name` in a fresh temporary folder, which is removed when the returned guard drops.
fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("atomrl_data_jsonl_")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// The error's (path, message), which must be an [`Error::File`].
fn file_error(err: Error) -> (String, String) {
    match err {
        Error::File { path, message } => (path, message),
        other => panic!("expected Error::File, got {other:?}"),
    }
}

#[test]
fn grpo_rows_text_messages_and_numeric_ground_truth() {
    let rows = load_jsonl(&fixture("grpo.jsonl")).unwrap();
    assert_eq!(rows.len(), 3, "the blank line is skipped");
    assert_eq!(
        rows[0].prompt,
        Prompt::Text("Tom has 3 apples and buys 4 more. How many apples does Tom have?".into())
    );
    assert_eq!(rows[0].ground_truth, "7");
    assert_eq!(rows[0].completion, None);
    assert_eq!(
        rows[1].prompt,
        Prompt::Messages(vec![
            ChatMessage::new("system", "Answer with a number."),
            ChatMessage::new("user", "What is 6 times 7?"),
        ])
    );
    assert_eq!(rows[1].ground_truth, "42");
    assert_eq!(rows[2].ground_truth, "4.5");
}

#[test]
fn sft_rows_prompt_completion_and_chat() {
    let rows = load_jsonl(&fixture("sft.jsonl")).unwrap();
    assert_eq!(
        rows[0].ground_truth, "",
        "ground truth is optional with a completion"
    );
    assert_eq!(
        rows[0].completion.as_deref(),
        Some("<think>\n2+3=5\n</think>\n<answer>\n5\n</answer>")
    );
    assert_eq!(
        rows[1].prompt,
        Prompt::Messages(vec![ChatMessage::new("user", "What is 10-4?")])
    );
    assert_eq!(
        rows[1].completion.as_deref(),
        Some("<think>\n10-4=6\n</think>\n<answer>\n6\n</answer>")
    );
    assert_eq!(rows[1].ground_truth, "6");
}

#[test]
fn gsm8k_rows_take_the_answer_after_hashes() {
    let rows = load_jsonl(&fixture("gsm8k.jsonl")).unwrap();
    assert_eq!(rows[0].ground_truth, "42");
    assert_eq!(
        rows[1].ground_truth, "1200",
        "thousands separators are removed"
    );
    assert!(rows[0].completion.as_deref().unwrap().ends_with("#### 42"));
    assert!(rows[0].prompt.as_text().unwrap().starts_with("A baker"));
}

#[test]
fn invalid_json_names_line_and_column() {
    let (path, message) = file_error(load_jsonl(&fixture("bad_json.jsonl")).unwrap_err());
    assert!(path.ends_with("bad_json.jsonl:2"), "{path}");
    assert!(message.starts_with("invalid JSON at column "), "{message}");
    assert!(!message.contains(" at line "), "{message}");
}

#[test]
fn chat_row_must_end_with_the_assistant() {
    let (path, message) = file_error(load_jsonl(&fixture("bad_chat.jsonl")).unwrap_err());
    assert!(
        path.ends_with("bad_chat.jsonl:4"),
        "blank lines still count: {path}"
    );
    assert!(message.contains("role `assistant`"), "{message}");
    assert!(message.contains("got role `user`"), "{message}");
}

#[test]
fn empty_and_missing_files() {
    let (path, message) = file_error(load_jsonl(&fixture("empty.jsonl")).unwrap_err());
    assert!(path.ends_with("empty.jsonl"), "{path}");
    assert!(message.contains("empty"), "{message}");
    let (path, _) = file_error(load_jsonl(&fixture("no_such.jsonl")).unwrap_err());
    assert!(path.ends_with("no_such.jsonl"));
}

#[test]
fn field_errors_name_the_field() {
    let cases = [
        (r#"{"prompt": "q"}"#, "missing field `ground_truth`"),
        (
            r#"{"prompt": "q", "ground_truth": true}"#,
            "`ground_truth` must be a string or a number, got a boolean",
        ),
        (
            r#"{"prompt": 5, "ground_truth": "1"}"#,
            "`prompt` must be a string or a list of messages, got a number",
        ),
        (
            r#"{"prompt": "q", "completion": 3}"#,
            "`completion` must be a string, got a number",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 1}, {"role": "assistant", "content": "a"}]}"#,
            "`messages[0].content` must be a string",
        ),
        (r#"{"messages": "hi"}"#, "`messages` must be a list"),
        (
            r#"{"question": "q", "answer": "42"}"#,
            "no `#### <answer>` line",
        ),
        (
            r#####"{"question": 1, "answer": "#### 1"}"#####,
            "`question` must be a string",
        ),
        (r#"{"input": "q", "output": "a"}"#, "it has: input, output"),
        (r#""just a string""#, "expected a JSON object, got a string"),
    ];
    for (row, want) in cases {
        let text = format!("{{\"prompt\": \"fine\", \"ground_truth\": \"1\"}}\n{row}\n");
        let (path, message) = file_error(parse_jsonl(&text, "rows.jsonl").unwrap_err());
        assert_eq!(path, "rows.jsonl:2", "{row}");
        assert!(message.contains(want), "{row}: {message}");
    }
}

#[test]
fn write_then_load_round_trips() {
    let rows = vec![
        Example::new("What is 5+7?", "12"),
        Example::new(
            Prompt::Messages(vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Ünïcode \"quotes\"\nand newlines?"),
            ]),
            "3",
        )
        .with_completion("<think>\n1+2=3\n</think>\n<answer>\n3\n</answer>"),
        Example::new("SFT only", "").with_completion("done"),
    ];
    let (_dir, path) = tmp("round_trip.jsonl");
    write_jsonl(&path, &rows).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert!(
        text.starts_with(r#"{"prompt":"What is 5+7?","ground_truth":"12"}"#),
        "{text}"
    );
    assert_eq!(load_jsonl(&path).unwrap(), rows);
    assert_eq!(
        DataSource::parse(path.to_str().unwrap())
            .unwrap()
            .load("train")
            .unwrap(),
        rows
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn json_array_files_are_accepted() {
    let (_dir, path) = tmp("array.json");
    std::fs::write(
        &path,
        r#####"[{"prompt": "a", "ground_truth": 1}, {"question": "b", "answer": "#### 2"}]"#####,
    )
    .unwrap();
    let src = DataSource::parse(path.to_str().unwrap()).unwrap();
    assert_eq!(src, DataSource::Jsonl(path.clone()));
    let rows = src.load("train").unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r.ground_truth.as_str())
            .collect::<Vec<_>>(),
        ["1", "2"]
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn preference_rows_in_trl_formats() {
    let rows = load_jsonl(&fixture("preference.jsonl")).unwrap();
    assert_eq!(rows.len(), 3);
    let p: Vec<_> = rows.iter().map(|r| r.preference.clone().unwrap()).collect();
    // Standard form.
    assert_eq!(rows[0].prompt, Prompt::Text("What is 2 + 3?".into()));
    assert_eq!(
        (p[0].chosen.as_str(), p[0].rejected.as_str()),
        ("<think>2+3=5</think>\n5", "6")
    );
    assert_eq!(p[0].margin, None);
    // Conversational with an explicit prompt, and a margin.
    assert_eq!(
        rows[1].prompt,
        Prompt::Messages(vec![
            ChatMessage::new("system", "Answer briefly."),
            ChatMessage::new("user", "Capital of France?"),
        ])
    );
    assert_eq!((p[1].chosen.as_str(), p[1].margin), ("Paris.", Some(2.0)));
    // Implicit prompt: the messages both sides share.
    assert_eq!(
        rows[2].prompt,
        Prompt::Messages(vec![ChatMessage::new("user", "Say hi.")])
    );
    assert_eq!(
        (p[2].chosen.as_str(), p[2].rejected.as_str()),
        ("Hi!", "No.")
    );
    assert_eq!(rows[2].ground_truth, "1");
    // Written back as top-level fields, read back unchanged.
    let (_dir, path) = tmp("preference_round_trip.jsonl");
    write_jsonl(&path, &rows).unwrap();
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("\"chosen\":\"Paris.\""));
    assert_eq!(load_jsonl(&path).unwrap(), rows);
}

#[test]
fn bad_preference_rows_name_the_file_and_line() {
    let ok = r#"{"prompt": "q", "chosen": "a", "rejected": "b"}"#;
    for (row, needle) in [
        (
            r#"{"prompt": "q", "chosen": "", "rejected": "b"}"#,
            "`chosen` is empty",
        ),
        (
            r#"{"prompt": "q", "chosen": "a", "rejected": "  "}"#,
            "`rejected` is empty",
        ),
        (
            r#"{"prompt": "q", "chosen": "same", "rejected": "same"}"#,
            "identical",
        ),
        (
            r#"{"prompt": "q", "chosen": "a"}"#,
            "missing field `rejected`",
        ),
        (
            r#"{"chosen": "a", "rejected": "b"}"#,
            "missing field `prompt`",
        ),
        (
            r#"{"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}"#,
            "`margin` must be a number",
        ),
        (
            r#"{"prompt": "q", "chosen": 3, "rejected": "b"}"#,
            "`chosen` must be a string or a list of messages",
        ),
        (
            r#"{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}"#,
            "`chosen` must be one assistant message",
        ),
        (
            r#"{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}]}"#,
            "must share every message before their last",
        ),
        (
            r#"{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "q"}, {"role": "user", "content": "b"}]}"#,
            "the last message of `rejected` must have role `assistant`",
        ),
        (
            r#"{"chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}"#,
            "no message before the assistant's answer",
        ),
    ] {
        let (_dir, path) = tmp("bad_preference.jsonl");
        std::fs::write(&path, format!("{ok}\n\n{row}\n")).unwrap();
        let (at, message) = file_error(load_jsonl(&path).unwrap_err());
        assert!(at.ends_with("bad_preference.jsonl:3"), "{row}: {at}");
        assert!(message.contains(needle), "{row}: {message}");
    }
}
