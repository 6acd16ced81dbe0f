"""model_checks.check_position_table: a --ctx-len longer than a learned position table (GPT-2's
wpe, 512 rows) is refused on the imported graph, before any pass (the command line's test is
tests/cli/test_bad_inputs.py::test_ctx_len_past_a_learned_position_table)."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import pytest

from specdec_compile.errors import SpecdecError
from specdec_compile.model_checks import check_position_table


def test_the_table_bounds_the_context(fixture_path):
    g = gs.import_onnx(onnx.load(str(fixture_path("gpt2")), load_external_data=False))
    check_position_table(g, 512)
    with pytest.raises(SpecdecError, match=r"--ctx-len 513 is longer than the model's learned position table "
                                           r"\(.*: 512 rows\): use --ctx-len 512 or less"):
        check_position_table(g, 513)
    check_position_table(gs.import_onnx(onnx.load(str(fixture_path("llama_gqa")), load_external_data=False)), 2 ** 18)
