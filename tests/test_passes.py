"""The graph optimizer, pass by pass, on small hand-built ONNX graphs: the
structure each pass leaves, and numerical equivalence with the unoptimized
graph (``optimize(..., verify=True)`` compares every output after every pass
with the float executor, within 1e-5 of the output's magnitude)."""

import json
import math
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import npuforge
from npuforge.cli import main as cli_main
from npuforge.passes import (
    DEFAULT_PIPELINE, PassFailedError, UnknownPassError, VerificationError, list_passes, optimize, random_feeds,
    register_pass, unregister_pass,
)
from npuforge.passes.fuse_bias import per_channel
from npuforge.passes.rewrite import copy_graph

RNG = np.random.default_rng(0)


def f32(*shape, scale=1.0, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32) * scale
    return np.abs(a) + 0.5 if positive else a


def build(nodes, inputs: dict, outputs: list, inits: dict | None = None, opset: int = 17):
    """nodes: onnx NodeProtos; inputs: {name: shape}; inits: {name: array}."""
    g = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return npuforge.import_onnx(m)


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs)


def run(graph, passes):
    """Optimize with verification after every pass; return the optimized graph."""
    out, report = optimize(graph, passes=passes, verify=True)
    out.check()
    assert all(p.max_rel_diff is not None and p.max_rel_diff <= 1e-5 for p in report.passes)
    return out


def ops(graph):
    return [n.op for n in graph.nodes]


def by_op(graph, op):
    return [n for n in graph.nodes if n.op == op]


def assert_same_outputs(a, b, feeds=None):
    feeds = feeds or random_feeds(a, seed=1)
    ra, rb = a.run(feeds), b.run(feeds)
    for name in a.outputs:
        scale = max(float(np.abs(ra[name]).max()), 1e-30)
        assert np.abs(ra[name] - rb[name]).max() <= 1e-5 * scale, name


# -- constant folding --------------------------------------------------------------


def test_fold_constants_folds_constant_nodes_and_static_shape_subgraphs():
    w = f32(3, 4)
    g = build([
        node("Transpose", ["w"], ["wt"], perm=[1, 0]),  # constant input only
        node("Add", ["wt", "one"], ["wt1"]),
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "i0"], ["n"], axis=0),
        node("Unsqueeze", ["n", "ax0"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["flat"]),
        node("MatMul", ["flat", "wt1"], ["y"]),
    ], {"x": [2, 1, 2, 2]}, ["y"], {"w": w, "one": np.ones((1,), np.float32), "i0": np.array(0, np.int64),
                                    "ax0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    out = run(g, ["fold_constants"])
    assert ops(out) == ["Reshape", "MatMul"]
    target = out.values[out.nodes[0].inputs[1]]
    assert target.is_const and target.data.tolist() == [2, -1]
    np.testing.assert_allclose(out.values[out.nodes[1].inputs[1]].data, w.T + 1)


def test_fold_constants_with_symbolic_batch_gives_a_copy_dim_target():
    g = build([
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "i0"], ["n"], axis=0),
        node("Unsqueeze", ["n", "ax0"], ["n1"]),
        node("Concat", ["n1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ], {"x": ["N", 3, 2, 2]}, ["y"], {"i0": np.array(0, np.int64), "ax0": np.array([0], np.int64),
                                      "minus1": np.array([-1], np.int64)})
    out = run(g, ["fold_constants"])
    assert ops(out) == ["Reshape"]
    assert out.values[out.nodes[0].inputs[1]].data.tolist() == [0, -1]
    assert out.values["y"].shape == ("N", 12)


def test_fold_constants_turns_the_classic_exporter_pad_chain_into_constant_pads():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pad = nn.ZeroPad2d((0, 1, 0, 1))  # TF-"same" padding for stride 2, as EfficientNet-Lite
            self.conv = nn.Conv2d(3, 4, 3, 2)

        def forward(self, x):
            return self.conv(self.pad(x))

    g = npuforge.from_torch(M(), torch.zeros(1, 3, 8, 8))
    assert {"ConstantOfShape", "Concat", "Reshape", "Slice", "Transpose", "Cast"} <= set(ops(g))
    folded = run(g, ["fold_constants"])
    assert ops(folded) == ["Pad", "Conv"]
    assert folded.values[folded.nodes[0].inputs[1]].is_const
    out = run(g, ["fold_constants", "fold_pad"])
    assert ops(out) == ["Conv"]
    assert out.nodes[0].attrs["pads"] == [0, 0, 1, 1]


# -- elimination ---------------------------------------------------------------------


def test_remove_identity_and_dropout_keeps_output_names():
    g = build([
        node("Identity", ["x"], ["a"]),
        node("Relu", ["a"], ["b"]),
        node("Dropout", ["b"], ["c"]),
        node("Identity", ["c"], ["y"]),
    ], {"x": [2, 3]}, ["y"])
    out = run(g, ["remove_identity"])
    assert ops(out) == ["Relu"]
    assert out.nodes[0].inputs == ["x"] and out.nodes[0].outputs == ["y"] and out.outputs == ["y"]


def test_a_cast_to_the_type_it_has_is_removed_and_a_real_one_kept():
    g = build([node("Relu", ["x"], ["a"]), node("Cast", ["a"], ["b"], to=1),  # float32 -> float32 (Wav2Vec2)
               node("Cast", ["b"], ["y"], to=7)], {"x": [2, 3]}, ["y"])  # -> int64
    assert ops(run(g, ["remove_identity"])) == ["Relu", "Cast"]


def test_identity_from_input_to_output_stays():
    g = build([node("Identity", ["x"], ["y"])], {"x": [2, 3]}, ["y"])
    assert ops(run(g, ["remove_identity"])) == ["Identity"]


def test_simplify_layout_transpose_pairs_noop_reshapes_and_reshape_chains():
    g = build([
        node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
        node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),  # inverse: removed
        node("Transpose", ["t2"], ["t3"], perm=[0, 2, 1, 3]),
        node("Transpose", ["t3"], ["t4"], perm=[0, 1, 3, 2]),  # composed with the one before
        node("Reshape", ["t4", "same"], ["r0"]),  # no-op
        node("Reshape", ["r0", "s1"], ["r1"]),
        node("Flatten", ["r1"], ["r2"], axis=1),
        node("Reshape", ["r2", "s2"], ["y"]),  # chain -> one Reshape of t4
    ], {"x": ["N", 2, 3, 4]}, ["y"], {"same": np.array([0, 3, 4, 2], np.int64),
                                      "s1": np.array([0, 6, 4], np.int64), "s2": np.array([0, 4, 6], np.int64)})
    out = run(g, ["simplify_layout"])
    assert ops(out) == ["Transpose", "Reshape"]
    t = out.nodes[0]
    assert t.inputs == ["x"] and t.attrs["perm"] == [0, 2, 3, 1]  # t4[i] = t3[p2[i]] = x[p1[p2[i]]]
    assert out.values[out.nodes[1].inputs[1]].data.tolist() == [0, 4, 6]
    assert out.values["y"].shape == ("N", 4, 6)


