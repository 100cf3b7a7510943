//! Tools for multi-turn rollouts: the [`Tool`] trait, a [`ToolSet`] that runs calls with
//! bounded time and output, an exact [`Calculator`], and parsing of Qwen2.5 / Qwen3 / Hermes
//! `<tool_call>` blocks ([`parse_tool_calls`]).
//!
//! A rollout loop gives the chat template the tool list ([`ToolSet::schemas`]), lets the
//! model write an assistant turn, runs every `<tool_call>` block in it
//! ([`ToolSet::run_calls`]) and appends each [`ToolOutcome::output`] as a tool turn. Every
//! failure (malformed call, unknown tool, bad arguments, tool error, panic, timeout) becomes
//! an outcome whose output starts with `error: `, so the model sees it and the loop goes on.
//!
//! # Example
//!
//! ```
//! use atomrl_tools::ToolSet;
//!
//! let tools = ToolSet::from_names(&["calculator"])?;
//! let turn = "I'll compute it.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"0.1 + 0.2\"}}\n</tool_call>";
//! let outcomes = tools.run_calls(turn);
//! assert_eq!(outcomes[0].output, "0.3");
//!
//! let bad = tools.run_calls("<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1/0\"}}</tool_call>");
//! assert!(bad[0].is_error());
//! assert_eq!(bad[0].output, "error: calculator: division by zero");
//! # Ok::<(), atomrl_tools::ToolError>(())
//! ```
#![deny(missing_docs)]

mod calculator;
mod error;
mod outcome;
mod parse;
mod tool;

pub use calculator::Calculator;
pub use error::ToolError;
pub use num_rational::BigRational;
pub use outcome::ToolOutcome;
pub use parse::{parse_tool_calls, ToolCall, TOOL_CALL_END, TOOL_CALL_START};
pub use tool::{Tool, ToolLimits, ToolSet};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
