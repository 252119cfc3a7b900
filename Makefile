# Set-up is part of every target: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: demo test test-all test-arm64 bench lock system-packages

# Everything (planner, device, zoo models, test tools) at the versions in constraints.txt.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[device,zoo,server,postgres,sim,dev]'
	$(PY) -m engine.allocator build || true  # without a compiler, training maps large tensors afresh
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/poet-edge demo

test: $(VENV)/.installed system-packages
	$(PY) -m pytest -q

test-all: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -m ''

# The device install on an emulated Raspberry Pi 4 and Pi 5 (qemu-user; scripts/arm64-env.sh builds it in .arm64/).
test-arm64: $(VENV)/.installed system-packages
	$(PY) -m pytest -q -rP -m arm64 tests/arm64

# Debian's systemd, postgresql, chromium and chromium-driver, which the tests run for real (where missing).
system-packages:
	@scripts/system-packages.sh

bench: $(VENV)/.installed
	$(PY) -m benchmarks.solver

# The pins that hold on x86_64 only (make lock): torch's CUDA build and what it pulls in.
X86_ONLY := s/^((torch|torchvision|triton|nvidia-[^=]+|cuda-[^=]+)==[^ ;]+)$$/\1 ; platform_machine == "x86_64"/

# Pin what is installed now (after the suite passed on it) as the versions every later install gets.
lock: $(VENV)/.installed
	{ echo "# The versions the test suite passed with: \`make\` installs with \`pip install -c constraints.txt\`."; \
	  echo "# Regenerate with \`make lock\` after the suite passes on newer versions."; \
	  echo "# torch and the CUDA stack its x86_64 wheel pulls in are pinned for x86_64 only: on aarch64 that version"; \
	  echo "# is a CUDA build a Pi cannot run, and deploy/install.sh picks the build from what the CPU reports."; \
	  $(VENV)/bin/pip freeze --exclude-editable | grep -v '^poet-edge' | sed -E '$(X86_ONLY)'; } > constraints.txt