def test_reshape_chain_with_copy_dims_gets_an_explicit_target():
    g = build([
        node("Reshape", ["x", "s1"], ["r1"]),
        node("Reshape", ["r1", "s2"], ["y"]),  # 0 copies r1's dim 1 (= 6), which x does not have at 1
    ], {"x": ["N", 2, 3, 4]}, ["y"], {"s1": np.array([0, 6, 4], np.int64), "s2": np.array([0, 0, 2, 2], np.int64)})
    out = run(g, ["simplify_layout"])
    assert ops(out) == ["Reshape"]
    assert out.values[out.nodes[0].inputs[1]].data.tolist() == [0, 6, 2, 2]


def test_cse_merges_duplicate_nodes_and_constants():
    g = build([
        node("Mul", ["x", "c1"], ["a"]),
        node("Mul", ["x", "c2"], ["b"]),  # c2 has c1's bytes: same expression
        node("Relu", ["a"], ["ra"]),
        node("Relu", ["b"], ["rb"]),
        node("LeakyRelu", ["a"], ["la"], alpha=0.1),
        node("LeakyRelu", ["a"], ["lb"], alpha=0.2),  # different attrs: kept
        node("Sub", ["rb", "la"], ["s"]),
        node("Sub", ["ra", "lb"], ["t"]),
        node("Mul", ["s", "t"], ["y"]),
    ], {"x": [2, 3]}, ["y"], {"c1": np.full((3,), 2.0, np.float32), "c2": np.full((3,), 2.0, np.float32)})
    out = run(g, ["cse"])
    assert sorted(ops(out)) == ["LeakyRelu", "LeakyRelu", "Mul", "Mul", "Relu", "Sub", "Sub"]
    assert len(out.constants()) == 1


def test_cse_can_leave_a_node_reading_one_value_twice():
    g = build([node("Relu", ["x"], ["ra"]), node("Relu", ["x"], ["rb"]), node("Add", ["ra", "rb"], ["y"])],
              {"x": [2, 3]}, ["y"])
    out, _ = optimize(g, passes=["cse"])
    assert out.nodes[-1].inputs == ["ra", "ra"]
    assert_same_outputs(g, out)


def test_dead_code_removes_unused_nodes_and_constants():
    g = build([
        node("Relu", ["x"], ["y"]),
        node("Mul", ["x", "w"], ["unused"]),
        node("Sigmoid", ["unused"], ["unused2"]),
    ], {"x": [2, 3]}, ["y"], {"w": f32(3), "lonely": f32(5)})
    out = run(g, ["dead_code"])
    assert ops(out) == ["Relu"]
    assert out.constants() == []


# -- BatchNormalization -------------------------------------------------------------------


def bn_inits(c, prefix="bn"):
    return {f"{prefix}_s": f32(c), f"{prefix}_b": f32(c), f"{prefix}_m": f32(c), f"{prefix}_v": f32(c, positive=True)}


def bn_node(x, y, prefix="bn"):
    return node("BatchNormalization", [x, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"], [y],
                epsilon=1e-3)


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_folds_into_conv(bias):
    inits = {"w": f32(4, 3, 3, 3), **bn_inits(4)}
    if bias:
        inits["b"] = f32(4)
    g = build([node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1]),
               bn_node("c", "y")], {"x": ["N", 3, 6, 6]}, ["y"], inits)
    out = run(g, ["fold_batchnorm"])
    assert ops(out) == ["Conv"] and out.nodes[0].outputs == ["y"] and len(out.nodes[0].inputs) == 3


def test_batchnorm_folds_into_grouped_conv_transpose():
    inits = {"w": f32(4, 3, 2, 2), "b": f32(6), **bn_inits(6)}
    g = build([node("ConvTranspose", ["x", "w", "b"], ["c"], strides=[2, 2], group=2), bn_node("c", "y")],
              {"x": ["N", 4, 3, 3]}, ["y"], inits)
    assert ops(run(g, ["fold_batchnorm"])) == ["ConvTranspose"]


