"""Every op against ONNX Runtime on random shapes and attributes, edge cases included.

Tolerance: max abs difference <= 1e-5 x max(1, max |ORT output|).
Cases come from a seeded generator so failures reproduce.
"""


import numpy as np
import pytest

from onnx_builders import check_op

RNG = np.random.default_rng(20261130)


def rand(*shape, dtype=np.float32, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# -- Conv ------------------------------------------------------------------------

def _conv_cases():
    cases = []
    rng = np.random.default_rng(1)
    for i in range(24):
        nsp = [1, 2, 2, 2, 3][i % 5]
        group = int(rng.choice([1, 2, 4])) if i % 3 else 1
        cin, cout = group * int(rng.integers(1, 4)), group * int(rng.integers(1, 4))
        k = [int(rng.integers(1, 4)) for _ in range(nsp)]
        s = [int(rng.integers(1, 3)) for _ in range(nsp)]
        d = [int(rng.integers(1, 3)) for _ in range(nsp)]
        size = [int(rng.integers(6, 10)) for _ in range(nsp)]
        auto_pad = ["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"][i % 5]
        attrs = {"strides": s, "dilations": d, "group": group, "kernel_shape": k}
        if auto_pad == "NOTSET":
            attrs["pads"] = [int(p) for p in rng.integers(0, 3, size=2 * nsp)]  # asymmetric too
        else:
            attrs["auto_pad"] = auto_pad
            if auto_pad != "VALID":
                attrs["dilations"] = [1] * nsp  # ONNX Runtime refuses dilated SAME convolutions
        cases.append(pytest.param((nsp, cin, cout, k, size, attrs, bool(i % 2)), id=f"conv{i}-{nsp}d-{auto_pad}"))
    return cases


@pytest.mark.parametrize("case", _conv_cases())
def test_conv(case):
    nsp, cin, cout, k, size, attrs, bias = case
    group = attrs["group"]
    inputs = [("x", rand(2, cin, *size)), ("w", rand(cout, cin // group, *k))]
    if bias:
        inputs.append(("b", rand(cout)))
    check_op("Conv", inputs, attrs, consts={"w", "b"})


def test_conv_depthwise_and_weight_as_runtime_input():
    x, w = rand(1, 8, 9, 9), rand(8, 1, 3, 3)
    check_op("Conv", [("x", x), ("w", w)], {"group": 8, "pads": [0, 1, 2, 1], "strides": [2, 2]})


# -- ConvTranspose -------------------------------------------------------------

def _convt_cases():
    cases = []
    rng = np.random.default_rng(2)
    for i in range(16):
        nsp = [1, 2, 2, 3][i % 4]
        group = int(rng.choice([1, 2]))
        cin, cout = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
        k = [int(rng.integers(1, 4)) for _ in range(nsp)]
        s = [int(rng.integers(1, 4)) for _ in range(nsp)]
        d = [int(rng.integers(1, 3)) for _ in range(nsp)]
        size = [int(rng.integers(3, 6)) for _ in range(nsp)]
        attrs = {"strides": s, "dilations": d, "group": group}
        mode = i % 4
        if mode == 0:
            attrs["pads"] = [int(p) for p in rng.integers(0, 2, size=2 * nsp)]
        elif mode == 1:
            attrs["output_padding"] = [int(rng.integers(0, max(si, di))) for si, di in zip(s, d)]
            attrs["pads"] = [int(p) for p in rng.integers(0, 2, size=2 * nsp)]
        elif mode == 2:
            attrs["auto_pad"] = ["SAME_UPPER", "SAME_LOWER"][i % 8 // 4]
        else:
            full = [si * (n - 1) + (ki - 1) * di + 1 for si, n, ki, di in zip(s, size, k, d)]
            attrs["output_shape"] = [max(1, f - int(rng.integers(0, 2))) for f in full]
        cases.append(pytest.param((cin, cout, k, size, attrs), id=f"convT{i}-{nsp}d-mode{mode}"))
    return cases


@pytest.mark.parametrize("case", _convt_cases())
def test_conv_transpose(case):
    cin, cout, k, size, attrs = case
    group = attrs["group"]
    inputs = [("x", rand(2, cin, *size)), ("w", rand(cin, cout // group, *k)), ("b", rand(cout))]
    check_op("ConvTranspose", inputs, attrs, consts={"w", "b"})


# -- BatchNormalization ----------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3), (2, 4, 5), (1, 3, 4, 4), (2, 2, 3, 3, 3)])
def test_batchnorm(shape):
    c = shape[1]
    check_op("BatchNormalization",
             [("x", rand(*shape)), ("s", rand(c)), ("b", rand(c)), ("m", rand(c)), ("v", rand(c, lo=0.1, hi=2))],
             {"epsilon": 1e-3}, consts={"s", "b", "m", "v"})


# -- activations ------------------------------------------------------------------

@pytest.mark.parametrize("op,attrs,opset", [
    ("Relu", {}, 17), ("Sigmoid", {}, 17), ("Tanh", {}, 17), ("HardSwish", {}, 17),
    ("HardSigmoid", {}, 17), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17),
    ("LeakyRelu", {}, 17), ("LeakyRelu", {"alpha": 0.2}, 13), ("Relu", {}, 21),
])
def test_unary(op, attrs, opset):
    check_op(op, [("x", rand(2, 3, 5, 4, lo=-8, hi=8))], attrs, opset=opset)


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (-1.0, None), (None, 2.5), (None, None)])
def test_clip(lo, hi):
    inputs = [("x", rand(3, 7, lo=-8, hi=8)),
              ("lo", None if lo is None else np.array(lo, np.float32)),
              ("hi", None if hi is None else np.array(hi, np.float32))]
    check_op("Clip", inputs, consts={"lo", "hi"})


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (4,), (1, 3, 1, 1)])
def test_prelu(slope_shape):
    check_op("PRelu", [("x", rand(2, 3, 5, 4)), ("slope", rand(*slope_shape))], consts={"slope"})


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax(axis):
    check_op("Softmax", [("x", rand(2, 3, 5, lo=-20, hi=20))], {"axis": axis})


# -- binary arithmetic with broadcasting ------------------------------------------

BROADCASTS = [
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((2, 3, 4, 5), (5,)),          # {W}: numpy aligns a 1-D tensor with the LAST axis
    ((2, 3, 4, 3), (3,)),          # {C}-sized but still the last axis, as ONNX says
    ((2, 3, 4, 5), (3, 1, 1)),     # per channel only when the graph says {C,1,1}
    ((2, 3, 4, 5), (1, 3, 1, 1)),
    ((1, 3, 1, 5), (2, 1, 4, 1)),  # both sides broadcast
    ((), (2, 3)),
    ((4, 1), (3,)),
]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
def test_binary(op, shapes):
    a, b = shapes
    y = rand(*b, lo=0.5, hi=2) if op == "Div" else rand(*b)
    check_op(op, [("a", rand(*a)), ("b", y)])
    check_op(op, [("a", y), ("b", rand(*a, lo=0.5, hi=2) if op == "Div" else rand(*a))])


def test_binary_per_channel_bias_is_not_silently_per_channel():
    # a {C} bias against {N,C,H,W} with W != C must fail the shape rule, never broadcast on C
    from onnx_builders import one_node_model

    import npuforge
    model, _ = one_node_model("Add", [("a", rand(1, 3, 4, 5)), ("b", rand(3))], consts={"b"})
    with pytest.raises(npuforge.NpuforgeError, match="do not broadcast"):
        npuforge.import_onnx(model)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_int64(op):
    a = RNG.integers(-50, 50, size=(4, 3)).astype(np.int64)
    b = RNG.integers(1, 7, size=(3,)).astype(np.int64) * RNG.choice([-1, 1], size=3)
    check_op(op, [("a", a), ("b", b)])


# -- pooling ------------------------------------------------------------------------

def _pool_cases():
    cases = []
    rng = np.random.default_rng(3)
    for i in range(30):
        nsp = [2, 2, 2, 1, 3][i % 5]
        k = [int(rng.integers(1, 4)) for _ in range(nsp)]
        s = [int(rng.integers(1, 4)) for _ in range(nsp)]
        size = [int(rng.integers(5, 10)) for _ in range(nsp)]
        attrs = {"kernel_shape": k, "strides": s, "ceil_mode": int(i % 2)}
        if i % 6 == 5:
            attrs["auto_pad"] = ["SAME_UPPER", "SAME_LOWER", "VALID"][i % 3]
            attrs.pop("ceil_mode")
        else:
            attrs["pads"] = [int(rng.integers(0, kk)) if kk > 1 else 0 for kk in k * 2]  # asymmetric
        if i % 4 == 3:
            attrs["dilations"] = [int(rng.integers(1, 3)) for _ in range(nsp)]
        cases.append(pytest.param((size, attrs), id=f"pool{i}-{nsp}d"))
    return cases


@pytest.mark.parametrize("case", _pool_cases())
def test_maxpool(case):
    size, attrs = case
    check_op("MaxPool", [("x", rand(2, 3, *size))], attrs)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", _pool_cases())
def test_averagepool(case, count_include_pad):
    size, attrs = case
    attrs = dict(attrs, count_include_pad=count_include_pad)
    opset = 19 if "dilations" in attrs else 17
    check_op("AveragePool", [("x", rand(2, 3, *size))], attrs, opset=opset)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 6), (1, 2, 3, 4, 5)])
