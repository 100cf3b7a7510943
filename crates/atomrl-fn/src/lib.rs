//! Library side of the `atomrl-fn` tool: the catalog of every registered atomic function,
//! the command line built from their specs, help rendering and input/output formats.
//!
//! The binary is a thin wrapper over [`cli::command`] and [`cli::dispatch`].

#![deny(missing_docs)]

pub mod catalog;
pub mod cli;
pub mod help;
pub mod io;