@pytest.mark.parametrize("trans_b,c_shape", [(0, None), (1, (5,)), (0, (1, 5)), (1, ())])
def test_batchnorm_folds_into_gemm(trans_b, c_shape):
    inits = {"w": f32(5, 7) if trans_b else f32(7, 5), **bn_inits(5)}
    ins = ["x", "w"]
    if c_shape is not None:
        inits["c"] = f32(*c_shape)
        ins.append("c")
    g = build([node("Gemm", ins, ["g"], transB=trans_b, alpha=0.7, beta=1.3), bn_node("g", "y")],
              {"x": ["N", 7]}, ["y"], inits)
    out = run(g, ["fold_batchnorm"])
    assert ops(out) == ["Gemm"] and out.nodes[0].attrs["beta"] == 1.0


def test_lone_batchnorm_becomes_per_channel_mul_add():
    g = build([node("Relu", ["x"], ["r"]), bn_node("r", "y")], {"x": ["N", 4, 3, 3]}, ["y"], bn_inits(4))
    out = run(g, ["fold_batchnorm"])
    assert ops(out) == ["Relu", "Mul", "Add"]
    for n in out.nodes[1:]:
        assert out.values[n.inputs[1]].shape == (4, 1, 1)
    assert out.nodes[-1].outputs == ["y"]


def test_batchnorm_not_folded_into_conv_whose_output_is_also_read_elsewhere():
    g = build([node("Conv", ["x", "w"], ["c"]), bn_node("c", "b"), node("Add", ["b", "c"], ["y"])],
              {"x": [1, 3, 4, 4]}, ["y"], {"w": f32(3, 3, 1, 1), **bn_inits(3)})
    out = run(g, ["fold_batchnorm"])
    assert "BatchNormalization" not in ops(out) and ops(out).count("Conv") == 1
    assert out.values[by_op(out, "Conv")[0].inputs[1]].data is g.values["w"].data  # weights untouched


# -- Pad ---------------------------------------------------------------------------------------


def pad_graph(consumer, pad_pads, value=None, mode="constant", pre=None, **attrs):
    """x -> [pre] -> Pad -> consumer."""
    inits = {"pads": np.array(pad_pads, np.int64), "w": f32(4, 3 + pad_pads[1] + pad_pads[5], 3, 3)}
    nodes = []
    src = "x"
    if pre:
        nodes.append(node(pre, ["x"], ["p0"]))
        src = "p0"
    pad_ins = [src, "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_ins.append("v")
    nodes.append(node("Pad", pad_ins, ["p"], mode=mode))
    if consumer == "Conv":
        nodes.append(node("Conv", ["p", "w"], ["y"], **attrs))
    else:
        nodes.append(node(consumer, ["p"], ["y"], **attrs))
    return build(nodes, {"x": ["N", 3, 7, 7]}, ["y"], inits)


def test_pad_folds_into_conv_adding_to_its_pads():
    g = pad_graph("Conv", [0, 0, 1, 2, 0, 0, 0, 1], pads=[1, 0, 1, 0], strides=[2, 2])
    out = run(g, ["fold_pad"])
    assert ops(out) == ["Conv"] and out.nodes[0].attrs["pads"] == [2, 2, 1, 1]


@pytest.mark.parametrize("pads,value,mode", [
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.5, "constant"),   # not zero
    ([0, 1, 1, 1, 0, 0, 1, 1], None, "constant"),  # pads the channel axis
    ([0, 0, -1, 1, 0, 0, 1, 1], None, "constant"),  # a crop
    ([0, 0, 1, 1, 0, 0, 1, 1], None, "reflect"),
])
def test_pad_that_a_conv_cannot_absorb_stays(pads, value, mode):
    g = pad_graph("Conv", pads, value, mode)
    assert ops(run(g, ["fold_pad"])) == ["Pad", "Conv"]


def test_pad_folds_into_average_pool_counting_pads():
    g = pad_graph("AveragePool", [0, 0, 1, 1, 0, 0, 1, 1], kernel_shape=[3, 3], strides=[2, 2])
    out = run(g, ["fold_pad"])
    assert ops(out) == ["AveragePool"]
    assert out.nodes[0].attrs["count_include_pad"] == 1 and out.nodes[0].attrs["pads"] == [1, 1, 1, 1]


