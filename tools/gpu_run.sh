#!/bin/bash
# gpu-bundle/run.sh [SECTION ...] (copied there by tools/gpu_bundle.sh): `make gpu-check` on a GPU
# machine with torch but no Rust toolchain, from the binaries in this folder; sections as
# benches/gpu/main.rs names them (the default: path probe nccl attention, then parity memory
# dist and plan's estimates side by side, then targets lora8b offload and plan's printed command;
# throughput scale profile shapes checkpointing bisect mfu when named; bisect times the builds
# tools/gpu_bisect.sh packed into gpu-bisect/, carried beside gpu-bundle/). Writes
# results/gpu/<date>-<gpu>.md in the checkout and, where OUT is set, copies it, the profiler
# traces and the whole log there.
set -u
OUT=${OUT:-}
LOG=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$LOG") 2>&1
BUNDLE=$(cd "$(dirname "$0")" && pwd)
cd "$BUNDLE/.."
REPO=$PWD
echo "checkout $REPO, $(date -u), built with $(cat "$BUNDLE/built-with")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) threads," \
  "$(grep -o -w 'avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
PY=$(command -v python3)
PREFIX=$($PY -c 'import sys; print(sys.prefix)')
TORCH=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__))') || exit 1
$PY -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "available", torch.cuda.is_available())'
# The binaries hold the build's paths (the bench's checkout root, dpo-train's path): make them true.
BUILT=$(cat "$BUNDLE/built-in")
if [ "$REPO" != "$BUILT" ] && [ ! -e "$BUILT/gpu-bundle/built-in" ]; then
  mkdir -p "$(dirname "$BUILT")" && rm -rf "$BUILT" && ln -s "$REPO" "$BUILT" || exit 1
fi
T=$BUILT/target-cu130/release
mkdir -p "$T/deps"
for b in dpo-train check-gpu; do xz -dc "$BUNDLE/$b.xz" > "$T/$b" && chmod +x "$T/$b"; done
xz -dc "$BUNDLE/gpu-bench.xz" > "$T/deps/gpu-bench" && chmod +x "$T/deps/gpu-bench"
# TRL and datasets beside the machine's own packages, not over them.
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu-check-site "$BUNDLE"/wheels/*.whl
export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$TORCH/lib DPO_TRAIN_VENV=$PREFIX CARGO_TARGET_DIR=$BUILT/target-cu130
$PY -c 'import trl, datasets, transformers; print("trl", trl.__version__, "datasets", datasets.__version__, "transformers", transformers.__version__)'
"$T/dpo-train" --version || exit 1
cd "$BUILT"
STARTED=$(mktemp) # the results written after this
timeout "${GPU_CHECK_SECONDS:-480}" "$T/deps/gpu-bench" --bench "$@"
echo "gpu-check exit $? after ${SECONDS} s from this script's start (the bundle unpacked and wheels installed included)"
# What this run wrote (the checkout's older results stay behind: $OUT takes 8 files).
if [ -n "$OUT" ]; then find results/gpu -maxdepth 2 -type f -newer "$STARTED" -exec cp {} "$OUT/" \; ; fi
ls -la results/gpu results/gpu/traces
