"""Feeds mutated models to ``specdec-compile``, ``verify`` and ``diff`` (test_mutation_fuzz.py).

    python tests/mutation_driver.py SRC_MODEL WORK_DIR LIMIT_S [SEED]

Imports the package once, then runs each command in a forked child (its stdout and
stderr to files, killed at LIMIT_S seconds), so a hang is seen as one and costs no
more than the limit. Prints one JSON object: {"results": [...], "stray": [...]}, each
result {"mutant", "command", "rc" (None: killed), "seconds", "stderr"}; ``stray``:
files left outside each command's -o and the temporary directory.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import onnx

import mutations


def run_forked(argv: list[str], limit: float, log: Path) -> tuple[int | None, float, str]:
    """(exit status or None when killed at ``limit``, seconds, stderr) of ``cli.main(argv)`` in a child."""
    err = log.with_suffix(".err")
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 99
        try:
            for fd, path in ((1, log.with_suffix(".out")), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            from specdec_compile import cli
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0
        except BaseException:  # noqa: BLE001 - reported as a traceback on stderr
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), time.monotonic() - t0, err.read_text(errors="replace")
        if time.monotonic() - t0 > limit:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, time.monotonic() - t0, err.read_text(errors="replace")
        time.sleep(0.02)


def random_mutants(seed: int, count: int = 10) -> dict:
    """Seeded random edits: a dim, an op, an input name, a dropped node, flipped bytes."""
    rng = random.Random(seed)
    found = {}

    def dims(m):
        t = rng.choice([t for t in m.graph.initializer if t.dims])
        t.dims[rng.randrange(len(t.dims))] = rng.choice([0, -1, 2 ** 33, t.dims[0] + 1])

    def op(m):
        rng.choice(list(m.graph.node)).op_type = rng.choice(["Relu", "NoSuchOp", "Concat", "If", "Softmax"])

    def rename(m):
        names = [o for n in m.graph.node for o in n.output]
        n = rng.choice([n for n in m.graph.node if n.input])
        n.input[rng.randrange(len(n.input))] = rng.choice(names)

    def drop(m):
        del m.graph.node[rng.randrange(len(m.graph.node))]

    for i in range(count):
        kind = [dims, op, rename, drop, None][i % 5]
        if kind is None:
            found[f"rand-bytes-{i}"] = _flip_bytes(rng.randrange(2 ** 32))
        else:
            found[f"rand-{kind.__name__}-{i}"] = mutations._edit(kind)
    return found


def _flip_bytes(seed: int):
    def mutate(m, dst):
        rng = random.Random(seed)
        data = bytearray(m.SerializeToString())
        for _ in range(8):
            data[rng.randrange(len(data))] = rng.randrange(256)
        dst.mkdir(parents=True, exist_ok=True)
        (dst / "model.onnx").write_bytes(bytes(data))
        return dst / "model.onnx"
    return mutate


#: mutants of the JSON beside the model: only the compiler reads those files
CONFIG_ONLY = ("config-", "gen-config-", "eos-")


def commands(src: Path, mutant: Path, work: Path, index: int) -> dict[str, list[str]]:
    """The commands a mutant is fed: a compile (qaic, or a DLM for ort, by turns), then verify
    (the mutant as the rewrite) and diff against the fixture."""
    small = ["--ctx-len", "64", "--prefill-len", "8", "-q"]
    if index % 2 == 0:
        cmds = {"compile-qaic": [str(mutant), "--role", "tlm", "--k", "3", *small, "-o", str(work / "out-qaic")]}
    else:
        cmds = {"compile-ort": [str(mutant), "--role", "dlm", "--target", "ort", *small, "-o", str(work / "out-ort")]}
    if not work.name.startswith(CONFIG_ONLY):
        cmds["verify"] = ["verify", str(src), str(mutant), "-q"]
        cmds["diff"] = ["diff", str(src), str(mutant), "--json"]
    return cmds


#: what importing onnxruntime itself leaves in TMPDIR (its telemetry session id), not the tools' files
ORT_FILES = {".ses"}


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def main(src: Path, work: Path, limit: float, seed: int) -> dict:
    full = onnx.load(str(src))
    table = dict(mutations.MUTATIONS, **random_mutants(seed))
    results, stray = [], []
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    for index, (name, mutate) in enumerate(table.items()):
        d = work / name
        (d / "in").mkdir(parents=True)
        for cfg in ("config.json", "generation_config.json"):
            if (src.parent / cfg).is_file():
                (d / "in" / cfg).write_bytes((src.parent / cfg).read_bytes())
        c = onnx.ModelProto()
        c.CopyFrom(full)
        model = mutate(c, d / "in")
        inputs = {p: p.read_bytes() for p in (d / "in").iterdir() if p.is_file()}
        for cmd, argv in commands(src, model, d, index).items():
            rc, secs, err = run_forked(argv, limit, d / cmd)
            results.append({"mutant": name, "command": cmd, "rc": rc, "seconds": round(secs, 2), "stderr": err})
            if cmd.startswith("compile") and rc not in (0, None):
                if (d / f"out-{cmd.split('-')[1]}").exists():
                    stray.append(f"{name}/{cmd}: a failed compile left its output")
        out = next((d / o for o in ("out-ort", "out-qaic") if (d / o / "manifest.json").is_file()), None)
        if out is not None:  # a mutant that compiled: verify its artifact
            rc, secs, err = run_forked(["verify", str(model), str(out), "-q"], limit, d / "verify-artifact")
            results.append({"mutant": name, "command": "verify-artifact", "rc": rc, "seconds": round(secs, 2),
                            "stderr": err})
        allowed = {"in", "out-qaic", "out-ort"} | {f"{c}.{s}" for c in ["compile-qaic", "compile-ort", "verify",
                                                                        "diff", "verify-artifact"]
                                                   for s in ("out", "err")}
        left = {p.name for p in d.iterdir()} - allowed
        stray += [f"{name}/{x}" for x in sorted(left)]
        changed = [p.name for p, data in inputs.items() if not p.is_file() or p.read_bytes() != data]
        stray += [f"{name}/in/{x} changed" for x in changed]
        new_in = {p.name for p in (d / "in").iterdir()} - {p.name for p in inputs}
        stray += [f"{name}/in/{x} appeared" for x in sorted(new_in)]
    stray += [f"TMPDIR/{x}" for x in sorted(_listing(tmp) - ORT_FILES)]
    return {"results": results, "stray": stray}


if __name__ == "__main__":
    src, work, limit = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    print(json.dumps(main(src, work, limit, seed)))
