# Two commands do all the set-up on a fresh machine:
#   make serve   -- create .venv, install gpufeed, run the daemon on :9842 (ARGS="..." passes flags)
#   make test    -- create .venv, install gpufeed with test tools, install promtool/prometheus/alertmanager
#                   from Debian when missing, then run ruff, mypy and the whole pytest suite
VENV ?= .venv
PYTHON ?= python3
ARGS ?=

.PHONY: serve test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

serve: $(VENV)/.installed
	$(VENV)/bin/gpufeed serve $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: $(VENV)/.installed lint
	tools/ensure-test-deps.sh
	tools/run-pytest.sh $(VENV)/bin/pytest

bench: $(VENV)/.installed
	$(VENV)/bin/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
