//! Compiles AtomRL's CUDA kernels (`../atomrl-core/cuda/*.cu`) as host C++ with `sim/sim.h`
//! force-included (the CUDA keywords and intrinsics the kernels use) and `sim/` first on the
//! include path (stand-ins for `cuda_bf16.h` and `cuda_fp16.h`), together with the thread model
//! of `sim/runtime.cpp`. Needs a C++20 compiler (for `std::barrier`), not a CUDA toolkit.
//!
//! `ATOMRL_SIM_SANITIZE=thread` builds them with ThreadSanitizer (g++ or clang's
//! `-fsanitize=thread`, linked to its runtime): every access of a kernel to memory another
//! thread of its block touches without a barrier between is then reported as a data race, on
//! every run, not only when the host's scheduling makes the values come out wrong.

use std::path::PathBuf;

const KERNELS: [&str; 5] = ["optim", "model", "logprob", "decode", "attention"];

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let sim = here.join("sim");
    let cuda = here.join("../atomrl-core/cuda");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=sim");
    println!("cargo:rerun-if-changed={}", cuda.display());
    println!("cargo:rerun-if-env-changed=ATOMRL_SIM_SANITIZE");
    let sanitize = std::env::var("ATOMRL_SIM_SANITIZE")
        .ok()
        .filter(|s| !s.is_empty());
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(&sim)
        .flag("-include")
        .flag(sim.join("sim.h").to_string_lossy().as_ref())
        // The GPU rounds each `_rn` intrinsic on its own; a host FMA would round twice less.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-Wno-unused-parameter")
        .file(sim.join("runtime.cpp"));
    for k in KERNELS {
        // Each `.cu` as its own C++ translation unit.
        build.file(cuda.join(format!("{k}.cu")));
    }
    if let Some(s) = &sanitize {
        build
            .flag(format!("-fsanitize={s}"))
            .flag("-g")
            .opt_level(1);
        // The sanitizer's runtime: its interceptors of thread creation and joining, which the
        // Rust launcher calls, give it the launch's happens-before edges.
        let lib = if s == "thread" { "tsan" } else { s.as_str() };
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    build.flag("-x").flag("c++");
    build.compile("atomrl_cuda_sim");
}
