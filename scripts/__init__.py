"""Maintenance scripts, run from the repository root with ``python -m scripts.<name>``:
``coverage_matrix`` (docs/coverage.md) and ``real_gemma3`` (a real windowed model, verified)."""