def test_pad_stays_before_average_pool_that_excludes_its_own_pads():
    g = pad_graph("AveragePool", [0, 0, 1, 1, 0, 0, 1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert ops(run(g, ["fold_pad"])) == ["Pad", "AveragePool"]


def test_pad_stays_when_ceil_mode_would_change_the_pool_output():
    # padded input 9 wide, k=2, s=2, ceil: 5 windows, the last starting in the padding; with
    # the pads as an attribute ONNX forbids that window: the output would shrink to 4
    g = pad_graph("AveragePool", [0, 0, 0, 0, 0, 0, 2, 2], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
                  count_include_pad=1)
    assert ops(run(g, ["fold_pad"])) == ["Pad", "AveragePool"]


def test_zero_pad_folds_into_max_pool_only_after_relu():
    kw = dict(kernel_shape=[3, 3], strides=[2, 2])
    out = run(pad_graph("MaxPool", [0, 0, 1, 1, 0, 0, 1, 1], pre="Relu", **kw), ["fold_pad"])
    assert ops(out) == ["Relu", "MaxPool"] and out.nodes[1].attrs["pads"] == [1, 1, 1, 1]
    # without a proof that x >= 0 the zero padding may win the max: left alone
    assert ops(run(pad_graph("MaxPool", [0, 0, 1, 1, 0, 0, 1, 1], **kw), ["fold_pad"])) == ["Pad", "MaxPool"]
    # a padding of -inf never wins
    out = run(pad_graph("MaxPool", [0, 0, 1, 1, 0, 0, 1, 1], value=-np.inf, **kw), ["fold_pad"])
    assert ops(out) == ["MaxPool"]


def test_zero_pad_wider_than_the_window_stays_before_max_pool():
    # a window wholly in the zero padding gives 0, where the pool's own padding would give -inf
    g = pad_graph("MaxPool", [0, 0, 2, 2, 0, 0, 2, 2], pre="Relu", kernel_shape=[2, 2], strides=[2, 2])
    assert ops(run(g, ["fold_pad"])) == ["Relu", "Pad", "MaxPool"]


# -- activation fusion -----------------------------------------------------------------------


@pytest.mark.parametrize("act,extra,want", [
    ("Relu", {}, ("Relu", [])),
    ("Clip", {"lo": 0.0, "hi": 6.0}, ("Clip", [0.0, 6.0])),
    ("Clip", {"lo": -1.5, "hi": 2.0}, ("Clip", [-1.5, 2.0])),
    ("Clip", {"lo": 0.0}, ("Relu", [])),
    ("LeakyRelu", {"alpha": 0.2}, ("LeakyRelu", [0.2])),
])
def test_conv_fuses_a_following_activation(act, extra, want):
    inits = {"w": f32(4, 3, 3, 3), "b": f32(4)}
    ins = ["c"]
    attrs = {}
    if act == "Clip":
        for key in ("lo", "hi"):
            if key in extra:
                inits[key] = np.array(extra[key], np.float32)
                ins.append(key)
    elif act == "LeakyRelu":
        attrs["alpha"] = extra["alpha"]
    g = build([node("Conv", ["x", "w", "b"], ["c"]), node(act, ins, ["y"], **attrs)], {"x": ["N", 3, 5, 5]},
              ["y"], inits)
    out = run(g, ["fuse_activation"])
    assert ops(out) == ["Conv"] and out.nodes[0].outputs == ["y"]
    assert out.nodes[0].attrs["activation"] == want[0]
    assert out.nodes[0].attrs["activation_params"] == pytest.approx(want[1])


def test_gemm_fuses_relu():
    g = build([node("Gemm", ["x", "w"], ["g"], transB=1), node("Relu", ["g"], ["y"])], {"x": ["N", 4]}, ["y"],
              {"w": f32(3, 4)})
    out = run(g, ["fuse_activation"])
    assert ops(out) == ["Gemm"] and out.nodes[0].attrs["activation"] == "Relu"


def test_no_fusion_when_the_conv_output_is_read_twice_or_is_a_graph_output():
    inits = {"w": f32(3, 3, 1, 1)}
    g = build([node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]), node("Add", ["r", "c"], ["y"])],
              {"x": [1, 3, 4, 4]}, ["y"], inits)
    assert ops(run(g, ["fuse_activation"])) == ["Conv", "Relu", "Add"]
    g = build([node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["y"])], {"x": [1, 3, 4, 4]}, ["y", "c"], inits)
    assert ops(run(g, ["fuse_activation"])) == ["Conv", "Relu"]


# -- bias ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 1, 1), (1, 4, 1, 1), (1,), ()])
def test_per_channel_add_after_conv_merges_into_the_bias(shape):
    g = build([node("Conv", ["x", "w", "b"], ["c"]), node("Add", ["k", "c"], ["y"])], {"x": ["N", 3, 4, 4]},
              ["y"], {"w": f32(4, 3, 1, 1), "b": f32(4), "k": f32(*shape)})
    out = run(g, ["fuse_bias"])
    assert ops(out) == ["Conv"] and out.nodes[0].outputs == ["y"]


def test_sub_after_conv_merges_as_a_negative_bias():
    g = build([node("Conv", ["x", "w"], ["c"]), node("Sub", ["c", "k"], ["y"])], {"x": ["N", 3, 4, 4]},
              ["y"], {"w": f32(4, 3, 1, 1), "k": f32(4, 1, 1)})
    assert ops(run(g, ["fuse_bias"])) == ["Conv"]


def test_a_channel_sized_vector_broadcasts_on_the_last_axis_and_is_not_a_bias():
    # k has C entries, but ONNX aligns shapes on the right: against [N, 4, 4, 4] it runs along W
    g = build([node("Conv", ["x", "w", "b"], ["c"]), node("Add", ["c", "k"], ["y"])], {"x": ["N", 3, 4, 4]},
              ["y"], {"w": f32(4, 3, 1, 1), "b": f32(4), "k": f32(4)})
    out = run(g, ["fuse_bias"])  # verify=True: merging it would fail the numeric check
    assert ops(out) == ["Conv", "Add"]
    # and a [C, 1] constant runs along H: not per channel either
    g = build([node("Conv", ["x", "w"], ["c"]), node("Add", ["c", "k"], ["y"])], {"x": ["N", 3, 4, 4]},
              ["y"], {"w": f32(4, 3, 1, 1), "k": f32(4, 1)})
    assert ops(run(g, ["fuse_bias"])) == ["Conv", "Add"]


@pytest.mark.parametrize("shape,merged", [((5,), True), ((1, 5), True), ((3, 1), False), ((3, 5), False)])
def test_bias_add_after_gemm(shape, merged):
    g = build([node("Gemm", ["x", "w", "c"], ["g"], beta=0.5), node("Add", ["g", "k"], ["y"])], {"x": [3, 4]},
              ["y"], {"w": f32(4, 5), "c": f32(5), "k": f32(*shape)})
    out = run(g, ["fuse_bias"])
    assert ops(out) == (["Gemm"] if merged else ["Gemm", "Add"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1, 4]), min_size=0, max_size=4), st.booleans())
