"""The IR: checker, text format round trip, shape rules (property tests)."""

import filecmp
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import npuforge
from npuforge.errors import CheckError, ShapeError
from npuforge.ir.graph import Graph, Node, Value
from npuforge.ops.registry import broadcast_shapes, dim_product, dim_quotient
from onnx_builders import one_node_model


def small_graph() -> Graph:
    g = Graph("small")
    g.add_value(Value("x", "float32", ("N", 3, 8, 8)))
    g.inputs.append("x")
    g.add_const("w", np.ones((4, 3, 3, 3), np.float32))
    g.add_const("b", np.zeros(4, np.float32))
    g.add_value(Value("y", "float32", ("N", 4, 8, 8)))
    g.add_value(Value("z", "float32", ("N", 4, 8, 8)))
    conv = {"dilations": [1, 1], "group": 1, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [1, 1],
            "activation": "", "activation_params": []}
    g.nodes.append(Node("conv", "Conv", ["x", "w", "b"], ["y"], conv))
    g.nodes.append(Node("relu", "Relu", ["y"], ["z"], {}))
    g.outputs.append("z")
    return g


def test_small_graph_is_sound_and_runs():
    g = small_graph()
    g.check()
    out = g.run({"x": np.ones((2, 3, 8, 8), np.float32)})["z"]
    assert out.shape == (2, 4, 8, 8)
    assert out[0, 0, 4, 4] == 27.0 and out[0, 0, 0, 0] == 12.0


def test_checker_reports_dangling_value():
    g = small_graph()
    g.nodes[1].inputs = ["nowhere"]
    with pytest.raises(CheckError, match="'relu'.*'nowhere'.*dangling"):
        g.check()


def test_checker_reports_duplicate_names():
    g = small_graph()
    g.nodes[1].name = "conv"
    g.nodes[1].outputs = ["y"]
    problems = g.problems()
    assert any("duplicate node name 'conv'" in p for p in problems)
    assert any("'y' is produced by both" in p for p in problems)


def test_checker_reports_cycle():
    g = small_graph()
    g.add_value(Value("y2", "float32", ("N", 4, 8, 8)))
    g.nodes[0].inputs[0] = "z"  # conv reads relu's output, relu reads conv's
    assert any("cycle through nodes" in p and "'conv'" in p for p in g.problems())


def test_checker_reports_misorder_without_cycle():
    g = small_graph()
    g.nodes.reverse()
    assert g.problems() == ["nodes are not in topological order"]


def test_checker_reports_shape_disagreement_naming_the_node():
    g = small_graph()
    g.values["y"].shape = ("N", 5, 8, 8)
    with pytest.raises(CheckError, match=r"node 'conv' \(Conv\): output 'y' is recorded as float32\[N,5,8,8\] "
                                         r"but the shape rule gives float32\[N,4,8,8\]"):
        g.check()


def test_checker_reports_bad_attribute_and_unknown_op():
    g = small_graph()
    g.nodes[1].attrs["alpha"] = 0.1
    assert g.problems() == ["node 'relu' (Relu): unknown attribute 'alpha'"]
    g = small_graph()
    g.nodes[1].op = "Frobnicate"
    assert "op 'Frobnicate' is not supported" in g.problems()[0]


def test_checker_reports_dtype_disagreement():
    g = small_graph()
    g.values["z"].dtype = "int8"
    assert "recorded as int8" in g.problems()[0]


def test_text_format_round_trip_is_byte_identical(tmp_path):
    model, _ = one_node_model("Conv", [("x", np.ones((1, 3, 5, 5), np.float32)),
                                       ("w", np.ones((2, 3, 3, 3), np.float32))], {"pads": [1, 0, 1, 2]},
                              consts={"w"})
    g = npuforge.import_onnx(model)
    npuforge.save(g, tmp_path / "a" / "m.nfir")
    g2 = npuforge.load(tmp_path / "a" / "m.nfir")
    npuforge.save(g2, tmp_path / "b" / "m.nfir")
    assert filecmp.cmp(tmp_path / "a" / "m.nfir", tmp_path / "b" / "m.nfir", shallow=False)
    assert filecmp.cmp(tmp_path / "a" / "m.safetensors", tmp_path / "b" / "m.safetensors", shallow=False)
    text = (tmp_path / "a" / "m.nfir").read_text()
    assert "node the_node = Conv(x, w) -> y0: float32[1,2,5,5]" in text
    assert '"pads": [1, 0, 1, 2]' in text


def test_text_format_quotes_odd_names_and_inlines_small_constants(tmp_path):
    g = Graph("odd names")
    g.add_value(Value("in put", "float32", ("batch size", 4)))
    g.inputs.append("in put")
    g.add_const("onnx::Reshape_1", np.array([-1, 2], np.int64))
    g.add_value(Value("out,put", "float32", ("batch size*2", 2)))
    g.nodes.append(Node("r", "Reshape", ["in put", "onnx::Reshape_1"], ["out,put"], {"allowzero": 0}))
    g.outputs.append("out,put")
    npuforge.save(g, tmp_path / "m.nfir")
    text = (tmp_path / "m.nfir").read_text()
    assert 'const "onnx::Reshape_1": int64[2] = [-1, 2]' in text
    g2 = npuforge.load(tmp_path / "m.nfir")
    assert g2.values["in put"].shape == ("batch size", 4)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(g2.run({"in put": x})["out,put"], x.reshape(-1, 2))


