"""Record QEfficient's own TLM and DLM on its own calls, as test data (tests/qeff_data/).

Not run by the tests, and not importable without QEfficient: it documents how
``tests/qeff_data/`` was made, so it can be made again. QEfficient's code stays
out of this repository; only its recorded inputs and outputs are kept.

How (a scratch environment, never the project's .venv)::

    python -m venv /work/scratch-i20/venv
    /work/scratch-i20/venv/bin/pip install torch==2.13.0 transformers==5.5.4 onnx==1.18.0 \
        onnxruntime==1.22 numpy==1.26.4 onnxscript==0.2.5 onnx-ir==0.2.1 peft==0.19.1 \
        compressed-tensors==0.15.0 requests pyyaml    # QEfficient's pins (pyproject.toml)
    /work/scratch-i20/venv/bin/pip install --no-deps -e SRC    # quic/efficient-transformers
    # qwen_vl_utils (it imports torchvision) only serves QEfficient's vision models: an
    # import-only stub of its two names on PYTHONPATH stands in for it.
    # the weights: the test fixture llama_gqa (tests/models.py), saved from the project's venv
    .venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from models import build_hf_model; \
        build_hf_model('llama_gqa').save_pretrained('HF')"
    PYTHONPATH=STUBS /work/scratch-i20/venv/bin/python scripts/record_qeff.py HF tests/qeff_data
    PYTHONPATH=STUBS .../python scripts/record_qeff.py --plain HF tests/qeff_data   # the plain interface

(``--plain``, recorded later at efficient-transformers ebf55e8, torch 2.13, in a venv
whose other packages are QEfficient's pins: it adds ``tlm_plain.npz``, ``dlm_plain.npz``
and ``qeff.json``'s ``plain`` object and leaves the continuous-batching files as they are.)

What it records, for the TLM (``qaic_config={"speculative_model_type": "target"}``,
SpDTransform) and the DLM (a plain causal LM), both with continuous batching:
the ONNX interface (names, dtypes, dim names), the specializations QEfficient
builds for full_batch_size 4, PL 8, ctx_len 32 (k = 3 and the list [0, 3]), and
the calls below run with onnxruntime on QEfficient's own ONNX (its invalid-index
constants patched as ``_session`` says), each call's retained state fed to the next:

  1. prefill of prompt A (5 tokens, right-padded to 8) at batch 1 into row 2
  2. prefill of prompt B (8 tokens) at batch 1 into row 0
  3. TLM: a verification of all 4 rows, seq_len k+1 = 4, num_logits_to_keep 4 (row 1
     and row 3 never prefilled, row 0 right-padded to 2 valid tokens), batch_index
     [3, 0, 2, 1] (rows routed out of order); DLM: a decode of all 4 rows, seq_len 1
  4. TLM: a width-1 decode of all 4 rows with num_logits_to_keep 1 (K = 0), and a
     decode shaped as QEfficient's TextGeneration loop feeds it (seq_len k+1, every
     column -1 but the last)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

FBS, PL, CTX, K = 4, 8, 32, 3
#: the plain interface's batch (QEfficient's batch_size: every call runs all rows, no batch_index)
BS = 2


def _export(hf: str, out: Path, tlm: bool, plain: bool = False):
    """QEfficient's export (continuous batching at FBS rows; ``plain``: without, at batch BS) and its
    specializations. QEfficient drops a decode equal to the plain prefill (returns None): left out."""
    from QEfficient import QEFFAutoModelForCausalLM
    cfg = {"speculative_model_type": "target"} if tlm else None
    model = QEFFAutoModelForCausalLM.from_pretrained(hf, continuous_batching=not plain, qaic_config=cfg)
    name = ("tlm" if tlm else "dlm") + ("_plain" if plain else "")
    path = Path(model.export(export_dir=str(out / name)))
    dims = dict(prefill_seq_len=PL, ctx_len=CTX, kv_cache_batch_size=BS if plain else FBS,
                **({"batch_size": BS} if plain else {"full_batch_size": FBS}))
    prefill = model.build_prefill_specialization(**dims)
    if not tlm:
        return path, {"default": [prefill, model.build_decode_specialization(**dims)]}
    cases = (("k3", [K]), ("k_list_0_3", [0, K])) + ((("k7_dropped", [PL - 1]),) if plain else ())
    return path, {name: [prefill] + [s for s in (model.build_decode_specialization(num_speculative_tokens=k, **dims)
                                                 for k in ks) if s is not None]
                  for name, ks in cases}


def _plain_calls(tlm: bool, rng) -> list[dict]:
    """Both rows each call (no batch_index): a prefill of prompt A (5 tokens, right-padded) and B
    (8 tokens); TLM: a verification at k+1 (row 1 right-padded), a K = 0 decode, a left-padded
    decode as QEfficient's TextGeneration loop feeds it; DLM: two seq_len-1 decodes."""
    v = 211
    a, b = rng.integers(3, v, 5), rng.integers(3, v, 8)
    calls = [dict(input_ids=np.stack([np.concatenate([a, np.zeros(3, int)]), b]),
                  position_ids=np.stack([np.concatenate([np.arange(5), np.full(3, -1)]), np.arange(8)]), nlk=1)]
    if tlm:
        calls.append(dict(input_ids=rng.integers(3, v, (BS, K + 1)),
                          position_ids=np.array([[5, 6, 7, 8], [8, 9, -1, -1]]), nlk=K + 1))
        calls.append(dict(input_ids=rng.integers(3, v, (BS, 1)), position_ids=np.array([[9], [10]]), nlk=1))
        loop = np.full((BS, K + 1), -1)
        loop[:, -1] = [10, 11]
        calls.append(dict(input_ids=rng.integers(3, v, (BS, K + 1)), position_ids=loop, nlk=K + 1))
    else:
        calls.append(dict(input_ids=rng.integers(3, v, (BS, 1)), position_ids=np.array([[5], [8]]), nlk=None))
        calls.append(dict(input_ids=rng.integers(3, v, (BS, 1)), position_ids=np.array([[6], [9]]), nlk=None))
    for c in calls:
        c["input_ids"] = np.asarray(c["input_ids"], np.int64)
        c["position_ids"] = np.asarray(c["position_ids"], np.int64)
    return calls


