#!/bin/bash
# `make gpu-bundle`: dpo-train, check-gpu and `make gpu-check`'s bench built here against the torch
# of a GPU machine that has no Rust toolchain (torch 2.11.0, whose PyPI wheel is CUDA 13.0, by
# default), packed into gpu-bundle/ with the wheels TRL's side of the check needs there and
# tools/gpu_run.sh. On the GPU machine, in a copy of this checkout holding gpu-bundle/:
# `bash gpu-bundle/run.sh` (its python3 must hold that torch, transformers and accelerate).
#
# TORCH_GPU     the GPU machine's torch version (default 2.11.0)
# GPU_PYTHON    its python's version, for the wheels (default 3.12)
# GPU_VENV      where that torch is installed here to build against (default target-cu130/torch-venv)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH_GPU=${TORCH_GPU:-2.11.0}
GPU_PYTHON=${GPU_PYTHON:-3.12}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target-cu130}
VENV=${GPU_VENV:-$CARGO_TARGET_DIR/torch-venv}
BUNDLE=$ROOT/gpu-bundle

# The full wheel with its nvidia-* dependencies: NCCL (compiled in wherever they are) builds against their CUDA,
# cuBLAS and NCCL headers and links libtorch_cuda, which needs their libraries. cccl: CUDA 13's
# headers include it; nvcc: its crt/ headers, which cuda_runtime.h includes.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_GPU')" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_GPU" 'cuda-toolkit[nvcc,cccl]'
fi
# torch-sys 0.22 was written for torch 2.9: its C++ compiles against 2.11's headers, so the
# version check is bypassed rather than the bindings changed.
export LIBTORCH_USE_PYTORCH=1 LIBTORCH_BYPASS_VERSION_CHECK=1 LIBTORCH_CXX11_ABI=1 VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
cd "$ROOT"
cargo build --release --workspace --bins
cargo bench --bench gpu --no-run 2> "$CARGO_TARGET_DIR/gpu-bench-build.log" ||
  { cat "$CARGO_TARGET_DIR/gpu-bench-build.log"; exit 1; }
bench=$(sed -n 's/.*Executable .*(\(.*\))$/\1/p' "$CARGO_TARGET_DIR/gpu-bench-build.log" | tail -1)
[ -x "$bench" ] || { echo "gpu-bundle: cargo did not name the gpu bench's executable" >&2; exit 1; }

rm -rf "$BUNDLE.tmp" && mkdir -p "$BUNDLE.tmp/wheels"
for pair in "$CARGO_TARGET_DIR/release/dpo-train:dpo-train" "$CARGO_TARGET_DIR/release/check-gpu:check-gpu" "$bench:gpu-bench"; do
  # Debug info is 90% of the size; the symbols stay, so a libtorch panic names its operation.
  strip --strip-debug -o "$BUNDLE.tmp/${pair#*:}" "${pair%%:*}"
  xz -T0 -6 "$BUNDLE.tmp/${pair#*:}"
done
# TRL's side: the versions `make ref-venv` installs; the GPU machine's python has the rest.
# liger-kernel (pure Python over triton, which the machine's torch brings) for the `targets`
# section's TRL rows with `use_liger_kernel=True`.
refs=$(sed -n 's/^REF_PKGS := //p' Makefile | tr ' ' '\n' | grep -E '^(trl|datasets)==')
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$BUNDLE.tmp/wheels" $refs dill==0.4.1 multiprocess==0.70.19 \
  liger-kernel==0.8.5
cp tools/gpu_run.sh "$BUNDLE.tmp/run.sh"
echo "$ROOT" > "$BUNDLE.tmp/built-in"
echo "torch $TORCH_GPU ($("$VENV/bin/python" -c 'import torch; print(torch.__version__)')), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes')" > "$BUNDLE.tmp/built-with"
rm -rf "$BUNDLE" && mv "$BUNDLE.tmp" "$BUNDLE"
du -sh "$BUNDLE"; cat "$BUNDLE/built-with"
