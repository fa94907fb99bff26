# Set-up from nothing: a virtual environment with the CPU build of PyTorch installed first
# (an unpinned torch would pull gigabytes of CUDA packages), then attnkit and its extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[viz,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnkit demo --out out/demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

bench: $(STAMP)
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
