# Set-up is part of every target: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-all bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: plain `torch` would pull a multi-GB CUDA build from the index.
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m schedules.demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

test-all: $(VENV)/.installed
	$(PY) -m pytest -q -m ''

bench: $(VENV)/.installed
	$(PY) benchmarks/solver.py
