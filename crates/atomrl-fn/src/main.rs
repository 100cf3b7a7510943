//! `atomrl-fn`: run any AtomRL atomic function from the command line.
//!
//! ```text
//! atomrl-fn list                                   # one line per function
//! atomrl-fn compute_advantages --help              # formula, shapes, worked example
//! atomrl-fn compute_advantages --input batch.json  # run it; named outputs as JSON on stdout
//! echo '{"rewards":[1,0,1,1],"group_size":2}' | atomrl-fn compute_advantages --input - --mode rloo
//! ```
//!
//! Exit status: 0 on success, 2 for rejected input (one `error:` line on stderr, nothing on
//! stdout), 1 for an internal failure.

use std::process::ExitCode;

fn main() -> ExitCode {
    let fns = atomrl_fn::catalog::all();
    let matches = atomrl_fn::cli::command(&fns).get_matches();
    // ATOMRL_CBLAS: the model functions' f32 matmuls through a CBLAS library (atomrl_core::cblas).
    let cblas = atomrl_core::cblas::use_library_from_env().map(|_| ());
    match cblas.and_then(|()| atomrl_fn::cli::dispatch(&fns, &matches)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, so scripts can show it as is.
            eprintln!("error: {}", e.to_string().replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