def _session(path: Path):
    """QEfficient's graphs mark invalid indices with scalar INT32_MAX constants, which ONNX
    Runtime refuses. Its own ApiRunner (utils/run_utils.py) turns every one into 0; here only
    the gather's become 0 (those rows are masked and zeroed), while the scatter's (CtxScatterCB, or
    CtxScatter in the plain interface), the slot a
    padded token writes, becomes ctx_len - 1, a slot no recorded call reads. (Turned into 0 it
    would overwrite slot 0 with the padding's keys and values, which are NaN from layer 1 on
    under QEfficient's -inf mask, and every later logit would be NaN.)"""
    import onnx
    import onnxruntime as ort
    m = onnx.load(str(path), load_external_data=False)
    consumers = {}
    for node in m.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    added = {}
    for node in m.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            t = onnx.numpy_helper.to_array(node.attribute[0].t)
            if t.shape == () and t.item() == 2147483647:
                ops = {c.op_type for w in consumers.get(node.output[0], []) for o in w.output
                       for c in consumers.get(o, [])}
                value = CTX - 1 if ops & {"CtxScatterCB", "CtxScatter"} else 0
                added[node.output[0]] = ort.OrtValue.ortvalue_from_numpy(np.array(value, t.dtype))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    for name, value in added.items():
        so.add_initializer(name, value)
    sess = ort.InferenceSession(str(path), so)
    sess.keep_alive = added  # ORT reads these OrtValues at run time: they must outlive the session
    return sess, m


def _interface(m) -> dict:
    import onnx

    def desc(v):
        t = v.type.tensor_type
        return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                "dims": [d.dim_param or d.dim_value for d in t.shape.dim]}
    return {"inputs": [desc(v) for v in m.graph.input], "outputs": [desc(v) for v in m.graph.output]}


