"""The passes on unusual graphs: a subgraph (If) reading a tensor a pass rewrites, a past input
read by more than its cache Concat, passes run twice from Python, node names the detection
cannot tell apart. Each is refused in one line, never rewritten into a graph that computes
something other than the export."""
from __future__ import annotations

import copy

import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

from specdec_compile import passes, pipeline
from specdec_compile.detect import detect
from specdec_compile.errors import SpecdecError
from specdec_compile.options import Options

OPTS = dict(k=3, ctx_len=64, prefill_len=8)


def _export(fixture_path) -> onnx.ModelProto:
    return onnx.load(str(fixture_path("llama_gqa")))


def _shifted_logits(m: onnx.ModelProto, tensor: str, in_if: bool) -> onnx.ModelProto:
    """logits + 0.001 * sum(tensor): in both branches of an If on a constant (``in_if``) or in the
    graph itself. The export's logits then depend on ``tensor``'s values."""
    m = copy.deepcopy(m)
    g = m.graph
    for n in g.node:
        n.output[:] = ["logits_inner" if x == "logits" else x for x in n.output]

    def nodes(tag):
        return [helper.make_node("Cast", [tensor], [f"{tag}_f"], to=TensorProto.FLOAT),
                helper.make_node("ReduceSum", [f"{tag}_f"], [f"{tag}_s"], keepdims=0),
                helper.make_node("Constant", [], [f"{tag}_k"],
                                 value=helper.make_tensor(f"{tag}_kv", TensorProto.FLOAT, [], [0.001])),
                helper.make_node("Mul", [f"{tag}_s", f"{tag}_k"], [f"{tag}_d"]),
                helper.make_node("Add", ["logits_inner", f"{tag}_d"], [f"{tag}_out"])]
    if not in_if:
        g.node.extend(nodes("top") + [helper.make_node("Identity", ["top_out"], ["logits"])])
        return m

    def branch(tag):
        return helper.make_graph(nodes(tag), tag, [], [helper.make_tensor_value_info(f"{tag}_out", TensorProto.FLOAT,
                                                                                     None)])
    g.node.append(helper.make_node("Constant", [], ["if_cond"],
                                   value=helper.make_tensor("c", TensorProto.BOOL, [], [True])))
    g.node.append(helper.make_node("If", ["if_cond"], ["logits"], name="user_if",
                                   then_branch=branch("then"), else_branch=branch("else")))
    return m


def _derived_in_if(m: onnx.ModelProto) -> onnx.ModelProto:
    """The If's branches read ``Cast(attention_mask)``, a tensor of the graph around them."""
    m = copy.deepcopy(m)
    m.graph.node.append(helper.make_node("Cast", ["attention_mask"], ["am_int32"], to=TensorProto.INT32,
                                         name="user_cast"))
    return _shifted_logits(m, "am_int32", in_if=True)


@pytest.mark.parametrize("target", ["ort", "qaic"])
@pytest.mark.parametrize("make", [lambda m: _shifted_logits(m, "attention_mask", in_if=True), _derived_in_if],
                         ids=["read-in-branch", "derived-read-in-branch"])
def test_attention_mask_read_inside_an_if_is_refused(fixture_path, make, target):
    """Was: the If's read got the mask's stand-in (ones, ctx_len long) and the compile passed, its
    logits 0.056 off the export's (verify: not ok). As a read outside an If it is refused."""
    model = make(_export(fixture_path))
    with pytest.raises(SpecdecError, match=r"'attention_mask' is still used outside the attention mask "
                                           r"\(by .*\); cannot derive the mask from position_ids alone"):
        pipeline.rewrite(model, Options(role="tlm", target=target, **OPTS))


@pytest.mark.parametrize("in_if", [False, True], ids=["graph", "if-branch"])
def test_a_past_read_besides_its_cache_concat_is_refused(fixture_path, in_if):
    """Was: compiled, and the reader saw the whole ctx_len cache where the export reads the past
    tokens (logits 1.5e-3 off the export's, verify: not ok). In the graph itself detection now
    refuses the sum over the past's length first; inside the If's branches, which it does not
    read, the retained_kv pass refuses the read."""
    model = _shifted_logits(_export(fixture_path), "past_key_values.0.key", in_if=in_if)
    if in_if:
        msg = (r"past input 'past_key_values.0.key' is read by Cast node '[^']*' in an If/Loop/Scan body, not "
               r"only by its cache Concat")
    else:
        msg = r"ReduceSum node '[^']*' reduces 'top_f' \(shape \[1, 2, 7, 16\] .*its past or key length"
    with pytest.raises(SpecdecError, match=msg):
        pipeline.rewrite(model, Options(role="tlm", target="ort", **OPTS))


