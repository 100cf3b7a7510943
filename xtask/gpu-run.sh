#!/bin/bash
# On a GPU machine, from the repository root, with ./gpu from xtask/gpu-pack.sh: the whole GPU
# measurement in one call. Writes into $OUT:
#   device-check.json    xtask device-check --device cuda (every row, the optimizer kernels' too)
#   atomrl-bench.json    xtask bench, Qwen2.5-0.5B shape, bf16 and f32, default arguments
#   atomrl-profile.json  the same with --profile (phase times, buffers and bytes per phase)
#   atomrl-parts.jsonl   the bf16 training step with --profile at one micro-batch: the shape, 2 layers,
#                        a 4,096-token vocabulary (where a step's time goes, layers or LM head)
#   atomrl-unfused.json  the bench with ATOMRL_CUDA_FUSED=0 (today's tensor-op forms)
#   (all.log)            the bf16 bench with ATOMRL_CUDA_EVENT_TRACKING=1 (cudarc's per-buffer events)
#   torch-bench.json     xtask/fixtures/bench_torch_gpu.py, same shape and arguments (decode at the
#                        batches of the goals, 1 and 64, unless TORCH_BATCHES says otherwise:
#                        HF generate takes 90 s for all four; TORCH_ARGS=--skip-decode: training only)
#   atomrl-eager-decode.json  the bf16 decode bench with ATOMRL_CUDA_GRAPHS=0 (eager cached steps,
#                        no static decoder: what CUDA graphs save)
#   metrics.jsonl        a short bf16 GRPO run of the embedded example
#   all.log              everything printed
#   atomrl-decode-parts.jsonl  bf16 decode at batches 1 and 64, at the shape and with 2 layers
#   atomrl-decode-ops.json     each op of a decoder layer alone, timed as a CUDA graph of 50 calls
#   atomrl-unmerged-decode.json  the bf16 decode bench with ATOMRL_DECODE_MERGE=0 (q/k/v, gate/up
#                        and each residual add apart: what the decode step's merges save)
#   nsys-decode-kernels.txt    per-kernel GPU time of bf16 decoding at batch 64 (where nsys exists)
#   atomrl-long.jsonl    a bf16 training step of 8 x (64 + 2,048) tokens: FlashAttention
#                        (ATOMRL_FLASH_ATTENTION=long: past the score budget, the default in bf16),
#                        then in chunks of queries (=0), then unchunked (the budget at its
#                        largest), then PyTorch's (SDPA) in torch-long.json
#   atomrl-flash.json    the bench's bf16 training step with ATOMRL_FLASH_ATTENTION=1 (FlashAttention
#                        at 320 tokens too, against the tensor-op attention of atomrl-bench.json)
#   atomrl-attention.jsonl  one layer's bf16 training attention alone (bench --attention-ops: tensor
#                        ops, chunks of queries, FlashAttention; forward, forward + backward) at the
#                        bench's 8 x 320 tokens, then at 8 x 2,112
# STEPS lists the steps to run (default all): device-check bench eager-decode unmerged-decode
# decode-parts decode-ops nsys profile parts unfused event-tracking torch grpo long flash attention.
# Each step has its own timeout (T1..T17 seconds), so one that hangs does not cost the rest. The
# steps before `long` took ~250 s as measured; `long` (not yet run) should add 1-2 minutes. A call
# of the device tool is limited to 600 s: where that is near, run `long` in a call of its own
# (STEPS=long).
set -u
: "${OUT:?set OUT to the results folder}"
STEPS=${STEPS:-device-check bench eager-decode unmerged-decode decode-parts decode-ops nsys profile parts unfused event-tracking torch grpo long flash attention}
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
mkdir -p "$OUT"
ROOT=$PWD
L=$OUT/all.log
log() { echo "=== $(date +%T) $*" | tee -a "$L"; }
log "start, commit $(cat gpu/COMMIT 2>/dev/null)"
cd gpu
for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done
chmod +x xtask grpo_gsm8k grpo_tools 2>/dev/null
nvidia-smi >> "$L" 2>&1
BW=3350; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BW=4800
# The CUDA 13 libraries: the driver's libcuda, cuBLAS/cuRAND from the machine's PyTorch wheels.
LP=$PWD
for l in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcuda.so.1; do
  p=$(find /opt /usr /usr/local -name "$l" 2>/dev/null | head -1)
  echo "lib $l -> $p" >> "$L"
  [ -n "$p" ] && LP="$LP:$(dirname "$p")"
