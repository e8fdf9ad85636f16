# p2ptrain: the two commands of the README's quick start.
#   make demo   installs what is missing into .venv and runs the local demo swarm
#   make test   installs what is missing (Python packages, and the Debian tools the tests use
#               when run as root) and runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU-only PyTorch: this exact release is what the project is tested with.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test venv system-deps lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

demo: venv
	$(VENV)/bin/p2ptrain demo

system-deps:
	.ci/install-system-deps.sh

# Unit and TUI tests run in two processes, a file per process at a time (the TUI snapshots serve a
# fixed port); the multi-node tests then run one at a time, since what they check depends on timing.
# PYTEST_ARGS runs just those arguments instead.  pytest's exit code 5 (no tests collected) is a
# failure here, not a pass.
test: venv system-deps
	@run() { $(PY) -m pytest "$$@"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; fi; [ $$rc -eq 0 ]; }; \
	if [ -n "$(PYTEST_ARGS)" ]; then run $(PYTEST_ARGS); \
	else run -n 2 --dist loadfile tests/unit tests/tui && run tests/integration tests/chaos; fi

lint: venv
	$(VENV)/bin/ruff check p2ptrain daemon tui tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