def test_global_average_pool(shape):
    check_op("GlobalAveragePool", [("x", rand(*shape))])


# -- Gemm, MatMul -------------------------------------------------------------------

@pytest.mark.parametrize("ta,tb,alpha,beta,cshape", [
    (0, 0, 1.0, 1.0, (5,)), (1, 0, 0.5, 2.0, (3, 5)), (0, 1, 1.0, 0.5, (1, 5)),
    (1, 1, 2.0, 1.0, (3, 1)), (0, 0, 1.0, 1.0, None), (0, 1, 1.0, 1.0, ()),
])
def test_gemm(ta, tb, alpha, beta, cshape):
    a = rand(4, 3) if ta else rand(3, 4)
    b = rand(5, 4) if tb else rand(4, 5)
    inputs = [("a", a), ("b", b), ("c", None if cshape is None else rand(*cshape))]
    check_op("Gemm", inputs, {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}, consts={"b", "c"})


@pytest.mark.parametrize("sa,sb", [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((7, 4), (2, 4, 3)),
])
def test_matmul(sa, sb):
    check_op("MatMul", [("a", rand(*sa)), ("b", rand(*sb))])


# -- layout ops ---------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -3])
def test_flatten(axis):
    check_op("Flatten", [("x", rand(2, 3, 4, 5))], {"axis": axis})