done
export LD_LIBRARY_PATH="$LP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd ./xtask | grep -i "not found" >> "$L" 2>&1
# The examples read their embedded model from the checkout they were built in.
B=$(cat BUILD_ROOT 2>/dev/null || echo "$ROOT")
if [ "$B" != "$ROOT" ]; then
  for e in grpo_gsm8k grpo_tools; do
    mkdir -p "$B/examples/$e" && ln -sfn "$ROOT/examples/$e/model" "$B/examples/$e/model"
  done
fi
cd "$ROOT"   # device-check reads the fixtures from the current folder
X=gpu/xtask
SHAPE="--device cuda --shape qwen2.5-0.5b --bandwidth-gbs $BW"
want device-check && {
log device-check
timeout "${T1:-110}" $X device-check --device cuda --json "$OUT/device-check.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want bench && {
log atomrl-bench
timeout "${T2:-110}" $X bench $SHAPE ${BENCH_ARGS:-} --json "$OUT/atomrl-bench.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want eager-decode && {
log atomrl-eager-decode
ATOMRL_CUDA_GRAPHS=0 timeout "${T9:-60}" $X bench $SHAPE --dtypes bf16 --skip-train --json "$OUT/atomrl-eager-decode.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want unmerged-decode && {
log atomrl-unmerged-decode
ATOMRL_DECODE_MERGE=0 timeout "${T13:-40}" $X bench $SHAPE --dtypes bf16 --skip-train --batches 1,64 --json "$OUT/atomrl-unmerged-decode.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want decode-parts && {
log atomrl-decode-parts
# Decode (graphs on) at the shape and with 2 layers: the difference is 22 layers' share of a
# step, the rest the fixed part (embedding, LM head, the draw, host work).
: > "$OUT/atomrl-decode-parts.jsonl"
for part in "" "--layers 2"; do
  timeout "${T10:-40}" $X bench $SHAPE --dtypes bf16 --skip-train --batches 1,64 $part \
    --json /tmp/atomrl-part.json >> "$L" 2>&1; echo "rc=$?" >> "$L"
  [ -f /tmp/atomrl-part.json ] && { tr -d '\n' < /tmp/atomrl-part.json; echo; } >> "$OUT/atomrl-decode-parts.jsonl"
  rm -f /tmp/atomrl-part.json
done
}
want decode-ops && {
log atomrl-decode-ops
# Each op of a decoder layer alone at the decode shapes, as a CUDA graph of 50 calls: its GPU
# time in a graph (atomrl_model::static_decode_op_times), against decode-parts' cost per layer.
timeout "${T12:-60}" $X bench $SHAPE --dtypes bf16 --skip-train --batches 1,64 --decode-ops \
  --json "$OUT/atomrl-decode-ops.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want nsys && {
log nsys-decode
# Per-kernel GPU time of graph-replayed decode steps (bf16, batch 64, 32 new tokens), where the
# machine has Nsight Systems: nsys-decode-kernels.txt.
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  timeout "${T11:-90}" "$NSYS" profile --cuda-graph-trace=node -f true -o /tmp/atomrl-nsys \
    $X bench $SHAPE --dtypes bf16 --skip-train --batches 64 --new-tokens 32 >> "$L" 2>&1; echo "rc=$?" >> "$L"
  timeout 60 "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/atomrl-nsys.nsys-rep \
    > "$OUT/nsys-decode-kernels.txt" 2>> "$L"; echo "rc=$?" >> "$L"
else
  echo "no nsys on this machine" >> "$L"
fi
}
want profile && {
log atomrl-profile
timeout "${T3:-70}" $X bench $SHAPE --dtypes bf16 --batches 1,64 --profile --json "$OUT/atomrl-profile.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want parts && {
log atomrl-parts
# One micro-batch of 8 x 320 at the shape, with 2 layers, and with a 4,096-token vocabulary:
# the differences split a step between the decoder layers and the LM head + log-softmax.
: > "$OUT/atomrl-parts.jsonl"
for part in "" "--layers 2" "--vocab 4096"; do
  timeout "${T7:-30}" $X bench $SHAPE --dtypes bf16 --skip-decode --train-rows 8 --micro-batch 8 \
    --profile $part --json /tmp/atomrl-part.json >> "$L" 2>&1; echo "rc=$?" >> "$L"
  [ -f /tmp/atomrl-part.json ] && { tr -d '\n' < /tmp/atomrl-part.json; echo; } >> "$OUT/atomrl-parts.jsonl"
  rm -f /tmp/atomrl-part.json
done
}
want unfused && {
log atomrl-unfused
ATOMRL_CUDA_FUSED=0 timeout "${T4:-70}" $X bench $SHAPE --dtypes bf16 --batches 1,64 --json "$OUT/atomrl-unfused.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want event-tracking && {
log atomrl-event-tracking
# cudarc's per-buffer CUDA events back on (atomrl_core::cuda::configure_device turns them off):
# what they cost a decode step and a training step, in all.log only.
ATOMRL_CUDA_EVENT_TRACKING=1 timeout "${T8:-40}" $X bench $SHAPE --dtypes bf16 --batches 1,64 >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want torch && {
log torch-bench
PYTHONUNBUFFERED=1 timeout "${T5:-90}" python3 gpu/bench_torch_gpu.py --device cuda --shape qwen2.5-0.5b --bandwidth-gbs $BW --batches "${TORCH_BATCHES:-1,64}" ${TORCH_ARGS:-} --json "$OUT/torch-bench.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want grpo && {
log grpo
timeout "${T6:-40}" gpu/grpo_gsm8k --device cuda --max-steps 20 --set 'dtype="bf16"' --set eval_size=100 --output-dir /tmp/atomrl-gpu-run >> "$L" 2>&1; echo "rc=$?" >> "$L"
cp /tmp/atomrl-gpu-run/metrics.jsonl "$OUT/metrics.jsonl" 2>/dev/null
}
want long && {
log atomrl-long
# Long sequences: what chunked attention (crates/atomrl-model/src/attention.rs) does to a step's
# time and peak memory, against the unchunked form and PyTorch's SDPA at the same length.
LONG="--dtypes bf16 --skip-decode --prompt-len 64 --completion-len 2048 --train-rows 8 --micro-batch 8"
: > "$OUT/atomrl-long.jsonl"
for form in flash chunked unchunked; do
  budget=""; flash=long
  [ $form = chunked ] && flash=0
  [ $form = unchunked ] && { flash=0; budget="--attention-scores-budget 18446744073709551615"; }
  echo "long: $form" >> "$L"
  ATOMRL_FLASH_ATTENTION=$flash timeout "${T14:-60}" $X bench $SHAPE $LONG $budget --json /tmp/atomrl-part.json >> "$L" 2>&1; echo "rc=$?" >> "$L"
  [ -f /tmp/atomrl-part.json ] && { tr -d '\n' < /tmp/atomrl-part.json; echo; } >> "$OUT/atomrl-long.jsonl"
  rm -f /tmp/atomrl-part.json
done
PYTHONUNBUFFERED=1 timeout "${T15:-60}" python3 gpu/bench_torch_gpu.py --device cuda --shape qwen2.5-0.5b --bandwidth-gbs $BW $LONG --json "$OUT/torch-long.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want flash && {
log atomrl-flash
# FlashAttention for every attention (ATOMRL_FLASH_ATTENTION=1): the training step at the bench's
# 320 tokens, below the score budget, where the default keeps cuBLAS's tensor-op attention.
ATOMRL_FLASH_ATTENTION=1 timeout "${T16:-60}" $X bench $SHAPE --dtypes bf16 --skip-decode --json "$OUT/atomrl-flash.json" >> "$L" 2>&1; echo "rc=$?" >> "$L"
}
want attention && {
log atomrl-attention
# Each attention form alone (no training step), at the bench's length, then at the long step's.
: > "$OUT/atomrl-attention.jsonl"
for len in "" "--prompt-len 64 --completion-len 2048 --train-rows 8 --micro-batch 8"; do
  timeout "${T17:-60}" $X bench $SHAPE $len --dtypes bf16 --skip-decode --skip-train --attention-ops --json /tmp/atomrl-part.json >> "$L" 2>&1; echo "rc=$?" >> "$L"
  [ -f /tmp/atomrl-part.json ] && { tr -d '\n' < /tmp/atomrl-part.json; echo; } >> "$OUT/atomrl-attention.jsonl"
  rm -f /tmp/atomrl-part.json
done
}
log end
