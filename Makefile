# p2ptrain: the two commands of the README's quick start.
#   make demo   installs what is missing into .venv and runs the local demo swarm
#   make test   installs what is missing (Python packages, and the Debian tools the tests use
#               when run as root) and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# This exact torch release is what the project is tested with.
TORCH_SPEC ?= torch==2.13.0
# Where torch comes from.  pip's default Linux build is a CUDA one of several GB: a machine without
# an NVIDIA GPU (no working nvidia-smi) adds PyTorch's CPU wheel index, whose +cpu build wins for the
# same release.  One retry only: where that index cannot be reached, pip falls back to its own indexes
# within seconds.  `make venv TORCH_INDEX=` installs pip's default build anyway.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
HAS_NVIDIA_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_INDEX ?= $(if $(HAS_NVIDIA_GPU),,$(TORCH_CPU_INDEX))
TORCH_PIP_ARGS := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX) --retries 1)
PYTEST_ARGS ?=

.PHONY: demo test venv system-deps lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: venv
	$(VENV)/bin/p2ptrain demo

system-deps:
	.ci/install-system-deps.sh

# Three phases.  Unit and TUI tests run in two processes, a file per process at a time (the TUI
# snapshots serve a fixed port), the longest files first so that none starts last
# (tests/support/durations.py; `--store-durations` refreshes the seconds recorded).  The integration
# tests and the fault scenarios then run three at a time, their nodes training within a share of the
# machine (tests/integration/conftest.py, tests/chaos/conftest.py) and forked from a process that
# imported torch and hivemind once (p2ptrain/local/forkserver.py); that phase keeps both cores busy,
# so neither more processes nor another order shortens it; it keeps xdist's order (the files with
# most tests first): longest first put the churn scenario beside the CPU-hungriest files, and its
# replicas drifted past their bound (docs/operations.md, "Continuous integration").  Last, one at a
# time with the machine to themselves, the tests marked `alone` (a CPU share they measure, a share of
# full rounds).  PYTEST_ARGS runs just those arguments instead.  pytest's exit code 5 (no tests
# collected) is a failure here, not a pass.
test: venv system-deps
	@run() { $(PY) -m pytest "$$@"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; [ $$rc -eq 0 ]; }; \
	if [ -n "$(PYTEST_ARGS)" ]; then run $(PYTEST_ARGS); \
	else run -n 2 --dist loadfile --no-loadscope-reorder --longest-first tests/unit tests/tui \
	  && run -n 3 --dist loadfile -m "not soak and not alone" tests/integration tests/chaos \
	  && run -m "not soak and alone" tests/integration tests/chaos; fi

lint: venv
	$(VENV)/bin/ruff check p2ptrain daemon tui tests benchmarks
	$(PY) -m tests.support.lint_imports
	$(PY) -m tests.support.typecheck

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