def _run_until(prep, name):
    g = prep.graph
    for p in prep.passes:
        g = p.run(g, prep.ctx)
        if p.name == name:
            return g
    raise AssertionError(f"{name} is not among the passes")


@pytest.mark.parametrize("name, opts", [
    ("logits_to_keep", Options(role="tlm", target="ort", interface="qeff", **OPTS)),
    ("batch_index", Options(role="tlm", target="ort", interface="qeff", **OPTS)),
    ("batch_index", Options(role="dlm", target="qaic", interface="qeff", continuous_batching=True, batch_size=2,
                            ctx_len=64, prefill_len=8)),
    ("expose_hidden_states", Options(role="tlm", target="ort", hidden_states=(-1,), **OPTS)),
], ids=["logits_to_keep", "batch_index", "batch_index-cb", "expose_hidden_states"])
def test_a_pass_run_again_on_its_own_output_is_refused(fixture_path, name, opts):
    """Was: logits_to_keep a second graph input num_logits_to_keep and onnx-graphsurgeon's
    "Cycle detected" traceback; batch_index "no cache writes (run retained_kv first)", which it had;
    expose_hidden_states a second output, the first renamed hidden_states__export."""
    prep = pipeline.prepare(fixture_path("llama_gqa"), opts)
    g = _run_until(prep, name)
    with pytest.raises(SpecdecError, match=rf"pass {name} has already run on this graph.*run each pass once"):
        passes.get(name).run(g, prep.ctx)


def _verified(original: onnx.ModelProto, tmp_path, name: str, target: str = "ort"):
    """The export and its rewrite, saved; the rewrite verified against it (and loadable)."""
    from specdec_compile.verify import verify
    res = pipeline.rewrite(original, Options(role="tlm", target=target, **OPTS))
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_out.onnx"
    onnx.save(original, str(src))
    onnx.save(res.model, str(out))
    rep = verify(str(src), str(out), **OPTS)
    assert rep.ok, rep
    return res.model


def test_a_node_named_like_a_generated_name_is_not_mistaken(fixture_path, tmp_path):
    """An unnamed cache Concat was named ``Concat__<i>`` on import, which another node of the export
    already was: retained_kv rewrote that other node (IndexError, exit 3). Unnamed nodes now get a
    name no node has, and the rewrite is the export's."""
    m = _export(fixture_path)
    outs = {o.name for o in m.graph.output}
    concats = [i for i, n in enumerate(m.graph.node) if n.op_type == "Concat"]
    kv = next(i for i in concats if m.graph.node[i].output[0] in outs)
    other = next(i for i in concats if m.graph.node[i].output[0] not in outs)
    m.graph.node[kv].name = ""
    m.graph.node[other].name = f"Concat__{kv}"
    _verified(m, tmp_path, "named")


def test_names_like_the_passes_own_are_never_taken_twice(fixture_path, tmp_path):
    """A node or tensor of the export named like one a pass makes (``specdec/<scope>/<op>_<n>``): a
    node of that name gave an artifact ONNX Runtime refuses ("two nodes with same node name"), a
    tensor a "Cycle detected" traceback. The passes' names now skip the names the graph has."""
    m = _export(fixture_path)
    made = [n for n in pipeline.rewrite(m, Options(role="tlm", target="ort", **OPTS)).model.graph.node
            if n.name.startswith("specdec/")]
    named = copy.deepcopy(m)
    for i, n in enumerate(made[:5]):      # the first generated names, given to export nodes
        named.graph.node[i].name = n.name
    model = _verified(named, tmp_path, "nodes")
    assert len({n.name for n in model.graph.node}) == len(model.graph.node)
    renamed = copy.deepcopy(m)            # a tensor of the export named like a generated output
    old, new = renamed.graph.node[3].output[0], made[0].output[0]
    for n in renamed.graph.node:
        n.input[:] = [new if x == old else x for x in n.input]
        n.output[:] = [new if x == old else x for x in n.output]
    _verified(renamed, tmp_path, "tensors")


def test_a_graph_detected_without_naming_its_nodes_is_refused(fixture_path):
    """The docs' pass-by-pass example names the unnamed nodes first; a graph that skips it has its
    detection naming '' for every node (was: retained_kv took the first unnamed node as the cache Concat)."""
    m = _export(fixture_path)
    for n in m.graph.node:
        n.name = ""
    g = gs.import_onnx(m)
    ctx = passes.PassContext(detection=detect(g), role="tlm", target="ort", source_opset=g.opset, ctx_len=64)
    with pytest.raises(SpecdecError, match="pass retained_kv: several nodes have no name"):
        passes.retained_kv(g, ctx)