def test_per_channel_agrees_with_onnx_broadcasting(k_shape, with_batch):
    out_shape = (2, 4, 4, 4) if with_batch else (1, 4, 4, 4)
    k = RNG.standard_normal(k_shape).astype(np.float32)
    vec = per_channel(tuple(k_shape), out_shape, k, 4)
    try:
        grows = np.broadcast_shapes(k.shape, out_shape) != out_shape
    except ValueError:
        grows = True
    if grows:  # k does not broadcast, or would grow the output: never a bias
        assert vec is None
        return
    y = RNG.standard_normal(out_shape)
    if vec is not None:  # when it says "per channel", adding the vector on axis 1 is adding k
        np.testing.assert_array_equal(y + k, y + vec.reshape(1, 4, 1, 1))
    else:  # otherwise k really varies along some other axis
        full = np.broadcast_to(k, out_shape)
        assert not np.all(full == full[:, :, :1, :1])


# -- division by a constant --------------------------------------------------------------------------


def test_div_by_float_constant_becomes_mul_by_its_reciprocal():
    g = build([node("Div", ["x", "d"], ["a"]), node("Div", ["a", "v"], ["b"]), node("Div", ["b", "x"], ["y"])],
              {"x": ["N", 4]}, ["y"], {"d": np.array(8.0, np.float32), "v": f32(4, positive=True)})
    out = run(g, ["div_by_constant"])
    assert ops(out) == ["Mul", "Mul", "Div"]  # x / x stays: its divisor is not a constant
    np.testing.assert_array_equal(out.values[out.nodes[0].inputs[1]].data, np.float32(0.125))
    # integer division truncates, and a zero divisor is the model's own: both stay Div
    xi = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    gi = helper.make_graph([node("Div", ["x", "k"], ["y"])], "t", [xi], [helper.make_empty_tensor_value_info("y")],
                           [numpy_helper.from_array(np.array(2, np.int64), "k")])
    assert ops(run(npuforge.import_onnx(helper.make_model(gi, opset_imports=[helper.make_opsetid("", 17)])),
                   ["div_by_constant"])) == ["Div"]
    g0 = build([node("Div", ["x", "z"], ["y"])], {"x": ["N", 4]}, ["y"], {"z": np.array(0.0, np.float32)})
    assert ops(optimize(g0, passes=["div_by_constant"])[0]) == ["Div"]


# -- activation patterns ------------------------------------------------------------------------------


def test_swish_is_recognised_in_either_order():
    g = build([node("Sigmoid", ["x"], ["s"]), node("Mul", ["s", "x"], ["y"])], {"x": ["N", 8]}, ["y"])
    out = run(g, ["recognize_activations"])
    assert ops(out) == ["Swish"] and out.nodes[0].inputs == ["x"]


def test_swish_with_a_scaled_sigmoid_argument_is_not_swish():
    g = build([node("Mul", ["x", "two"], ["x2"]), node("Sigmoid", ["x2"], ["s"]), node("Mul", ["x", "s"], ["y"])],
              {"x": ["N", 8]}, ["y"], {"two": np.array(2.0, np.float32)})
    assert "Swish" not in ops(run(g, ["recognize_activations"]))


def test_hardswish_from_hardsigmoid_and_from_clip_div():
    g = build([node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5), node("Mul", ["x", "h"], ["y"])],
              {"x": ["N", 8]}, ["y"])
    assert ops(run(g, ["recognize_activations"])) == ["HardSwish"]
    g = build([node("Add", ["x", "three"], ["a"]), node("Clip", ["a", "zero", "six"], ["c"]),
               node("Mul", ["x", "c"], ["m"]), node("Div", ["m", "six"], ["y"])], {"x": ["N", 8]}, ["y"],
              {"three": np.array(3.0, np.float32), "zero": np.array(0.0, np.float32),
               "six": np.array(6.0, np.float32)})
    assert ops(run(g, ["recognize_activations"])) == ["HardSwish"]
    # the default HardSigmoid (alpha 0.2) is not the one of HardSwish
    g = build([node("HardSigmoid", ["x"], ["h"]), node("Mul", ["x", "h"], ["y"])], {"x": ["N", 8]}, ["y"])
    assert "HardSwish" not in ops(run(g, ["recognize_activations"]))


