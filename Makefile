# One venv in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test demo bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned CPU build installs from local disk; never let pip pick a CUDA torch
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $@

test: install
	$(PY) -m pytest -q

demo: install
	$(PY) demo/run_demo.py

bench: install
	$(PY) bench/run_bench.py

clean:
	rm -rf build dist
