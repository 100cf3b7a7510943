#!/usr/bin/env bash
# On the CPU build machine: build what xtask/gpu-run.sh runs on a GPU machine (which has no Rust
# and no network) and pack it into ./gpu (git-ignored): xtask, grpo_gsm8k and grpo_tools built
# with --features cuda, stripped and xz-compressed, libcudart beside them, and the PyTorch
# reference script. Then, with the project's device tool, carry `gpu` and run
# `OUT=$OUT bash xtask/gpu-run.sh` from the repository root in one call.
#
#   bash xtask/gpu-pack.sh                 # needs the CUDA build env: docs/cuda.md ("Building")
#
# CUDA_SETUP names a script to source first (default: ../shared/cuda/setup.sh when present).
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP=${CUDA_SETUP:-../shared/cuda/setup.sh}
# shellcheck disable=SC1090
[ -f "$SETUP" ] && source "$SETUP"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release --locked -p xtask --features cuda
cargo build --release --locked -p atomrl-examples --features cuda --example grpo_gsm8k --example grpo_tools
rm -rf gpu && mkdir -p gpu
for b in xtask examples/grpo_gsm8k examples/grpo_tools; do
  strip -o "gpu/$(basename $b)" "$CARGO_TARGET_DIR/release/$b"
  xz -T0 -6 "gpu/$(basename $b)"
done
[ -n "${ATOMRL_CUDART:-}" ] && cp "$ATOMRL_CUDART" gpu/
cp xtask/fixtures/bench_torch_gpu.py gpu/
echo "$PWD" > gpu/BUILD_ROOT
git rev-parse --short HEAD > gpu/COMMIT 2>/dev/null || true
du -sh gpu