def test_text_format_rejects_foreign_weights(tmp_path):
    npuforge.save(small_graph(), tmp_path / "a.nfir")
    g = small_graph()
    g.values["w"].data = g.values["w"].data * 2
    npuforge.save(g, tmp_path / "b.nfir")
    (tmp_path / "a.safetensors").write_bytes((tmp_path / "b.safetensors").read_bytes())
    with pytest.raises(npuforge.NpuforgeError, match="does not belong to this graph"):
        npuforge.load(tmp_path / "a.nfir")


def test_text_format_reports_line_of_a_parse_error(tmp_path):
    npuforge.save(small_graph(), tmp_path / "a.nfir")
    lines = (tmp_path / "a.nfir").read_text().splitlines()
    bad = [ln.replace("-> y:", "-> y") if ln.startswith("node conv") else ln for ln in lines]
    (tmp_path / "a.nfir").write_text("\n".join(bad) + "\n")
    with pytest.raises(npuforge.NpuforgeError, match=r"a\.nfir:\d+: expected ':'"):
        npuforge.load(tmp_path / "a.nfir")


def test_wrong_input_shape_and_dtype_are_clear_errors():
    g = small_graph()
    with pytest.raises(ShapeError, match=r"input 'x' has shape \[2, 3, 7, 8\], expected \[N,3,8,8\]"):
        g.run({"x": np.ones((2, 3, 7, 8), np.float32)})
    with pytest.raises(npuforge.NpuforgeError, match="input 'x' should be float32, got int64"):
        g.run({"x": np.ones((2, 3, 8, 8), np.int64)})
    with pytest.raises(npuforge.NpuforgeError, match="input 'x' is missing"):
        g.run({})


def test_static_shape_subgraph_gives_static_reshape():
    # x.view(x.size(0), -1) as the classic exporter writes it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
             onnx.numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    g = npuforge.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert g.values["y"].shape == ("B", 24)
    assert g.run({"x": np.ones((5, 4, 2, 3), np.float32)})["y"].shape == (5, 24)


# -- property tests of the shape rules ------------------------------------------------

dims = st.integers(1, 4)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(a=shapes, b=shapes)
def test_broadcast_matches_numpy(a, b):
    try:
        want = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError):
            broadcast_shapes(Node("n", "Add", [], []), a, b)
    else:
        assert broadcast_shapes(Node("n", "Add", [], []), a, b) == want


@settings(max_examples=100, deadline=None)
@given(ks=st.lists(st.integers(1, 6), min_size=0, max_size=3), sym=st.sampled_from(["N", "batch"]))
def test_symbolic_products_cancel(ks, sym):
    node = Node("n", "Reshape", [], [])
    total = dim_product([sym, *ks])
    rest = dim_product(ks)
    assert dim_quotient(node, total, rest) == sym
    assert dim_quotient(node, total, sym) == int(np.prod(ks, dtype=np.int64))


@settings(max_examples=150, deadline=None)
@given(size=st.integers(1, 12), k=st.integers(1, 4), s=st.integers(1, 3), d=st.integers(1, 2),
       pb=st.integers(0, 2), pe=st.integers(0, 2), ceil=st.booleans())
def test_pool_output_size_matches_torch(size, k, s, d, pb, pe, ceil):
    import torch
    import torch.nn.functional as F

    from npuforge.ops.pool import pool_output_size

    span = d * (k - 1) + 1
    if size + pb + pe < span or pb != pe or pb > k // 2:
        return  # torch cannot express this case; ORT covers it in test_ops_vs_ort
    out = pool_output_size(size, k, s, d, pb, pe, ceil)
    ref = F.max_pool1d(torch.zeros(1, 1, size), k, s, pb, d, ceil_mode=ceil).shape[-1]
    assert out == ref


def test_channel_count_from_a_dynamic_shape_feeds_slice_and_reshape():
    # x.chunk(2, 1) and a channel shuffle written with x.shape: the exporter computes the
    # Slice ends and Reshape targets from Shape with a dynamic batch; C stays static
    import torch

    class Shuffle(torch.nn.Module):
        def forward(self, x):
            a, b = x.chunk(2, dim=1)
            n, c, h, w = x.shape
            return torch.cat([b, a], 1).view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)

    m = Shuffle()
    g = npuforge.from_torch(m, torch.zeros(1, 4, 3, 3))
    assert g.values[g.outputs[0]].shape == ("N", 4, 3, 3)
    x = np.random.default_rng(0).random((3, 4, 3, 3), dtype=np.float32)
    np.testing.assert_array_equal(g.run({g.inputs[0]: x})[g.outputs[0]], m(torch.from_numpy(x)).numpy())


@pytest.mark.parametrize("entry, match", [
    ('{"dtype": "int8", "axis": null, "scale": 1e300, "zero_point": 0}', "beyond float32's range"),
    ('{"dtype": "uint8", "axis": null, "scale": 0.1, "zero_point": 2147483648}', r"integer in uint8's range \[0, 255\]"),
    ('{"dtype": "int8", "axis": null, "scale": 0.1, "zero_point": 0.5}', "must be an integer"),
    ('{"dtype": "int8", "axis": null, "scale": 0.1, "zero_point": -129}', r"\[-128, 127\]"),
])
def test_a_quant_entry_a_cast_would_change_is_refused_without_a_numpy_warning(tmp_path, entry, match):
    """A scale float32 cannot hold or a zero point its dtype cannot is one error naming the line;
    the casts that would make them inf or an arbitrary code (with numpy's RuntimeWarning on the
    user's terminal) are never reached."""
    npuforge.save(small_graph(), tmp_path / "a.nfir")
    text = (tmp_path / "a.nfir").read_text()
    (tmp_path / "a.nfir").write_text(text + f"quant x {entry}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(npuforge.NpuforgeError, match=rf"a\.nfir:\d+: .*{match}"):
            npuforge.load(tmp_path / "a.nfir")