@pytest.mark.parametrize("target,allowzero", [
    ([6, -1], 0), ([0, -1], 0), ([-1], 0), ([2, 0, 2, -1], 0), ([0, 3, 0, 5], 0), ([4, 30], 1),
])
def test_reshape(target, allowzero):
    check_op("Reshape", [("x", rand(4, 3, 2, 5)), ("s", np.array(target, np.int64))], {"allowzero": allowzero},
             consts={"s"})


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm):
    check_op("Transpose", [("x", rand(2, 3, 4, 5))], {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat(axis):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for k, s in enumerate(shapes):
        s[axis] += k
    check_op("Concat", [(f"x{k}", rand(*s)) for k, s in enumerate(shapes)], {"axis": axis})


@pytest.mark.parametrize("axis,split,n,opset", [
    (1, [1, 2, 3], 3, 13), (-1, None, 2, 13), (0, [4], 1, 17), (2, None, 3, 18), (2, None, 4, 18),
])
def test_split(axis, split, n, opset):
    attrs = {"axis": axis}
    if split is None and opset >= 18:
        attrs["num_outputs"] = n
    inputs = [("x", rand(4, 6, 10)), ("split", None if split is None else np.array(split, np.int64))]
    check_op("Split", inputs, attrs, n_outputs=n, opset=opset, consts={"split"})


SLICES = [
    ([1], [3], [0], [1]), ([0, 1], [-1, 100], [1, 2], None), ([-1], [-100], [0], [-1]),
    ([5], [0], [2], [-2]), ([0, 0], [10, 10], [-1, -2], [3, 2]), ([2], [2], [1], [1]),
    ([-3], [2**62], [1], None), ([10], [-10], [2], [-3]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    inputs = [("x", rand(4, 5, 6)), ("starts", np.array(starts, np.int64)), ("ends", np.array(ends, np.int64)),
              ("axes", np.array(axes, np.int64)), ("steps", None if steps is None else np.array(steps, np.int64))]
    check_op("Slice", inputs, consts={"starts", "ends", "axes", "steps"})


@pytest.mark.parametrize("axes", [None, [0, 2], [-1]])
def test_squeeze(axes):
    inputs = [("x", rand(1, 3, 1, 4, 1)), ("axes", None if axes is None else np.array(axes, np.int64))]
    check_op("Squeeze", inputs, consts={"axes"})


@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [0, -1, 2]])
def test_unsqueeze(axes):
    check_op("Unsqueeze", [("x", rand(3, 4)), ("axes", np.array(axes, np.int64))], consts={"axes"})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads,axes", [
    ([0, 0, 1, 2, 0, 0, 2, 1], None), ([1, 0, 0, 1, 2, 1], None), ([0, 0, -1, 1, 0, 0, 2, -1], None),
    ([1, 2, 2, 1], [2, -1]),
])
def test_pad(mode, pads, axes):
    x = rand(2, 3, 4, 5) if len(pads) != 6 else rand(3, 4, 5)
    inputs = [("x", x), ("pads", np.array(pads, np.int64)),
              ("value", np.array(1.5, np.float32) if mode == "constant" else None),
              ("axes", None if axes is None else np.array(axes, np.int64))]
    check_op("Pad", inputs, {"mode": mode}, opset=19, consts={"pads", "value", "axes"})


