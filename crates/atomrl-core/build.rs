//! With the `cuda` feature: compiles AtomRL's CUDA kernels (`cuda/*.cu`) to PTX with nvcc, as
//! candle-kernels compiles its own, for `include_str!` in `src/cuda.rs`. Without it: nothing,
//! so the default build needs no CUDA toolkit.
//!
//! nvcc is called directly rather than through `bindgen_cuda`: four files, one command each,
//! and the same `NVCC` / `CUDA_COMPUTE_CAP` variables candle-kernels reads (docs/cuda.md).

use std::path::PathBuf;
use std::process::Command;

const KERNELS: [&str; 5] = ["optim", "model", "logprob", "decode", "attention"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cuda/common.cuh");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=cuda/{k}.cu");
    }
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    // PTX for the target's compute capability (JIT-compiled by the driver on load, so it also
    // runs on newer GPUs); 80 (Ampere, the first with bf16 arithmetic) when unset.
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    for k in KERNELS {
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17"])
            .arg(format!("--gpu-architecture=compute_{cap}"))
            .arg(format!("cuda/{k}.cu"))
            .arg("-o")
            .arg(out_dir.join(format!("{k}.ptx")))
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => panic!("{nvcc} failed on cuda/{k}.cu ({s}); see docs/cuda.md"),
            Err(e) => panic!("cannot run {nvcc} (set NVCC or put nvcc on PATH; docs/cuda.md): {e}"),
        }
    }
}
