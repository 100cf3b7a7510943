//! Chat templates with tools: the real Qwen2.5-Instruct and Qwen3 templates
//! (tests/fixtures/templates/*.jinja) rendered through `ChatTokenizer` against the strings
//! jinja2, configured as transformers configures it, renders for the same conversations
//! (tests/fixtures/templates/expected_with_tools.json, written by
//! xtask/fixtures/chat_templates_with_tools.py).

#![allow(clippy::unwrap_used)] // helpers panic on failure, as the tests do

use atomrl_core::Error;
use atomrl_sample::{ChatMessage, ChatTokenizer};
use serde_json::Value as Json;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

fn tokenizer(template: &str) -> ChatTokenizer {
    let text = std::fs::read_to_string(format!("{ROOT}/templates/{template}")).unwrap();
    ChatTokenizer::from_hf_dir(format!("{ROOT}/reference/models/tiny-qwen2"))
        .unwrap()
        .with_chat_template(text)
        .unwrap()
}

fn expected() -> Json {
    let text =
        std::fs::read_to_string(format!("{ROOT}/templates/expected_with_tools.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The template names (keys of `expected`) and their files.
fn templates(expected: &Json) -> Vec<(String, String)> {
    let map = expected["templates"].as_object().unwrap();
    assert_eq!(map.len(), 2);
    map.iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

fn case<'a>(expected: &'a Json, name: &str) -> &'a Json {
    expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name}"))
}

fn messages(case: &Json) -> Vec<ChatMessage> {
    serde_json::from_value(case["messages"].clone()).unwrap()
}

fn case_tools(case: &Json) -> Vec<Json> {
    case["tools"].as_array().unwrap().clone()
}

#[test]
fn qwen_templates_render_every_case_as_transformers_does() {
    let expected = expected();
    let cases = expected["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5);
    for (name, file) in templates(&expected) {
        let tok = tokenizer(&file);
        for case in cases {
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let got = tok
                .apply_chat_template_with_tools(&messages(case), &case_tools(case), gen)
                .unwrap();
            let want = case["expected"][&name].as_str().unwrap();
            assert_eq!(got, want, "template {name}, case {}", case["name"]);
        }
    }
}

#[test]
fn no_tools_is_apply_chat_template() {
    let expected = expected();
    let case = case(&expected, "e_no_tools");
    for (name, file) in templates(&expected) {
        let tok = tokenizer(&file);
        let plain = tok.apply_chat_template(&messages(case), true).unwrap();
        assert_eq!(plain, case["expected"][&name].as_str().unwrap(), "{name}");
        let with_none = tok
            .apply_chat_template_with_tools(&messages(case), &[], true)
            .unwrap();
        assert_eq!(with_none, plain, "{name}");
    }
}

#[test]
fn tool_turn_text_rebuilds_the_trajectories() {
    let expected = expected();
    let c = case(&expected, "c_full_trajectory");
    let d = case(&expected, "d_two_tool_messages");
    for (name, file) in templates(&expected) {
        let tok = tokenizer(&file);
        // (d): user, assistant with two tool calls, tool 21, tool 5, generation prompt.
        let (msgs, tools) = (messages(d), case_tools(d));
        let prompt = tok
            .apply_chat_template_with_tools(&msgs[..1], &tools, true)
            .unwrap();
        let turn = tok
            .tool_turn_text(&["21".to_owned(), "5".to_owned()], &tools)
            .unwrap();
        assert_eq!(
            turn,
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n21\n</tool_response>\n\
             <tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
            "{name}"
        );
        let rebuilt = format!("{prompt}{}{turn}", msgs[1].content);
        assert_eq!(rebuilt, d["expected"][&name].as_str().unwrap(), "{name}");

        // (c): user, assistant tool call, tool 21, final assistant answer.
        let (msgs, tools) = (messages(c), case_tools(c));
        let prompt = tok
            .apply_chat_template_with_tools(&msgs[..1], &tools, true)
            .unwrap();
        let turn = tok.tool_turn_text(&["21".to_owned()], &tools).unwrap();
        assert_eq!(
            turn,
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n21\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n",
            "{name}"
        );
        let want = c["expected"][&name].as_str().unwrap();
        let head = format!("{prompt}{}{turn}", msgs[1].content);
        let rest = want
            .strip_prefix(head.as_str())
            .unwrap_or_else(|| panic!("{name}: {head:?} is not a prefix of {want:?}"));
        // Qwen3 writes an empty think block before the last assistant turn's content.
        let final_turn = match name.as_str() {
            "qwen3" => "<think>\n\n</think>\n\nThe answer is 21.<|im_end|>\n",
            _ => "The answer is 21.<|im_end|>\n",
        };
        assert_eq!(rest, final_turn, "{name}");
    }
}

#[test]
fn tool_turn_text_with_and_without_tools_agree_for_qwen() {
    let expected = expected();
    let calc = case_tools(case(&expected, "a_tools_user_only"));
    for (name, file) in templates(&expected) {
        let tok = tokenizer(&file);
        let r = ["{\"x\": 1}".to_owned()];
        assert_eq!(
            tok.tool_turn_text(&r, &calc).unwrap(),
            tok.tool_turn_text(&r, &[]).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn tool_turn_text_errors_name_the_argument() {
    let tok = tokenizer("qwen2.5-instruct.jinja");
    let err = tok.tool_turn_text(&[], &[]).unwrap_err();
    assert!(
        matches!(&err, Error::Value { arg, .. } if arg == "responses"),
        "{err:?}"
    );

    // A template that drops assistant content.
    let dir = format!("{ROOT}/reference/models/tiny-qwen2");
    let drops = ChatTokenizer::from_hf_dir(&dir)
        .unwrap()
        .with_chat_template(
            "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}",
        )
        .unwrap();
    let err = drops.tool_turn_text(&["21".to_owned()], &[]).unwrap_err();
    assert!(
        matches!(&err, Error::Value { arg, .. } if arg == "chat_template"),
        "{err:?}"
    );

    // A template whose assistant turn does not start with its generation prompt.
    let odd = ChatTokenizer::from_hf_dir(&dir)
        .unwrap()
        .with_chat_template(
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
             {% if add_generation_prompt %}<gen>{% endif %}",
        )
        .unwrap();
    let err = odd.tool_turn_text(&["21".to_owned()], &[]).unwrap_err();
    assert!(
        matches!(&err, Error::Value { arg, .. } if arg == "chat_template"),
        "{err:?}"
    );
}

#[test]
fn with_chat_template_rejects_a_syntax_error() {
    let dir = format!("{ROOT}/reference/models/tiny-qwen2");
    let err = ChatTokenizer::from_hf_dir(dir)
        .unwrap()
        .with_chat_template("{% for m in messages %}")
        .unwrap_err();
    assert!(
        matches!(&err, Error::Value { arg, .. } if arg == "chat_template"),
        "{err:?}"
    );
}