# -- Resize -------------------------------------------------------------------------

COORD_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("mode,nearest", [("linear", "round_prefer_floor")] + [("nearest", m) for m in NEAREST_MODES])
@pytest.mark.parametrize("how", ["scales_up", "scales_down", "sizes"])
def test_resize(coord, mode, nearest, how):
    x = rand(1, 2, 5, 7)
    scales = sizes = None
    if how == "scales_up":
        scales = np.array([1, 1, 2.0, 1.5], np.float32)
    elif how == "scales_down":
        scales = np.array([1, 1, 0.6, 0.5], np.float32)
    else:
        sizes = np.array([1, 2, 8, 3], np.int64)
    inputs = [("x", x), ("roi", None), ("scales", scales), ("sizes", sizes)]
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    check_op("Resize", inputs, attrs, opset=19, consts={"scales", "sizes"})


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("how", ["scales_up", "scales_down", "sizes"])
@pytest.mark.parametrize("a,exclude", [(-0.75, 0), (-0.5, 1)])
def test_resize_cubic(coord, how, a, exclude):
    """Cubic convolution (PyTorch's bicubic is a = -0.75, TensorFlow's -0.5), edge taps replicated or
    excluded, against ONNX Runtime."""
    x = rand(1, 2, 6, 7)
    scales = sizes = None
    if how == "scales_up":
        scales = np.array([1, 1, 2.0, 1.5], np.float32)
    elif how == "scales_down":
        scales = np.array([1, 1, 0.6, 0.5], np.float32)
    else:
        sizes = np.array([1, 2, 9, 4], np.int64)
    inputs = [("x", x), ("roi", None), ("scales", scales), ("sizes", sizes)]
    attrs = {"mode": "cubic", "coordinate_transformation_mode": coord, "cubic_coeff_a": a, "exclude_outside": exclude}
    check_op("Resize", inputs, attrs, opset=19, consts={"scales", "sizes"})


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio(policy):
    inputs = [("x", rand(1, 2, 4, 6)), ("roi", None), ("scales", None), ("sizes", np.array([9, 9], np.int64))]
    check_op("Resize", inputs, {"axes": [2, 3], "keep_aspect_ratio_policy": policy, "mode": "linear"},
             opset=18, consts={"sizes"})


def test_resize_opset13_nearest_upsample():
    inputs = [("x", rand(2, 3, 4, 4)), ("roi", np.array([], np.float32)), ("scales", np.array([1, 1, 2, 2], np.float32))]
    check_op("Resize", inputs, {"mode": "nearest"}, opset=13, consts={"roi", "scales"})


# -- reductions ------------------------------------------------------------------------

@pytest.mark.parametrize("axes,keepdims", [([2, 3], 1), ([-1], 0), (None, 1), ([0, 2], 0)])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_mean(axes, keepdims, opset):
    x = rand(2, 3, 4, 5)
    if opset < 18:
        attrs = {"keepdims": keepdims}
        if axes is not None:
            attrs["axes"] = axes
        check_op("ReduceMean", [("x", x)], attrs, opset=opset)
    else:
        inputs = [("x", x), ("axes", None if axes is None else np.array(axes, np.int64))]
        check_op("ReduceMean", inputs, {"keepdims": keepdims}, opset=opset, consts={"axes"})


