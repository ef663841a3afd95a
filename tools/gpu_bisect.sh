#!/bin/bash
# tools/gpu_bisect.sh COMMIT...: dpo-train as it was at each COMMIT, built here against the GPU
# machine's torch as `make gpu-bundle` builds (run that first: its torch venv and target-cu130),
# packed into gpu-bisect/ with a list, oldest first. The GPU check's `bisect` section times the
# checkpointed 0.5B row with each of them beside this checkout's build, on the same machine in one
# call: a regression found after a run is placed between two commits without another session.
# On the device: carry ["gpu-bundle", "gpu-bisect"] and run `bash gpu-bundle/run.sh bisect`.
#
# The builds share target-cu130 (its dependencies built once), each in one worktree checked out at
# the commit in turn; the last build left in target-cu130/release is the bisected one, so
# `make gpu-bundle` afterwards relinks this checkout's. A binary is about 5.3 MiB packed: the
# device's carry takes 64 MiB, the bundle about 13 of them, so seven commits at most.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: tools/gpu_bisect.sh COMMIT..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=$ROOT/target-cu130
VENV=$CARGO_TARGET_DIR/torch-venv
[ -x "$VENV/bin/python" ] || { echo "gpu_bisect: no $VENV: run make gpu-bundle first" >&2; exit 1; }
export LIBTORCH_USE_PYTORCH=1 LIBTORCH_BYPASS_VERSION_CHECK=1 LIBTORCH_CXX11_ABI=1 VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
SRC=$CARGO_TARGET_DIR/bisect-src
OUT=$ROOT/gpu-bisect
[ -d "$SRC" ] || git -C "$ROOT" worktree add -q --detach "$SRC" HEAD
# The oldest first, as the section prints them.
mapfile -t commits < <(git -C "$ROOT" rev-list --no-walk=sorted --reverse "$@" 2>/dev/null || printf '%s\n' "$@")
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
for c in "${commits[@]}"; do
  short=$(git -C "$ROOT" rev-parse --short "$c")
  git -C "$SRC" checkout -q --detach "$c"
  echo "gpu_bisect: building $short ($(git -C "$ROOT" log -1 --format=%s "$c" | cut -c1-80))"
  (cd "$SRC" && cargo build --release --quiet --bin dpo-train)
  # Symbols too: a bisected build is only timed, never debugged from its panic.
  strip --strip-all -o "$OUT.tmp/$short" "$CARGO_TARGET_DIR/release/dpo-train"
  xz -T0 -9 "$OUT.tmp/$short"
  echo "$short $(git -C "$ROOT" log -1 --format=%s "$c" | cut -c1-100)" >> "$OUT.tmp/list"
done
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
git -C "$ROOT" worktree remove --force "$SRC"
du -sh "$OUT"; cat "$OUT/list"
