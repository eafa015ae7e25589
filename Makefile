# Two entry points: `make chat` (set up, then the assistant on the embedded default model)
# and `make test` (set up, then the whole test suite). Both work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup chat test tools bench-quick head

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# CPU build of torch first: a bare `torch` requirement would pull a multi-GB CUDA build
	$(PY) -m pip install --disable-pip-version-check -q torch==2.13.0
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

chat: setup
	$(VENV)/bin/assistant chat

# tmux drives the real terminal program in one end-to-end test
tools:
	@command -v tmux >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }

test: setup tools
	$(VENV)/bin/pytest -q -rs --durations=15

bench-quick: setup
	$(VENV)/bin/assistant bench --dataset ../shared/data/gsm8k_test.jsonl --limit 4 --max-new-tokens 64

# rebuild the shipped phrase head from its recipe (docs/training.md: hours on a small CPU; resumable)
head: DATA ?= ../shared/data
head: setup
	$(VENV)/bin/assistant train --recipe assistant/runtime/data/heads/SmolLM2-135M-Instruct.recipe.toml --data $(DATA)