def test_reduce_mean_noop_with_empty_axes():
    check_op("ReduceMean", [("x", rand(2, 3))], {"noop_with_empty_axes": 1}, opset=18)


# -- identity-like and shape ops ------------------------------------------------------

def test_identity_and_dropout():
    check_op("Identity", [("x", rand(2, 3))])
    check_op("Dropout", [("x", rand(2, 3)), ("ratio", np.array(0.5, np.float32))], consts={"ratio"})


@pytest.mark.parametrize("start,end", [(None, None), (1, None), (-2, None), (0, -1), (1, 3)])
def test_shape(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check_op("Shape", [("x", rand(2, 3, 4, 5))], attrs, opset=15)


@pytest.mark.parametrize("axis,idx", [(0, [0, -1]), (1, [[2, 0], [1, -3]]), (-1, 3), (2, [])])
def test_gather(axis, idx):
    check_op("Gather", [("x", rand(3, 4, 5)), ("i", np.array(idx, np.int64))], {"axis": axis}, consts={"i"})


@pytest.mark.parametrize("src,dst", [
    (np.float32, 7), (np.float32, 6), (np.int64, 1), (np.float32, 9), (np.int64, 3), (np.float32, 11),
])
def test_cast(src, dst):
    x = rand(3, 4, lo=-100, hi=100)
    check_op("Cast", [("x", x.astype(src))], {"to": dst})


def test_constant_of_shape():
    from onnx import helper, TensorProto

    value = helper.make_tensor("v", TensorProto.INT64, [1], [7])
    check_op("ConstantOfShape", [("s", np.array([2, 3], np.int64))], {"value": value}, consts={"s"})
    check_op("ConstantOfShape", [("s", np.array([4], np.int64))], consts={"s"})


def test_all_listed_ops_are_registered():
    from npuforge.ops import all_ops

    listed = """Conv ConvTranspose BatchNormalization Relu Clip LeakyRelu PRelu Sigmoid HardSigmoid HardSwish Tanh
    Add Sub Mul Div MaxPool AveragePool GlobalAveragePool Gemm MatMul Flatten Reshape Transpose Concat Split Slice
    Pad Resize Softmax ReduceMean Squeeze Unsqueeze Identity Dropout Shape Gather Cast ConstantOfShape""".split()
    assert not set(listed) - set(all_ops())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check_op("Gelu", [("x", rand(2, 3, 7, lo=-5, hi=5))], {"approximate": approximate}, opset=20)


@pytest.mark.parametrize("activation,params,ref", [
    ("Relu", [], lambda y: np.maximum(y, 0)),
    ("Clip", [0.0, 6.0], lambda y: np.clip(y, 0, 6)),
    ("LeakyRelu", [0.1], lambda y: np.where(y >= 0, y, 0.1 * y)),
])
def test_fused_activation_on_conv_and_gemm(activation, params, ref):
    from onnx_builders import one_node_model, run_ort

    import npuforge
    for op, inputs, consts in (
        ("Conv", [("x", rand(1, 3, 6, 6)), ("w", rand(4, 3, 3, 3)), ("b", rand(4))], {"w", "b"}),
        ("Gemm", [("x", rand(2, 5)), ("w", rand(5, 4)), ("b", rand(4))], {"w", "b"}),
    ):
        model, feeds = one_node_model(op, inputs, consts=consts)
        plain = run_ort(model, feeds)[0]
        graph = npuforge.import_onnx(model)
        graph.nodes[0].attrs.update(activation=activation, activation_params=params)
        graph.check()
        out = graph.run(feeds)[graph.outputs[0]]
        np.testing.assert_allclose(out, ref(plain), rtol=1e-5, atol=1e-5)


def test_swish():
    import npuforge
    from onnx_builders import one_node_model

    model, feeds = one_node_model("Sigmoid", [("x", rand(3, 4, lo=-6, hi=6))])
    graph = npuforge.import_onnx(model)
    graph.nodes[0].op = "Swish"
    graph.check()
    x = feeds["x"]
    np.testing.assert_allclose(graph.run(feeds)["y0"], x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-6)
