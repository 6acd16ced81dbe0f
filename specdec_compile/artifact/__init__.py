"""The artifact format: what ``specdec-compile`` writes and every reader loads.

    writer.py        write_artifact: the directory, all or nothing (model, specializations,
                     custom IO, compile script, manifest)
    reader.py        load_artifact: a directory read back and checked against its own claims
    records.py       the manifest's nested records and sizes, checked when it is read
    manifest.py      Manifest, the manifest.json record, and the strict JSON reader
    graph_facts.py   what the rewritten graph itself says (checked against the options at write)
    cache_writes.py  the qaic lowering's cache writes, checked op by op
    qaic_ops.py      the ops each target emits and their device precedent (qaic_precedent.tsv)
    qaic_flags.py    extra qaic-exec flags: which are accepted
    qeff.py          QEfficient's interface variant (contract section 7)

The package never imports the runtime, the pipeline or the CLI (tests/test_structure.py).
``from specdec_compile.artifact import write_artifact, load_artifact`` loads the module named
only when the name is asked for, so a reader does not import the writer's templates.
"""
from importlib import import_module

_NAMES = {"write_artifact": "writer", "WrittenArtifact": "writer", "load_artifact": "reader",
          "Artifact": "reader", "Manifest": "manifest"}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(import_module(f".{_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
