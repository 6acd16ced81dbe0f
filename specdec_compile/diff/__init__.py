"""A graph-aware diff of two ONNX models (the library of ``specdec-compile diff``).

A report has five sections, each empty when nothing changed:

* ``interface``: graph inputs and outputs added, removed, renamed, or changed
  in dtype or shape (dim names included);
* ``metadata``: IR version, opsets, producer, metadata properties, local functions;
* ``op_counts``: op types whose count changed, before and after;
* ``nodes``: nodes added, removed, rewired (an input now comes from elsewhere)
  and changed (attributes), grouped by transformer layer. Nodes are matched by
  name first, then by topology (a structural hash of what feeds them and what
  they feed), so a renamed copy of the same structure reports nothing;
* ``initializers``: added, removed, renamed (same content) or changed, by
  name, dtype, shape and sha256 of the content. External data is streamed
  from its file in chunks (offset/length), never loaded whole; two tensors
  that point at the same bytes of the same file (hard links included) are
  equal without being read.

Library API:

    diff_models(a, b, *, a_dir=None, b_dir=None, a_label="a", b_label="b") -> dict
    diff_files(path_a, path_b) -> dict
    diff_snapshots(snapshots, *, base_dir=None) -> dict  # [("original", m0), ("pass", m1), ...]
    render_text(report) -> str                           # stable plain text (golden tests)
    render_json(report) -> str                           # stable key order
    print_report(report, file=None, color=None)          # rich colours on a terminal

Modules: ``hashing`` (tensor content hashes), ``index`` (the graph index),
``matching`` (nodes and interface names A -> B), ``subgraphs`` (If/Loop/Scan bodies: the outer
tensors they read, a digest of their structure), ``sections`` (the report
sections), ``compare`` (the diffs), ``render`` (text, JSON, colours). The
command line is ``specdec_compile.cli.diff`` (the library never imports it). Running the compile
pipeline to explain its passes is ``specdec_compile.explain``.
"""
from __future__ import annotations

from .compare import diff_files, diff_models, diff_snapshots, resolve_model_path
from .hashing import CHUNK_SIZE, TensorHasher
from .index import dtype_name, layer_of_name, node_layer
from .render import print_report, render_json, render_text, report_lines
from .sections import SECTIONS

__all__ = ["CHUNK_SIZE", "SECTIONS", "TensorHasher", "diff_files", "diff_models", "diff_snapshots",
           "dtype_name", "layer_of_name", "node_layer", "print_report", "render_json",
           "render_text", "report_lines", "resolve_model_path"]
