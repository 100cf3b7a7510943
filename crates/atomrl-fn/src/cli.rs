//! The command line: one clap subcommand per registered function, built from its spec.

use std::path::PathBuf;

use atomrl_core::AtomicFn;
use clap::{Arg, ArgAction, ArgMatches, Command};
use serde_json::Map;

use crate::io::{flag_value, load_inputs, write_outputs, Source};
use crate::{catalog, help};

/// Dispatches parsed arguments: `list`, or one function.
pub fn dispatch(fns: &[AtomicFn], matches: &ArgMatches) -> atomrl_core::Result<()> {
    match matches.subcommand() {
        Some(("list", _)) => {
            print_list(fns);
            Ok(())
        }
        Some((name, sub)) => match catalog::find(fns, name) {
            Some(f) => run(f, sub),
            None => unreachable_subcommand(name),
        },
        None => Ok(()),
    }
}

fn unreachable_subcommand(name: &str) -> atomrl_core::Result<()> {
    // clap only yields registered subcommands; keep a clear message rather than panicking.
    Err(atomrl_core::Error::value(
        "atomrl-fn",
        "function",
        "a registered function",
        name,
    ))
}

/// The `atomrl-fn` command with a subcommand per function of `fns`.
pub fn command(fns: &[AtomicFn]) -> Command {
    let mut cmd = Command::new("atomrl-fn")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Run one AtomRL atomic function on your own numbers")
        .long_about(
            "Run one AtomRL atomic function on your own numbers.\n\n\
             Every function of the atomic crates (advantages, losses, KL, rewards, log-probs) is a\n\
             subcommand: `--help` shows its formula, the shape of every input and output and a\n\
             worked example; `--input FILE` (.json, .safetensors or - for stdin) runs it.",
        )
        .subcommand_required(true)
        .arg_required_else_help(true)
        .after_help("Run `atomrl-fn list` to see every function, `atomrl-fn NAME --help` for one.")
        .subcommand(Command::new("list").about("List every function: name, crate, summary"));
    for f in fns {
        cmd = cmd.subcommand(function_command(f));
    }
    cmd
}

fn function_command(f: &AtomicFn) -> Command {
    let spec = &f.spec;
    let mut cmd = Command::new(spec.name)
        .about(spec.summary)
        .long_about(help::long_about(spec))
        .after_long_help(help::example(spec))
        .after_help("Use --help for the formula, every input and output, and a worked example.")
        .arg(
            Arg::new("input")
                .long("input")
                .short('i')
                .value_name("FILE")
                .help("Inputs: a .json or .safetensors file, or - for JSON on stdin"),
        )
        .arg(
            Arg::new("output")
                .long("output")
                .short('o')
                .value_name("FILE")
                .help("Write outputs to FILE (.json or .safetensors) instead of stdout"),
        );
    for a in spec.inputs {
        let help = match (a.required, a.default) {
            (true, _) => format!("{} [{}; required]", a.doc, a.shape),
            (false, Some(d)) => format!("{} [{}; default {d}]", a.doc, a.shape),
            (false, None) => format!("{} [{}; optional]", a.doc, a.shape),
        };
        cmd = cmd.arg(
            Arg::new(a.name)
                .long(a.name.replace('_', "-"))
                .value_name("VALUE")
                .allow_hyphen_values(true)
                .action(ArgAction::Set)
                .help(help),
        );
    }
    cmd
}

/// Prints one line per function: name, crate, summary.
pub fn print_list(fns: &[AtomicFn]) {
    let width = fns.iter().map(|f| f.spec.name.len()).max().unwrap_or(0);
    let cwidth = fns
        .iter()
        .map(|f| f.spec.crate_name.len())
        .max()
        .unwrap_or(0);
    for f in fns {
        println!(
            "{:<width$}  {:<cwidth$}  {}",
            f.spec.name, f.spec.crate_name, f.spec.summary
        );
    }
}

/// Runs `f` with the parsed flags of its subcommand.
pub fn run(f: &AtomicFn, m: &ArgMatches) -> atomrl_core::Result<()> {
    let source = match m.get_one::<String>("input").map(String::as_str) {
        Some("-") => Source::Stdin,
        Some(path) => Source::File(PathBuf::from(path)),
        None => Source::None,
    };
    let mut flags = Map::new();
    for a in f.spec.inputs {
        if let Some(raw) = m.get_one::<String>(a.name) {
            flags.insert(a.name.to_string(), flag_value(raw));
        }
    }
    let inputs = load_inputs(&f.spec, &source, flags)?;
    let outputs = (f.run)(&inputs)?;
    let out_path = m.get_one::<String>("output").map(PathBuf::from);
    write_outputs(f.spec.name, &outputs, out_path.as_deref())
}
