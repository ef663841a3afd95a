# dpo-train: `make demo` and `make test` install what is missing (idempotently), build, then run.
#
# DPO_TRAIN_VENV  where torch 2.9.0 (and, for the reference scripts, trl/transformers/peft) live;
#                 default .venv in the checkout. CI points it outside the clone to reuse it.

DPO_TRAIN_VENV ?= $(CURDIR)/.venv
VENV := $(DPO_TRAIN_VENV)
PY := $(VENV)/bin/python
TORCH_VERSION := 2.9.0
# The reference implementations: the generator scripts under tests/gen and the export test use them
# (tensorboard: tests/it/tensorboard.rs reads our event files with TensorBoard's own reader).
REF_PKGS := trl==1.16.0 transformers==5.23.0 peft==0.21.2 accelerate==1.15.0 datasets==5.2.0 tensorboard==2.20.0 wandb==0.31.0
CUDA_HDR_PKGS := nvidia-cuda-nvcc-cu12==12.8.* nvidia-cuda-cccl-cu12==12.8.*

# torch-sys finds libtorch through the venv's python (LIBTORCH_USE_PYTORCH); build.rs adds the rpath.
export LIBTORCH_USE_PYTORCH := 1
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)

CARGO ?= cargo

# The integration tests' numerical modules (tests/it/), which test-cpu-paths runs with every crate's unit tests.
CPU_PATH_TESTS := ddp:: train:: padding_free:: trl_parity:: kto_parity:: ref_free_parity:: kto:: model_parity:: lora:: export:: generate:: eval_cli:: hub_data::

.PHONY: demo test test-steps test-cpu-paths config-reference lint bench bench-1m bench-trl gpu-check gpu-bundle build venv ref-venv gloo check-gpu clean-venv example check-example

demo: build
	$(CARGO) run --release --quiet --bin dpo-train

# results/example/: the demo's run kept in the repository (plots, metrics, samples, summary.txt
# naming the machine), whose numbers the README states. Regenerate it after any change to the
# numerics, then copy the table from summary.txt and metrics.csv into the README.
example: build
	rm -rf results/example
	$(CARGO) run --release --quiet --bin dpo-train -- --output-dir results --run-name example
	rm -rf results/example/checkpoints results/example/final results/example/sft results/example/demo results/example/.dpo-train.lock

# A fresh demo against results/example/ and the README (number for number on the machine kind
# that made it; the learning thresholds anywhere). `make test` runs the same test.
check-example: build
	DPO_TRAIN_CHECK_EXAMPLE=1 $(CARGO) test --release --test it -- demo::

# Every test of the workspace (each crate's unit tests, tests/it in one binary, check-gpu's), then
# the benches built; the wall time of the whole (installs and builds included) is printed last.
test:
	@start=$$(date +%s); $(MAKE) --no-print-directory test-steps; status=$$?; \
	echo "make test: $$([ $$status = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start )) s wall"; \
	exit $$status

test-steps: build ref-venv
	$(CARGO) test --release --workspace --no-fail-fast
	$(CARGO) build --release --benches

# The numerical suites (equivalence, parity, ZeRO, bf16) under each of torch's CPU kernel paths
# this CPU offers (ATEN_CPU_CAPABILITY default / avx2 / avx512, with oneDNN and MKL capped to
# match): their bounds (tests/it/common/bounds.rs) must hold on whatever CPU CI draws. A path the
# CPU lacks is reported as not run.
test-cpu-paths: build ref-venv
	CARGO="$(CARGO)" tools/cpu_paths.sh $(CPU_PATH_TESTS)

# docs/configuration.md, rendered from the key table (a dpo-config test fails when it is stale).
config-reference:
	DPO_TRAIN_WRITE_REFERENCE=1 $(CARGO) test --release -p dpo-config --lib reference

# clippy (warnings are errors), rustfmt, and the one-way layers of ARCHITECTURE.md.
lint: build
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	$(CARGO) fmt --all -- --check
	python3 tools/layers.py

bench: build ref-venv
	$(CARGO) bench --bench throughput --bench memory --bench ddp --bench data --bench ops --bench precision

# One million rows (1.1 GB of JSON Lines, benches/big_data.py) read and tokenised by a one-step
# run: wall time and peak memory, the same start again (served by the tokenised-data cache), and
# the same rows as Parquet.
BIG := $(or $(CARGO_TARGET_DIR),target)/big
bench-1m: build ref-venv
	mkdir -p $(BIG)
	test -s $(BIG)/big.parquet || $(PY) benches/big_data.py 1000000 $(BIG)/big.jsonl
	rm -rf $(BIG)/runs
	for pass in jsonl:tokenised jsonl:cached parquet:tokenised; do \
	  /usr/bin/time -f "$$pass: %e s wall, %M KB peak resident" $(CARGO) run --release --quiet --bin dpo-train -- \
	    train --model tests/fixtures/models/llama --train-file $(BIG)/big.$${pass%%:*} --max-length 256 \
	    --max-steps 1 --output-dir $(BIG)/runs 2>&1 | grep -E "pairs kept|peak resident"; \
	done

# dpo-train against TRL's DPOTrainer, side by side on this machine.
bench-trl: build ref-venv
	$(CARGO) bench --bench trl

# The GPU path on cuda:0 (benches/gpu/): check-gpu's probe, NCCL, packed attention and 20 steps against the CPU,
# throughput next to TRL; writes results/gpu/<date>-<gpu>.md. Without CUDA it says so, exit 0.
gpu-check: build ref-venv
	$(CARGO) bench --bench gpu

# The same check for a GPU machine without a Rust toolchain: the binaries built here against that
# machine's torch (TORCH_GPU, default 2.11.0 = CUDA 13.0), packed into gpu-bundle/ with run.sh.
gpu-bundle: gloo
	tools/gpu_bundle.sh

build: venv gloo
	$(CARGO) build --release --workspace

check-gpu:
	$(CARGO) build --release -p check-gpu

# torch into the venv, skipped when the right version is already importable; where that torch
# is a CUDA build (the PyPI wheel is), the CUDA headers NCCL compiles against, so the build has
# NCCL (crates/torch/build.rs compiles it in wherever torch and the headers allow).
venv: $(VENV)/.torch-$(TORCH_VERSION)-nccl
$(VENV)/.torch-$(TORCH_VERSION)-nccl:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null \
		|| $(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -c "import torch, sys; sys.exit(torch.version.cuda is not None)" \
		|| $(PY) -c "import importlib.metadata as m; m.version('nvidia-cuda-nvcc-cu12'); m.version('nvidia-cuda-cccl-cu12')" 2>/dev/null \
		|| $(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(CUDA_HDR_PKGS)
	touch $@

# TRL / transformers / peft, and wandb (the W&B test reads an offline run back with it).
ref-venv: venv
	$(PY) -c "import trl, transformers, peft, tensorboard, wandb" 2>/dev/null \
		|| $(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(REF_PKGS)

# Gloo's headers for the c10d shim (the torch wheel ships the symbols, not the headers).
gloo:
	@test -f /usr/include/gloo/config.h || (apt-get update -q && apt-get install -y -q libgloo-dev)

clean-venv:
	rm -rf $(VENV)