class Normalizing(nn.Module):
    """F.normalize twice (ReduceL2, Clip, Expand, Div) and x / x.norm (ReduceL2, Div)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        h = self.fc(x)
        return (torch.nn.functional.normalize(h, dim=-1) * torch.nn.functional.normalize(h, dim=(1, 2), eps=1e-3)
                + h / h.norm(dim=1, keepdim=True))


def test_l2_normalization_is_recognised_and_exports_to_what_onnx_runtime_runs():
    import onnxruntime as ort

    from npuforge.export import to_onnx

    m = Normalizing().eval()
    out = run(npuforge.from_torch(m, torch.zeros(2, 5, 8)), ["fold_constants", "recognize_normalizations"])
    norms = [n for n in out.nodes if n.op == "L2Normalize"]
    assert not {"ReduceL2", "Clip", "Expand", "Div"} & set(ops(out))
    found = sorted((n.attrs["axes"], np.float32(n.attrs["epsilon"])) for n in norms)
    assert found == [([1], 0.0), ([1, 2], np.float32(1e-3)), ([2], np.float32(1e-12))]
    x = RNG.standard_normal((3, 5, 8)).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.run({out.inputs[0]: x})[out.outputs[0]], ref, rtol=1e-5, atol=1e-6)
    sess = ort.InferenceSession(to_onnx(out).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {out.inputs[0]: x})[0], ref, rtol=1e-5, atol=1e-6)


def test_a_norm_of_another_value_or_a_clip_with_a_maximum_is_not_l2_normalize():
    norm = [node("ReduceL2", ["x", "axes"], ["n"], keepdims=1)]
    k = {"axes": np.array([1], np.int64), "lo": np.array(1e-6, np.float32), "hi": np.array(10.0, np.float32)}
    g = build(norm + [node("Div", ["z", "n"], ["y"])], {"x": ["N", 8], "z": ["N", 8]}, ["y"], k)
    assert "L2Normalize" not in ops(run(g, ["recognize_normalizations"]))
    g = build(norm + [node("Clip", ["n", "lo", "hi"], ["c"]), node("Div", ["x", "c"], ["y"])], {"x": ["N", 8]}, ["y"],
              k)
    assert "L2Normalize" not in ops(run(g, ["recognize_normalizations"]))
    g = build(norm + [node("Clip", ["n", "lo"], ["c"]), node("Div", ["x", "c"], ["y"])], {"x": ["N", 8]}, ["y"], k)
    assert ops(run(g, ["recognize_normalizations"])) == ["L2Normalize"]


class WrittenOutLayerNorm(nn.Module):
    """Layer normalization as older exporters write it: over the last axis with Pow (and gamma,
    beta), over the last two with d * d (no affine), and a mean over a middle axis (not one)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)
        self.gamma = nn.Parameter(torch.linspace(0.5, 2.0, 12))
        self.beta = nn.Parameter(torch.linspace(-1.0, 1.0, 12))

    def forward(self, x):
        h = self.fc(x)
        d = h - h.mean(dim=-1, keepdim=True)
        a = d / torch.sqrt(d.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * self.gamma + self.beta
        e = h - h.mean(dim=(1, 2), keepdim=True)
        b = e / torch.sqrt((e * e).mean(dim=(1, 2), keepdim=True) + 1e-3)
        f = h - h.mean(dim=1, keepdim=True)
        c = f / torch.sqrt((f * f).mean(dim=1, keepdim=True) + 1e-3)
        return a + b + c


def test_written_out_layer_norm_is_recognised_with_its_affine_and_quantizes():
    m = WrittenOutLayerNorm().eval()
    out = run(npuforge.from_torch(m, torch.zeros(2, 5, 8)), ["fold_constants", "recognize_normalizations"])
    norms = sorted((n.attrs["axis"], np.float32(n.attrs["epsilon"]), len(n.inputs)) for n in out.nodes
                   if n.op == "LayerNormalization")
    assert norms == [(1, np.float32(1e-3), 2), (2, np.float32(1e-5), 3)]
    assert ops(out).count("Div") == 1  # the mean over the middle axis stays written out
    x = RNG.standard_normal((3, 5, 8)).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.run({out.inputs[0]: x})[out.outputs[0]], ref, rtol=1e-5, atol=2e-5)
    q = npuforge.quantize(out, [RNG.standard_normal((3, 5, 8)).astype(np.float32) for _ in range(4)],
                          log=lambda msg: None)
    assert [n.op for n in q.nodes if n.op == "LayerNormalization" and n.quant]


def gelu_tanh_nodes(assoc: int):
    k = {"c": np.array(0.044715, np.float32), "s": np.array(np.sqrt(2 / np.pi), np.float32),
         "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [node("Mul", ["x", "x"], ["x2"]), node("Mul", ["x2", "x"], ["x3"]), node("Mul", ["x3", "c"], ["cx3"]),
             node("Add", ["x", "cx3"], ["inner"]), node("Mul", ["s", "inner"], ["u"]), node("Tanh", ["u"], ["t"]),
             node("Add", ["one", "t"], ["p"])]
    if assoc == 0:  # (0.5 * x) * (1 + t)
        nodes += [node("Mul", ["half", "x"], ["hx"]), node("Mul", ["hx", "p"], ["y"])]
    else:  # x * ((1 + t) * 0.5)
        nodes += [node("Mul", ["p", "half"], ["hp"]), node("Mul", ["x", "hp"], ["y"])]
    return nodes, k


@pytest.mark.parametrize("assoc", [0, 1])
def test_gelu_tanh_form_is_recognised(assoc):
    nodes, k = gelu_tanh_nodes(assoc)
    g = build(nodes, {"x": ["N", 16]}, ["y"], k)
    out = run(g, ["recognize_activations"])
    assert ops(out) == ["Gelu"] and out.nodes[0].attrs["approximate"] == "tanh" and out.nodes[0].inputs == ["x"]


class NormThenAffine(nn.Module):
    """GroupNorm with one channel per group (InstanceNormalization, then Mul and Add by [C, 1]) and a
    LayerNorm without its own affine, then * w + b; last a Mul along time, no parameter's axis."""

    def __init__(self):
        super().__init__()
        self.conv, self.group = nn.Conv1d(1, 8, 5, stride=2), nn.GroupNorm(8, 8)
        self.layer = nn.LayerNorm(8, elementwise_affine=False)
        self.w, self.b = nn.Parameter(torch.linspace(-1.5, 2.0, 8)), nn.Parameter(torch.linspace(0.5, -0.5, 8))
        self.ramp = nn.Parameter(torch.linspace(0.1, 1.0, 30), requires_grad=False)

    def forward(self, x):
        y = self.group(self.conv(x))
        return self.layer(y.transpose(1, 2)) * self.w + self.b, nn.functional.instance_norm(y) * self.ramp


def test_mul_and_add_after_a_normalization_become_its_scale_and_bias():
    m = NormThenAffine().eval()
    with torch.no_grad():
        m.group.weight.copy_(torch.linspace(0.5, 2.0, 8))
        m.group.bias.copy_(torch.linspace(-1.0, 1.0, 8))
    graph = npuforge.from_torch(m, torch.zeros(2, 1, 64))
    out = run(graph, None)
    hist = out.op_histogram()
    assert hist.get("Add", 0) == 0 and hist.get("Mul", 0) == 1, hist  # the Mul along time stays
    assert hist["InstanceNormalization"] == 2 and hist["LayerNormalization"] == 1
    x = RNG.standard_normal((3, 1, 64)).astype(np.float32)
    with torch.no_grad():
        ref = [t.numpy() for t in m(torch.from_numpy(x))]
    got = out.run({out.inputs[0]: x})
    for name, r in zip(out.outputs, ref):
        np.testing.assert_allclose(got[name], r, rtol=1e-5, atol=1e-5)


