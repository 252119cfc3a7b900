# Set-up is part of every target: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-all bench lock system-packages

# Everything (planner, device, zoo models, test tools) at the versions in constraints.txt.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[device,zoo,server,postgres,sim,dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/poet-edge demo

test: $(VENV)/.installed system-packages
	$(PY) -m pytest -q

test-all: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -m ''

# Debian's systemd, postgresql, chromium and chromium-driver, which the tests run for real (where missing).
system-packages:
	@scripts/system-packages.sh

bench: $(VENV)/.installed
	$(PY) -m benchmarks.solver

# Pin what is installed now (after the suite passed on it) as the versions every later install gets.
lock: $(VENV)/.installed
	{ echo "# The versions the test suite passed with: \`make\` installs with \`pip install -c constraints.txt\`."; \
	  echo "# Regenerate with \`make lock\` after the suite passes on newer versions."; \
	  $(VENV)/bin/pip freeze --exclude-editable | grep -v '^poet-edge'; } > constraints.txt
