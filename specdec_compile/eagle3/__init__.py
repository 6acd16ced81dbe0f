"""EAGLE-3 heads in vLLM's ``speculators`` format, imported as feature drafts (``specdec-compile import-head``).

    safetensors   a strict safetensors reader (numpy only)
    checkpoint    config.json + model.safetensors, read and checked (no torch, no transformers)
    target        the target: its export or compiled TLM (layers, hidden size, vocabulary, embedding)
    head          the head as a torch module, exported by torch.onnx (torch imported lazily)
    importer      import_head: check, export, compile with our passes, write the artifact

docs/import-head.md; docs/CONTRACT.md section 2 (the own-feature slot).
"""
