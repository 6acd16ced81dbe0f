"""``specdec-compile pair``: a target and its draft, from model folders to one verified pair directory.

    inputs.py    what a model argument is (an .onnx file, an optimum export folder, a Hugging Face
                 folder), the files that make it, their hashes (kept, keyed by size and mtime)
    export.py    a Hugging Face folder exported with optimum (the optional ``export`` extra)
    vocab.py     a draft's tokenizer against the target's, before any work
    build.py     the work: export, compile both with one set of shapes, verify both, publish
    manifest.py  ``pair.json``: write it, read it (``specdec-run --pair``), the cache key

docs/CONTRACT.md section "The pair directory" is the format; docs/pair.md the command.
"""