class GeluNew(nn.Module):
    """Hugging Face's ``gelu_new`` (GPT-2, ALBERT), x^3 as ``torch.pow(x, 3.0)``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        x = self.fc(x)
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def test_gelu_tanh_form_with_pow_is_recognised_and_quantizes_to_one_table():
    m = GeluNew().eval()
    graph = npuforge.from_torch(m, torch.zeros(2, 8))
    assert "Pow" in graph.op_histogram()
    out = run(graph, ["recognize_activations"])
    gelu = [n for n in out.nodes if n.op == "Gelu"]
    assert {"Pow", "Tanh"}.isdisjoint(ops(out)) and len(gelu) == 1 and gelu[0].attrs["approximate"] == "tanh"
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.run({out.inputs[0]: x})[out.outputs[0]], ref, rtol=0, atol=1e-5)
    q = npuforge.quantize(graph, [RNG.standard_normal((4, 8)).astype(np.float32)], log=lambda msg: None)
    assert q.op_histogram().get("Gelu") == 1 and "Tanh" not in q.op_histogram()
    # x^4 is no cubic: left alone
    g = build([node("Pow", ["x", "four"], ["x4"]), node("Add", ["x", "x4"], ["inner"]), node("Mul", ["s", "inner"], ["u"]),
               node("Tanh", ["u"], ["t"]), node("Add", ["one", "t"], ["p"]), node("Mul", ["x", "p"], ["xp"]),
               node("Mul", ["xp", "half"], ["y"])], {"x": ["N", 8]}, ["y"],
              {"four": np.array(4.0, np.float32), "s": np.array(np.sqrt(2 / np.pi), np.float32),
               "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})
    assert "Gelu" not in ops(run(g, ["recognize_activations"]))


def test_erf_gelu_as_torch_exports_it_is_recognised():
    """nn.GELU() before opset 20: Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5."""
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    graph = npuforge.from_torch(m, torch.zeros(2, 8))
    assert "Erf" in graph.op_histogram()
    out = run(graph, ["recognize_activations"])
    gelu = [n for n in out.nodes if n.op == "Gelu"]
    assert "Erf" not in ops(out) and len(gelu) == 1 and gelu[0].attrs["approximate"] == "none"
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.run({out.inputs[0]: x})[out.outputs[0]], ref, rtol=0, atol=1e-5)
    # an erf of another scale is not GELU
    g = build([node("Mul", ["x", "k"], ["u"]), node("Erf", ["u"], ["e"]), node("Add", ["e", "one"], ["p"]),
               node("Mul", ["x", "p"], ["xp"]), node("Mul", ["xp", "half"], ["y"])], {"x": ["N", 8]}, ["y"],
              {"k": np.array(0.5, np.float32), "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)})
    assert "Gelu" not in ops(run(g, ["recognize_activations"]))


def test_pattern_feeding_a_conv_then_fuses_nothing_into_it():
    # Conv -> x*sigmoid(x): the Conv output is read twice, so no Relu-style fusion; it becomes Conv -> Swish
    g = build([node("Conv", ["x", "w"], ["c"]), node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])],
              {"x": ["N", 3, 4, 4]}, ["y"], {"w": f32(4, 3, 1, 1)})
    out = run(g, None)
    assert ops(out) == ["Conv", "Swish"] and out.nodes[0].attrs["activation"] == ""


def test_torch_silu_and_hardsigmoid_products_become_single_ops():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

        def forward(self, x):
            x = nn.functional.silu(self.c1(x))  # exported at opset 17 as Sigmoid + Mul
            x = self.c2(x)
            return x * nn.functional.hardsigmoid(x)  # HardSigmoid(alpha=1/6) + Mul

    g = npuforge.from_torch(M(), torch.zeros(1, 3, 8, 8))
    assert ops(g).count("Mul") == 2
    out = run(g, None)
    assert ops(out) == ["Conv", "Swish", "Conv", "HardSwish"]


# -- the manager -------------------------------------------------------------------------------------


def small_model():
    inits = {"w": f32(4, 3, 3, 3), "b": f32(4), **bn_inits(4), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
             "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    return build([node("Identity", ["x"], ["xi"]), node("Pad", ["xi", "pads"], ["p"]),
                  node("Conv", ["p", "w", "b"], ["c"]), bn_node("c", "n"), node("Clip", ["n", "lo", "hi"], ["r"]),
                  node("Dropout", ["r"], ["y"])], {"x": ["N", 3, 8, 8]}, ["y"], inits)


def test_default_pipeline_and_list_passes():
    assert list_passes()[:len(DEFAULT_PIPELINE)] == list(DEFAULT_PIPELINE)
    g = small_model()
    out, report = optimize(g, verify=True)
    assert ops(out) == ["Conv"]
    conv = out.nodes[0]
    assert conv.attrs["pads"] == [1, 1, 1, 1] and conv.attrs["activation"] == "Clip"
    assert conv.attrs["activation_params"] == [0.0, 6.0]
    assert [p.name for p in report.passes] == list(DEFAULT_PIPELINE)
    assert report.before == {"BatchNormalization": 1, "Clip": 1, "Conv": 1, "Dropout": 1, "Identity": 1, "Pad": 1}
    assert report.after == {"Conv": 1}
    assert json.loads(json.dumps(report.to_dict()))["nodes_after"] == 1
    assert "total" in report.format()


def test_optimizing_twice_changes_nothing():
    out, _ = optimize(small_model())
    again, report = optimize(out)
    assert all(p.before == p.after for p in report.passes)
    assert [(n.op, n.inputs, n.outputs, n.attrs) for n in again.nodes] == \
        [(n.op, n.inputs, n.outputs, n.attrs) for n in out.nodes]


def test_optimize_leaves_the_callers_graph_alone():
    from npuforge.ir.textio import dumps

    g = small_model()
    before = dumps(g, "w", "0" * 64)
    arrays = {v.name: v.data.copy() for v in g.constants()}
    optimize(g, verify=True)
    assert dumps(g, "w", "0" * 64) == before
    for name, data in arrays.items():
        np.testing.assert_array_equal(g.values[name].data, data)
    copy = copy_graph(g)
    copy.nodes[0].attrs["x"] = 1
    assert "x" not in g.nodes[0].attrs


def test_verify_on_given_feeds(broken_pass):
    feeds = {"x": np.ones((3, 3, 8, 8), np.float32)}
    out, report = optimize(small_model(), verify=True, verify_batch=feeds)
    assert report.verified and all(p.max_rel_diff <= 1e-5 for p in report.passes)
    with pytest.raises(VerificationError, match="negate_outputs"):
        optimize(small_model(), passes=[broken_pass], verify=True, verify_batch=feeds)


def test_unknown_pass_names_the_close_match_and_the_valid_ones():
    with pytest.raises(UnknownPassError, match=r"unknown pass 'fold_padd' \(did you mean 'fold_pad'.*valid passes: "
                                               r"fold_constants, "):
        optimize(small_model(), passes="fold_constants,fold_padd")


@pytest.fixture
def broken_pass():
    @register_pass("negate_outputs", "test only: breaks the numerics")
    def negate_outputs(graph):
        out = graph.outputs[0]
        prod = next(n for n in graph.nodes if out in n.outputs)
        mid = graph.unique_name(out + "/pre")
        from npuforge.ir.graph import Node, Value

        graph.add_value(Value(mid, graph.values[out].dtype, graph.values[out].shape))
        prod.outputs = [mid if o == out else o for o in prod.outputs]
        graph.nodes.append(Node("negate", "Mul", [mid, graph.unique_name("minus_one")], [out], {}))
        graph.add_const(graph.nodes[-1].inputs[1], np.array(-1.0, np.float32))
        return 1

    @register_pass("crash", "test only: raises")
    def crash(graph):
        raise KeyError("boom")

    yield "negate_outputs"
    unregister_pass("negate_outputs")
    unregister_pass("crash")


def test_a_pass_that_changes_numerics_is_named(broken_pass):
    with pytest.raises(VerificationError, match="pass 'negate_outputs' changed the numerics: output 'y'") as e:
        optimize(small_model(), passes=["fold_constants", broken_pass, "dead_code"], verify=True)
    assert e.value.pass_name == "negate_outputs"
    # without verify it runs (the checker is satisfied)
    optimize(small_model(), passes=[broken_pass])
    with pytest.raises(PassFailedError, match="pass 'crash' failed with KeyError"):
        optimize(small_model(), passes=["crash"])


# -- the CLI -------------------------------------------------------------------------------------------


@pytest.fixture
def small_onnx(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.pad = nn.ZeroPad2d((0, 1, 0, 1))
            self.conv = nn.Conv2d(3, 4, 3, 2)
            self.bn = nn.BatchNorm2d(4)
            self.act = nn.ReLU6()
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(self.act(self.bn(self.conv(self.pad(x)))))

    m = M().eval()
    m.bn.running_mean.normal_()
    m.bn.running_var.uniform_(0.5, 2)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(1, 3, 8, 8),), str(path), dynamo=False, input_names=["input"],
                          output_names=["logits"], dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
                          do_constant_folding=False, opset_version=17)
    assert "BatchNormalization" in {n.op_type for n in onnx.load(str(path)).graph.node}
    return path


def test_cli_optimize_writes_the_ir_and_reports_counts(small_onnx, tmp_path, capsys):
    out = tmp_path / "out" / "m.nfir"
    assert cli_main(["optimize", str(small_onnx), "--output", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert "fold_batchnorm" in text and "BatchNormalization -1" in text and "total" in text
    g = npuforge.load(out)
    assert ops(g) == ["Conv"] and g.nodes[0].attrs["activation"] == "Clip"
    assert out.with_suffix(".safetensors").is_file()
    assert_same_outputs(npuforge.load(small_onnx), g)
    assert cli_main(["optimize", str(small_onnx), "-o", str(out), "--passes", "fold_constants,fold_pad",
                     "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["passes"]] == ["fold_constants", "fold_pad"]
    assert data["after"].get("Pad", 0) == 0 and data["after"]["BatchNormalization"] == 1


def test_cli_verify_failure_exits_2_naming_the_pass_and_writes_nothing(small_onnx, tmp_path, capsys, broken_pass):
    out = tmp_path / "out" / "m.nfir"
    rc = cli_main(["optimize", str(small_onnx), "-o", str(out), "--verify",
                   "--passes", f"fold_constants,{broken_pass}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("npuforge: error: pass 'negate_outputs' changed the numerics")
    assert not out.exists() and not out.with_suffix(".safetensors").exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_cli_unknown_pass_exits_2_listing_valid_ones(small_onnx, tmp_path, capsys):
    out = tmp_path / "m.nfir"
    assert cli_main(["optimize", str(small_onnx), "-o", str(out), "--passes", "fuse_activations"]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'fuse_activations' (did you mean 'fuse_activation'" in err and "valid passes:" in err
    assert not out.exists()
    assert cli_main(["optimize", str(small_onnx)]) == 2
    assert cli_main(["optimize", "--list"]) == 0
    assert "fold_pad" in capsys.readouterr().out
