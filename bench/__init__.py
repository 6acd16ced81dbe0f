"""The benchmarks, run as ``python -m bench.run_bench`` (``make bench``).

``run_bench`` is the command line and the report; each section is its own module:
``spec`` (speculative vs target-only on the toy pair), ``serving`` (batches, n-gram drafts,
the K=0 fallback), ``real_model`` (SmolLM2 with its drafts), ``synthetic`` (the large
synthetic export for the rewrite at scale). The demo's modules (demo/) build the pairs.
"""