def _calls(tlm: bool, rng) -> list[dict]:
    v = 211
    a, b = rng.integers(3, v, 5), rng.integers(3, v, 8)
    pad = np.full(PL, -1)
    calls = [dict(input_ids=np.concatenate([a, np.zeros(3, int)])[None], position_ids=np.concatenate(
                  [np.arange(5), pad[:3]])[None], batch_index=[[2]], nlk=1),
             dict(input_ids=b[None], position_ids=np.arange(8)[None], batch_index=[[0]], nlk=1)]
    if tlm:
        ids = rng.integers(3, v, (4, K + 1))
        pos = np.array([[0, 1, 2, 3], [8, 9, -1, -1], [5, 6, 7, 8], [0, 1, 2, 3]])
        calls.append(dict(input_ids=ids, position_ids=pos, batch_index=[[3], [0], [2], [1]], nlk=K + 1))
        calls.append(dict(input_ids=rng.integers(3, v, (4, 1)), position_ids=np.array([[4], [10], [9], [4]]),
                          batch_index=[[3], [0], [2], [1]], nlk=1))
        loop = np.full((4, K + 1), -1)
        loop[:, -1] = [11, 5, 10, 5]
        calls.append(dict(input_ids=rng.integers(3, v, (4, K + 1)), position_ids=loop,
                          batch_index=[[0], [1], [2], [3]], nlk=K + 1))
    else:
        calls.append(dict(input_ids=rng.integers(3, v, (4, 1)), position_ids=np.array([[8], [0], [5], [0]]),
                          batch_index=[[0], [1], [2], [3]], nlk=None))
    for c in calls:
        c["input_ids"] = np.asarray(c["input_ids"], np.int64)
        c["position_ids"] = np.asarray(c["position_ids"], np.int64)
        c["batch_index"] = np.asarray(c["batch_index"], np.int64)
    return calls


def _run(path: Path, tlm: bool, out: Path, name: str, plain: bool = False) -> dict:
    sess, m = _session(path)
    iface = _interface(m)
    pasts = [i for i in iface["inputs"] if i["name"].startswith("past_")]
    state = {p["name"]: np.zeros([BS if plain else FBS, p["dims"][1], CTX, p["dims"][3]], np.float32)
             for p in pasts}
    arrays = {}
    calls = (_plain_calls if plain else _calls)(tlm, np.random.default_rng(20))
    for n, c in enumerate(calls):
        feed = {"input_ids": c["input_ids"], "position_ids": c["position_ids"], **state}
        if not plain:
            feed["batch_index"] = c["batch_index"]
        if tlm:
            feed["num_logits_to_keep"] = np.zeros((c["nlk"], 1), np.int64)
        names = [o.name for o in sess.get_outputs()]
        res = dict(zip(names, sess.run(names, feed)))
        state = {p: res[p + "_RetainedState"] for p in state}
        for key in ("input_ids", "position_ids") + (() if plain else ("batch_index",)):
            arrays[f"call{n}_{key}"] = c[key]
        if tlm:
            arrays[f"call{n}_num_logits_to_keep"] = np.array(c["nlk"], np.int64)
        arrays[f"call{n}_logits"] = res["logits"]
    np.savez_compressed(out / f"{name}.npz", **arrays)
    return iface


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--plain":
        return main_plain(argv[1:])
    hf, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    record = {"source": "quic/efficient-transformers (QEFFAutoModelForCausalLM, continuous_batching=True)",
              "weights": "tests/models.py llama_gqa, seed 0", "full_batch_size": FBS, "prefill_len": PL,
              "ctx_len": CTX, "k": K}
    for role, tlm in (("tlm", True), ("dlm", False)):
        path, specs = _export(hf, Path(tempfile.mkdtemp()), tlm)
        record[role] = {"interface": _run(path, tlm, out, role), "specializations": specs}
    (out / "qeff.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


def main_plain(argv: list[str]) -> int:
    """The plain interface (continuous_batching=False) into ``qeff.json``'s ``plain`` object."""
    hf, out = argv[0], Path(argv[1])
    path = out / "qeff.json"
    record = json.loads(path.read_text())
    plain = {"source": "quic/efficient-transformers ebf55e8 (QEFFAutoModelForCausalLM, continuous_batching=False)",
             "batch_size": BS}
    for role, tlm in (("tlm", True), ("dlm", False)):
        onnx_path, specs = _export(hf, Path(tempfile.mkdtemp()), tlm, plain=True)
        plain[role] = {"interface": _run(onnx_path, tlm, out, f"{role}_plain", plain=True), "specializations": specs}
    record["plain"] = plain
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
