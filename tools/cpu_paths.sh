#!/usr/bin/env bash
# make test-cpu-paths: the numerical test suites under each of torch's CPU kernel paths this CPU
# offers, so that their bounds (tests/it/common/bounds.rs) are seen to hold on every CPU CI may draw.
# A path is torch's own dispatch (ATEN_CPU_CAPABILITY) with oneDNN and MKL capped at the same
# instruction set: below AVX-512 torch then multiplies bf16 in its reference gemm, as on a CPU
# without bf16 units. Arguments: the filters of the integration tests (tests/it/) to run beside every
# crate's unit tests (`ddp::` runs tests/it/ddp.rs).
set -uo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
paths=(default)
has avx2 && paths+=(avx2)
has avx512f && paths+=(avx512)
declare -A env_of=(
  [default]="ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2"
  [avx2]="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
  [avx512]="ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=ALL MKL_ENABLE_INSTRUCTIONS=AVX512"
)
declare -A result
status=0
for path in "${paths[@]}"; do
  echo "== ${path}: ${env_of[$path]}"
  start=$SECONDS
  # Both suites run whatever the first gives, so one run names every failure on this path.
  failed=()
  env ${env_of[$path]} ${CARGO:-cargo} test --release --workspace --lib --no-fail-fast || failed+=("unit tests")
  env ${env_of[$path]} ${CARGO:-cargo} test --release --no-fail-fast --test it -- "$@" || failed+=("tests/it")
  if [[ ${#failed[@]} -eq 0 ]]; then
    result[$path]="passed ($((SECONDS - start)) s)"
  else
    list=$(printf '%s, ' "${failed[@]}")
    result[$path]="FAILED: ${list%, } ($((SECONDS - start)) s)"
    status=1
  fi
done
echo "== CPU paths"
for path in default avx2 avx512; do
  echo "$path: ${result[$path]:-not run: this CPU has no ${path/avx512/avx512f}}"
done
exit $status
