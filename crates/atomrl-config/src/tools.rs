//! The tools of a run, built from `tools` and checked with `max_tool_turns`.

use atomrl_core::{Error, Result};
use atomrl_sample::MAX_TOOL_TURNS_LIMIT;
use atomrl_tools::{ToolError, ToolSet};

use super::args::GRPOArgs;

/// The built-in tools named by `args.tools` (empty for single-turn runs).
///
/// # Errors
/// An unknown tool name (the error lists the known ones), or `max_tool_turns` above
/// [`MAX_TOOL_TURNS_LIMIT`].
///
/// ```
/// use atomrl_config::{build_tools, GRPOArgs, Recipe};
/// let mut args = GRPOArgs::preset(Recipe::Grpo);
/// assert!(build_tools(&args)?.is_empty());
/// args.tools = vec!["calculator".into()];
/// assert_eq!(build_tools(&args)?.names(), ["calculator"]);
/// args.tools = vec!["browser".into()];
/// assert!(build_tools(&args).unwrap_err().to_string().contains("`tools`"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn build_tools(args: &GRPOArgs) -> Result<ToolSet> {
    if args.max_tool_turns > MAX_TOOL_TURNS_LIMIT {
        return Err(Error::value(
            "config",
            "max_tool_turns",
            format!("at most {MAX_TOOL_TURNS_LIMIT}"),
            args.max_tool_turns,
        ));
    }
    ToolSet::from_names(&args.tools).map_err(|e| match e {
        ToolError::UnknownTool { name, .. } => {
            Error::unknown_choice("config", "tools", ToolSet::builtin_names(), &name)
        }
        other => Error::value("config", "tools", "names of built-in tools", other),
    })
}
