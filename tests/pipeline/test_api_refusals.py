"""Bad inputs to the Python API of the passes and the pipeline: each is one SpecdecError line,
never a traceback from onnx-graphsurgeon, numpy or onnx, never a graph silently wrong; a pass
called alone leaves its input as it was (model-local functions included)."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import pytest

from specdec_compile import passes, pipeline
from specdec_compile.detect import detect
from specdec_compile.errors import SpecdecError
from specdec_compile.graph_utils import name_unnamed_nodes
from specdec_compile.options import Options
from specdec_compile.passes import PassContext

OPTS = dict(k=3, ctx_len=64, prefill_len=8)


def _load(path):
    g = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    name_unnamed_nodes(g)
    return g


def _serialized(g: gs.Graph) -> bytes:
    return gs.export_onnx(g, do_type_check=False).SerializeToString()


@pytest.mark.parametrize("name", passes.names())
@pytest.mark.parametrize("graph", ["model.onnx", None, onnx.ModelProto()], ids=["path", "none", "proto"])
def test_every_pass_refuses_what_is_not_a_graph(name, graph):
    with pytest.raises(SpecdecError, match=rf"pass {name} is called as {name}\(graph, ctx\) with graph an "
                                           r"onnx_graphsurgeon\.Graph"):
        passes.get(name).run(graph, PassContext())


def test_a_context_that_is_not_one_is_a_one_line_error_and_a_type_error(fixture_path):
    g = _load(fixture_path("gpt2"))
    for err in (SpecdecError, TypeError):
        with pytest.raises(err, match=r"retained_kv\(graph, ctx\) with ctx a specdec_compile.passes.PassContext"):
            passes.retained_kv(g, {"role": "tlm"})


@pytest.mark.parametrize("fields, message", [
    (dict(ctx_len=True), "ctx_len must be an integer >= 1"),
    (dict(ctx_len=2 ** 30), "ctx_len must be an integer >= 1 and <= 262144"),
    (dict(interface="foo"), "unknown interface 'foo'"),
    (dict(mask_value=float("nan")), "mask_value must be a negative number"),
    (dict(mask_value=5.0), "mask_value must be a negative number"),
    (dict(mask_value=0), "mask_value must be a negative number"),
    (dict(mask_value="x"), "mask_value must be a negative number"),
    (dict(source_opset=5), "source_opset must be an opset from 13"),
    (dict(source_opset="17"), "source_opset must be an opset from 13"),
    (dict(source_opset=True), "source_opset must be an opset from 13"),
    (dict(exposed_layers=("a",)), "exposed_layers must be a non-empty tuple of layer indices"),
    (dict(exposed_layers=5), "exposed_layers must be a non-empty tuple of layer indices"),
    (dict(exposed_layers=(1.5,)), "exposed_layers must be a non-empty tuple of layer indices"),
    (dict(continuous_batching="yes", interface="qeff"), "continuous_batching must be True or False"),
    (dict(fuse_rotary="no"), "fuse_rotary must be True or False"),
    (dict(continuous_batching=True), "needs interface='qeff'"),
    (dict(interface="qeff", target="openvino"), "interface 'qeff' is for target qaic or ort"),
])
def test_a_context_built_by_hand_is_checked(fields, message):
    with pytest.raises(SpecdecError, match=message):
        PassContext(**fields)


def test_a_list_of_layers_is_kept_as_a_tuple():
    assert PassContext(exposed_layers=[1, -1]).exposed_layers == (1, -1)


def _pipeline_graphs(path, opts: Options):
    """(prepared, [(pass, its input graph)]) for every pass of ``opts``, in order."""
    prep = pipeline.prepare(path, opts)
    g, seen = prep.graph, []
    for p in prep.passes:
        seen.append((p, g))
        g = p.run(g, prep.ctx)
    return prep, seen, g


@pytest.mark.parametrize("opts", [
    Options(role="tlm", target="qaic", **OPTS),
    Options(role="dlm", target="qaic", interface="qeff", continuous_batching=True, batch_size=2, ctx_len=64,
            prefill_len=8),
], ids=["qaic", "qaic-qeff-cb"])
def test_a_pass_called_alone_leaves_its_input_as_it_was(fixture_path, opts):
    """onnx-graphsurgeon's Graph.copy shares the model-local functions (CtxScatter, the CB ops):
    fold_static_shapes and rotary_tables sorted them in the input graph."""
    prep = pipeline.prepare(fixture_path("llama_gqa"), opts)
    g, with_functions = prep.graph, 0
    for p in prep.passes:
        before = _serialized(g)
        out = p.run(g, prep.ctx)
        assert _serialized(g) == before, f"pass {p.name} changed its input graph"
        with_functions += bool(g.functions)
        g = out
    assert with_functions, "the case needs a graph with model-local functions"


@pytest.mark.parametrize("name, role, target", [
    ("retained_kv", "tlm", "ort"), ("role_logits", "dlm", "ort"), ("rotary_tables", "tlm", "qaic")])
def test_a_pass_run_twice_on_its_own_output_is_refused(fixture_path, name, role, target):
    opts = Options(role=role, target=target, **(OPTS if role == "tlm" else dict(ctx_len=64, prefill_len=8)))
    prep = pipeline.prepare(fixture_path("llama_gqa"), opts)
    g = prep.graph
    for p in prep.passes:
        g = p.run(g, prep.ctx)
        if p.name == name:
            break
    with pytest.raises(SpecdecError, match=rf"pass {name} has already run on this graph"):
        passes.get(name).run(g, prep.ctx)


def test_the_detection_of_another_graph_is_named(fixture_path):
    g = _load(fixture_path("llama_gqa"))
    other = detect(_load(fixture_path("gpt2")))
    with pytest.raises(SpecdecError, match=r"pass retained_kv: the graph has no .* which ctx.detection names: "
                                           r"the detection is of another graph"):
        passes.retained_kv(g, PassContext(detection=other))


def test_lower_refuses_a_source_opset_older_than_the_graph(fixture_path):
    g = _load(fixture_path("llama_gqa"))
    assert g.opset > 13
    with pytest.raises(SpecdecError, match=rf"ctx.source_opset 13 is older than the graph's own opset {g.opset}"):
        passes.lower(g, PassContext(target="qaic", source_opset=13))


def test_finish_refuses_what_the_passes_did_not_make(fixture_path):
    prep, seen, done = _pipeline_graphs(fixture_path("llama_gqa"), Options(role="tlm", target="qaic", **OPTS))
    for bad in (None, prep.original):
        with pytest.raises(SpecdecError, match="finish\\(graph\\) takes the onnx-graphsurgeon graph"):
            prep.finish(bad)
    with pytest.raises(SpecdecError, match="the graph is at opset .*pass lower has not run on it"):
        prep.finish(prep.graph)
    g = prep.graph
    for p in prep.passes:   # lower left out: the internal cache writes would reach the model
        g = g if p.name == "lower" else p.run(g, prep.ctx)
    with pytest.raises(SpecdecError, match="internal ops .*pass lower must run after retained_kv"):
        prep.finish(g)
    assert prep.finish(done).passes == [p.name for p in prep.passes]


def test_pipeline_arguments_of_the_wrong_kind(fixture_path):
    path = fixture_path("llama_gqa")
    model = onnx.load(str(path), load_external_data=False)
    ort_opts = Options(role="tlm", target="ort", **OPTS)
    with pytest.raises(SpecdecError, match="fuse_rotary= must be True or False, got 'no'"):
        pipeline.rewrite(path, ort_opts, fuse_rotary="no")   # was: on (a non-empty string is true)
    with pytest.raises(SpecdecError, match="fuse_rotary=True is for target 'ort'"):
        pipeline.rewrite(path, Options(role="tlm", target="qaic", **OPTS), fuse_rotary=True)
    with pytest.raises(SpecdecError, match="source= is the path of the file the model was read from, got int"):
        pipeline.rewrite(model, ort_opts, source=123)
    with pytest.raises(SpecdecError, match="import_and_detect takes an onnx.ModelProto"):
        pipeline.import_and_detect(str(path))
    with pytest.raises(SpecdecError, match="pass synth_positions is called as"):
        pipeline.prepare(path, ort_opts).run("model.onnx")


@pytest.mark.parametrize("fields, message", [
    (dict(hidden_states=(1.5,)), "--hidden-states must be a list of integers"),
    (dict(hidden_states="12"), "--hidden-states must be a list of integers"),
    (dict(hidden_states=(True,)), "--hidden-states must be a list of integers"),
    (dict(hidden_states=5), "--hidden-states must be a list of integers"),
    (dict(k_list=5), "--k-list must be a list of integers"),
    (dict(link_weights="no"), "link_weights must be True or False"),
    (dict(qaic_flags="-O3"), "qaic_flags must be a list of flags"),
])
def test_options_of_the_wrong_type(fields, message):
    with pytest.raises(SpecdecError, match=message):
        Options(role="tlm", k=3, **fields)


def test_a_compiled_model_is_refused_as_already_compiled(fixture_path, tmp_path, capsys):
    """The compiler's input is a stock export: its own output (the Python API, the command line)
    is named as already compiled, not as a cache it cannot find."""
    from specdec_compile import cli
    opts = Options(role="tlm", target="ort", **OPTS)
    res = pipeline.rewrite(fixture_path("llama_gqa"), opts)
    with pytest.raises(SpecdecError, match=r"the model is already compiled \(its metadata specdec.role "
                                           r"is 'tlm'\).*give the export it was compiled from") as e:
        pipeline.rewrite(res.model, opts)   # was: "... are not grown by a Concat along the sequence axis"
    assert type(e.value).__name__ == "AlreadyCompiledError"   # what diff --passes rewords
    out = tmp_path / "art"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--target", "ort", "-o", str(out),
                     "-q"]) == 0
    capsys.readouterr()
    assert cli.main([str(out / "model.onnx"), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.onnx is already compiled" in err and not (tmp_path / "again").exists()
