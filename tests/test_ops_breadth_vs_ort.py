"""The breadth ops (math, logic, reductions, indexing, layout, normalizations,
selection) against ONNX Runtime on seeded random shapes and attributes, edge
cases included.

Tolerance as in test_ops_vs_ort.py: max abs difference <= 1e-5 x max(1, max
|ORT output|); integer and bool outputs exactly. Each case draws from its own
generator, seeded by the case's name, so a case reproduces when run alone.
"""

import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import npuforge
from npuforge.errors import NpuforgeError
from onnx_builders import check_op, one_node_model, run_ort, run_ours


def rng_for(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rand(rng, *shape, dtype=np.float32, lo=-3.0, hi=3.0):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def ints(rng, *shape, dtype=np.int64, lo=-20, hi=20):
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


def rand_shape(rng, rank_lo=1, rank_hi=4, lo=1, hi=5) -> tuple:
    return tuple(int(d) for d in rng.integers(lo, hi, size=int(rng.integers(rank_lo, rank_hi + 1)), endpoint=True))


# Shape pairs that broadcast numpy-style, both directions and scalars included.
BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((1, 3, 1, 5), (2, 1, 4, 1)),
              ((), (2, 3)), ((4, 1), (3,)), ((2, 1, 3), (5, 1))]
BROADCAST_IDS = [f"{a}x{b}" for a, b in BROADCASTS]


# -- unary float math (each a lookup table when quantized) -------------------------------------

UNARY = [  # op, attrs, input range, opset
    ("Erf", {}, (-3, 3), 13), ("Sqrt", {}, (0.0, 9), 13), ("Exp", {}, (-6, 6), 13), ("Log", {}, (0.01, 20), 13),
    ("Reciprocal", {}, (0.2, 5), 13), ("Sin", {}, (-7, 7), 13), ("Cos", {}, (-7, 7), 13), ("Tan", {}, (-1.4, 1.4), 13),
    ("Asin", {}, (-0.99, 0.99), 13), ("Acos", {}, (-0.99, 0.99), 13), ("Atan", {}, (-6, 6), 13),
    ("Sinh", {}, (-4, 4), 13), ("Cosh", {}, (-4, 4), 13), ("Asinh", {}, (-6, 6), 13), ("Acosh", {}, (1.0, 6), 13),
    ("Atanh", {}, (-0.99, 0.99), 13), ("Floor", {}, (-6, 6), 13), ("Ceil", {}, (-6, 6), 13),
    ("Round", {}, (-6, 6), 13), ("Softplus", {}, (-30, 30), 13), ("Softsign", {}, (-6, 6), 13),
    ("Mish", {}, (-8, 8), 18), ("Elu", {}, (-4, 4), 13), ("Elu", {"alpha": 0.3}, (-4, 4), 13),
    ("Selu", {}, (-4, 4), 13), ("Selu", {"alpha": 1.2, "gamma": 0.7}, (-4, 4), 13), ("Celu", {}, (-4, 4), 13),
    ("Celu", {"alpha": 2.5}, (-4, 4), 13), ("ThresholdedRelu", {}, (-3, 3), 13),
    ("ThresholdedRelu", {"alpha": -0.5}, (-3, 3), 13), ("Shrink", {}, (-3, 3), 13),
    ("Shrink", {"bias": 0.2, "lambd": 1.1}, (-3, 3), 13), ("LogSoftmax", {}, (-20, 20), 13),
    ("LogSoftmax", {"axis": 0}, (-20, 20), 13), ("Hardmax", {}, (-3, 3), 13), ("Hardmax", {"axis": 1}, (-3, 3), 13),
    ("Reciprocal", {}, (-5, -0.2), 13), ("Erf", {}, (-3, 3), 21),
]


@pytest.mark.parametrize("op,attrs,bounds,opset", UNARY, ids=[f"{u[0]}{i}" for i, u in enumerate(UNARY)])
def test_unary_float(op, attrs, bounds, opset):
    rng = rng_for("unary", op, str(attrs), opset)
    for _ in range(3):
        x = rand(rng, *rand_shape(rng, 2 if op == "Hardmax" else 1, 4), lo=bounds[0], hi=bounds[1])
        check_op(op, [("x", x)], attrs, opset=opset)


@pytest.mark.parametrize("op", ["Sqrt", "Exp", "Log", "Sin", "Cos", "Floor", "Ceil", "Round", "Abs", "Neg",
                                "Reciprocal"])
def test_unary_float64(op):
    rng = rng_for("unary64", op)
    check_op(op, [("x", rand(rng, 3, 5, dtype=np.float64, lo=0.1, hi=4))])


def test_round_halves_to_even_and_floor_ceil_at_integers():
    x = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -2.0, 0.0, 2.0, 2.4999, 2.5001, -0.4999], np.float32)
    y = check_op("Round", [("x", x)])[0]
    np.testing.assert_array_equal(y, [-4, -2, -2, -0, 0, 2, 2, 4, -2, 0, 2, 2, 3, -0])
    for op in ("Floor", "Ceil"):
        check_op(op, [("x", x)])


@pytest.mark.parametrize("op,dtype", [(op, dtype) for op in ("Abs", "Neg", "Sign")
                                      for dtype in (np.float32, np.int8, np.int32, np.int64, np.uint8)
                                      if not (op == "Neg" and dtype == np.uint8)])  # ONNX has no unsigned Neg
def test_abs_neg_sign_integers(op, dtype):
    rng = rng_for("absnegsign", op, dtype.__name__)
    lo = 0 if dtype == np.uint8 else -100
    x = rng.integers(lo, 100, size=(3, 4)).astype(dtype) if dtype != np.float32 else rand(rng, 3, 4)
    if dtype == np.int8:
        x[0, 0] = -128  # two's complement: |-128| and -(-128) stay -128
    if dtype != np.float32:
        x[0, 1] = 0
    check_op(op, [("x", x)])


def test_neg_of_unsigned_is_refused():
    model, _ = one_node_model("Neg", [("x", np.array([1, 2], np.uint8))])
    with pytest.raises(NpuforgeError, match="dtype uint8 is not allowed"):
        npuforge.import_onnx(model)


def test_shrink_integers():
    x = np.arange(-6, 7).astype(np.int32)
    check_op("Shrink", [("x", x)], {"bias": 2.0, "lambd": 1.5})
    check_op("Shrink", [("x", x.astype(np.int8))], {"bias": 1.0, "lambd": 0.0})
    model, _ = one_node_model("Shrink", [("x", x)], {"bias": 1.5})
    with pytest.raises(NpuforgeError, match="rounding"):
        npuforge.import_onnx(model)


@pytest.mark.parametrize("opset", [13, 20])
def test_isnan_isinf(opset):
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -1.5, 3e38]], np.float32)
    check_op("IsNaN", [("x", x)], opset=opset)
    for neg, pos in ((1, 1), (0, 1), (1, 0), (0, 0)):
        check_op("IsInf", [("x", x)], {"detect_negative": neg, "detect_positive": pos}, opset=opset)


# -- comparisons, logic, Where ---------------------------------------------------------------

def _operands(rng, shapes, dtype):
    if dtype == np.bool_:
        return [rng.integers(0, 2, size=s).astype(bool) for s in shapes]
    if dtype == np.float32:  # whole numbers, so that equal values occur
        return [rng.integers(-3, 3, size=s, endpoint=True).astype(np.float32) for s in shapes]
    lo = 0 if dtype == np.uint8 else -3
    return [rng.integers(lo, 3, size=s, endpoint=True).astype(dtype) for s in shapes]


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=BROADCAST_IDS)
def test_compare(op, dtype, shapes):
    a, b = _operands(rng_for("cmp", op, dtype.__name__, shapes), shapes, dtype)
    check_op(op, [("a", a), ("b", b)])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_compare_small_integers(op, dtype):
    a, b = _operands(rng_for("cmp8", op, dtype.__name__), [(3, 4), (4,)], dtype)
    check_op(op, [("a", a), ("b", b)])


def test_equal_bool():
    a, b = _operands(rng_for("eqbool"), [(2, 3), (3,)], np.bool_)
    check_op("Equal", [("a", a), ("b", b)])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=BROADCAST_IDS)
def test_logical(op, shapes):
    a, b = _operands(rng_for("logic", op, shapes), shapes, np.bool_)
    check_op(op, [("a", a), ("b", b)])


def test_not():
    check_op("Not", [("x", _operands(rng_for("not"), [(3, 4, 2)], np.bool_)[0])])


WHERE_SHAPES = [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((3, 1), (1, 4), (3, 4)), ((4,), (2, 1), ()),
                ((2, 1, 1), (3, 1), (4,))]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("shapes", WHERE_SHAPES)
def test_where(dtype, shapes):
    rng = rng_for("where", dtype.__name__, shapes)
    cond = rng.integers(0, 2, size=shapes[0]).astype(bool)
    x, y = _operands(rng, shapes[1:], dtype)
    check_op("Where", [("c", cond), ("x", x), ("y", y)])


@pytest.mark.parametrize("shapes", WHERE_SHAPES)
def test_where_bool_against_numpy(shapes):
    # ONNX allows bool x and y; ONNX Runtime has no kernel for them
    rng = rng_for("where_bool", shapes)
    cond, x, y = _operands(rng, shapes, np.bool_)
    model, feeds = one_node_model("Where", [("c", cond), ("x", x), ("y", y)])
    np.testing.assert_array_equal(run_ours(model, feeds)[0], np.where(cond, x, y))


# -- Min, Max, Sum, Mean ---------------------------------------------------------------------------

VARIADIC_SHAPES = [[(2, 3)], [(2, 3), (2, 3)], [(2, 1, 4), (3, 1), (4,)], [(), (3, 2)], [(5,), (1,), (2, 5), (5,)]]


@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
@pytest.mark.parametrize("shapes", VARIADIC_SHAPES, ids=[f"{len(s)}-{i}" for i, s in enumerate(VARIADIC_SHAPES)])
def test_variadic_float(op, shapes):
    rng = rng_for("variadic", op, shapes)
    check_op(op, [(f"x{k}", rand(rng, *s)) for k, s in enumerate(shapes)])


@pytest.mark.parametrize("op", ["Min", "Max"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64, np.float64])
def test_min_max_dtypes(op, dtype):
    rng = rng_for("minmax", op, dtype.__name__)
    check_op(op, [("a", _operands(rng, [(3, 4)], dtype)[0]), ("b", _operands(rng, [(4,)], dtype)[0])])


# -- Mod, Pow, BitShift ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((3, 4), (4,)), ((2, 1), (1, 6))])
def test_mod_integers(dtype, fmod, shapes):
    rng = rng_for("mod", dtype.__name__, fmod, shapes)
    a = rng.integers(-50, 50, size=shapes[0], endpoint=True).astype(dtype)
    b = rng.integers(1, 9, size=shapes[1], endpoint=True) * rng.choice([-1, 1], size=shapes[1])
    b = b.astype(dtype)
    y = check_op("Mod", [("a", a), ("b", b)], {"fmod": fmod})[0]
    # the sign rule itself: fmod=0 follows the divisor, fmod=1 the dividend
    sign_of = np.broadcast_to(b if not fmod else a, y.shape)
    assert np.all((y == 0) | (np.sign(y) == np.sign(sign_of)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mod_float_fmod(dtype):
    rng = rng_for("modf", dtype.__name__)
    a = rand(rng, 3, 5, dtype=dtype, lo=-10, hi=10)
    b = rand(rng, 5, dtype=dtype, lo=0.5, hi=3) * rng.choice([-1, 1], size=5).astype(dtype)
    check_op("Mod", [("a", a), ("b", b)], {"fmod": 1})


def test_mod_float_without_fmod_is_refused():
    model, _ = one_node_model("Mod", [("a", np.ones(3, np.float32)), ("b", np.ones(3, np.float32))])
    with pytest.raises(NpuforgeError, match="fmod=1"):
        npuforge.import_onnx(model)


POW_CASES = [  # base dtype, base range, exponent dtype, exponent range
    (np.float32, (0.1, 4), np.float32, (-3, 3)), (np.float32, (-4, 4), np.float32, (0, 4)),
    (np.float32, (-4, 4), np.int64, (-3, 4)), (np.float32, (0.1, 4), np.float64, (-2, 2)),
    (np.float64, (0.1, 4), np.float32, (-2, 2)), (np.int64, (-5, 5), np.int64, (0, 6)),
    (np.int32, (-6, 6), np.int32, (-3, 4)), (np.int64, (1, 9), np.float32, (0, 2.5)),
    (np.int32, (-5, 5), np.int64, (0, 5)), (np.float32, (-3, 3), np.int32, (0, 5)),
]


POW_IDS = [f"{c[0].__name__}^{c[2].__name__}-{i}" for i, c in enumerate(POW_CASES)]


@pytest.mark.parametrize("case", POW_CASES, ids=POW_IDS)
def test_pow(case):
    base_t, (blo, bhi), exp_t, (elo, ehi) = case
    rng = rng_for("pow", str(case))

    def draw(dtype, lo, hi, shape):
        if np.issubdtype(dtype, np.integer):
            return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
        return rand(rng, *shape, dtype=dtype, lo=lo, hi=hi)

    x = draw(base_t, blo, bhi, (3, 4))
    y = draw(exp_t, elo, ehi, (4,))
    if np.issubdtype(base_t, np.integer) and elo < 0:
        x[x == 0] = 2  # 0 to a negative power is undefined
        x[0, :2] = [1, -1]  # the integer negative powers that are not 0
    if base_t == np.float32 and blo < 0 and not np.issubdtype(exp_t, np.integer):
        y = np.round(y).astype(exp_t)  # a negative base needs whole exponents
    check_op("Pow", [("x", x), ("y", y)], opset=15)


def test_bitshift():
    rng = rng_for("bitshift")
    x = rng.integers(0, 255, size=(4, 5), endpoint=True).astype(np.uint8)
    s = rng.integers(0, 9, size=(5,), endpoint=True).astype(np.uint8)
    for direction in ("LEFT", "RIGHT"):
        check_op("BitShift", [("x", x), ("s", s)], {"direction": direction})


# -- reductions ----------------------------------------------------------------------------------

REDUCE_OPS = ["ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
              "ReduceProd", "ReduceMax", "ReduceMin", "ReduceMean"]
REDUCE_AXES = [None, [0], [-1], [1, -1], [0, 1, 2, 3], [2, 0]]


def _reduce_input(rng, op, shape, dtype=np.float32):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-3 if op != "ReduceProd" else -2, 4, size=shape).astype(dtype)
    if op == "ReduceLogSum":
        return rand(rng, *shape, lo=0.1, hi=3)
    if op == "ReduceProd":
        return rand(rng, *shape, lo=0.6, hi=1.5) * rng.choice([-1, 1], size=shape).astype(np.float32)
    return rand(rng, *shape, lo=-4, hi=4)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", REDUCE_AXES, ids=[str(a) for a in REDUCE_AXES])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce(op, axes, keepdims, opset):
    rng = rng_for("reduce", op, axes, keepdims, opset)
    x = _reduce_input(rng, op, (2, 3, 4, 3))
    if opset < 18 and op != "ReduceSum":  # axes as an attribute before opset 18 (ReduceSum: 13)
        attrs = {"keepdims": keepdims, **({} if axes is None else {"axes": axes})}
        check_op(op, [("x", x)], attrs, opset=opset)
    else:
        inputs = [("x", x), ("axes", None if axes is None else np.array(axes, np.int64))]
        check_op(op, inputs, {"keepdims": keepdims}, opset=opset, consts={"axes"})


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op):
    # only the reduction is skipped: ReduceSumSquare still squares, ReduceLogSum still takes the log
    x = _reduce_input(rng_for("noop", op), op, (2, 3))
    check_op(op, [("x", x)], {"noop_with_empty_axes": 1}, opset=18)
    check_op(op, [("x", x), ("axes", np.array([], np.int64))], {"noop_with_empty_axes": 1, "keepdims": 0},
             opset=18, consts={"axes"})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceProd", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integers(op, dtype):
    rng = rng_for("reduce_int", op, dtype.__name__)
    x = _reduce_input(rng, op, (3, 4, 2), dtype)
    check_op(op, [("x", x), ("axes", np.array([1], np.int64))], {"keepdims": 0}, opset=18, consts={"axes"})
    check_op(op, [("x", x)], opset=18)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.bool_])
def test_reduce_max_min_small_types(op, dtype):
    rng = rng_for("reduce_small", op, dtype.__name__)
    x = rng.integers(0, 2, size=(3, 4)).astype(bool) if dtype == np.bool_ else \
        rng.integers(0 if dtype == np.uint8 else -100, 100, size=(3, 4)).astype(dtype)
    check_op(op, [("x", x), ("axes", np.array([-1], np.int64))], opset=20, consts={"axes"})


def test_reduce_l2_of_integers_is_refused():
    model, _ = one_node_model("ReduceL2", [("x", np.ones((2, 3), np.int64))], opset=18)
    with pytest.raises(NpuforgeError, match="rounding"):
        npuforge.import_onnx(model)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_cumsum(exclusive, reverse, dtype):
    rng = rng_for("cumsum", exclusive, reverse, dtype.__name__)
    for _ in range(3):
        shape = rand_shape(rng, 1, 4)
        axis = int(rng.integers(-len(shape), len(shape)))
        x = ints(rng, *shape, dtype=dtype) if np.issubdtype(dtype, np.integer) else rand(rng, *shape, dtype=dtype)
        axis_t = np.array(axis, np.int32 if rng.integers(2) else np.int64)
        check_op("CumSum", [("x", x), ("axis", axis_t)], {"exclusive": exclusive, "reverse": reverse},
                 opset=14, consts={"axis"})


# -- ArgMax, ArgMin, TopK --------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.int8, np.uint8])
def test_argmax_argmin(op, select_last_index, keepdims, dtype):
    rng = rng_for("arg", op, select_last_index, keepdims, dtype.__name__)
    for _ in range(3):
        shape = rand_shape(rng, 1, 4)
        axis = int(rng.integers(-len(shape), len(shape)))
        x = rng.integers(0, 3, size=shape).astype(dtype)  # few values: many ties
        check_op(op, [("x", x)], {"axis": axis, "keepdims": keepdims, "select_last_index": select_last_index})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.float64])
def test_topk(largest, dtype):
    rng = rng_for("topk", largest, dtype.__name__)
    for _ in range(4):
        shape = rand_shape(rng, 1, 3, lo=2, hi=6)
        axis = int(rng.integers(-len(shape), len(shape)))
        k = int(rng.integers(0, shape[axis], endpoint=True))
        x = rng.integers(-4, 4, size=shape).astype(dtype)  # ties: equal values come in index order
        check_op("TopK", [("x", x), ("k", np.array([k], np.int64))], {"axis": axis, "largest": largest},
                 n_outputs=2, consts={"k"})


def test_topk_unsorted_returns_the_same_elements():
    # sorted=0 leaves the order open: compare the (index, value) pairs as sets
    rng = rng_for("topk_unsorted")
    x = rng.permutation(40).astype(np.float32).reshape(4, 10)
    for largest in (0, 1):
        model, feeds = one_node_model("TopK", [("x", x), ("k", np.array([4], np.int64))],
                                      {"sorted": 0, "largest": largest}, n_outputs=2, consts={"k"})
        (rv, ri), (ov, oi) = run_ort(model, feeds), run_ours(model, feeds)
        for r in range(4):
            assert sorted(zip(ri[r], rv[r])) == sorted(zip(oi[r], ov[r]))
        np.testing.assert_array_equal(np.take_along_axis(x, oi, 1), ov)


# -- layout: Expand, Tile, DepthToSpace, SpaceToDepth, ReverseSequence -----------------------------

EXPANDS = [((3, 1), (2, 3, 4)), ((1,), (3,)), ((2, 3), (3,)), ((2, 1, 4), (1, 5, 1)), ((), (2, 2)),
           ((4, 1), (1, 1)), ((1, 3, 1), (2, 1, 1, 6))]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("shapes", EXPANDS, ids=[f"{a}to{b}" for a, b in EXPANDS])
def test_expand(dtype, shapes):
    rng = rng_for("expand", dtype.__name__, shapes)
    x = _operands(rng, [shapes[0]], dtype)[0]
    check_op("Expand", [("x", x), ("s", np.array(shapes[1], np.int64))], consts={"s"})


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
def test_tile(dtype):
    rng = rng_for("tile", dtype.__name__)
    for _ in range(4):
        shape = rand_shape(rng, 1, 4, hi=3)
        reps = rng.integers(0 if rng.integers(4) == 0 else 1, 3, size=len(shape), endpoint=True)
        x = _operands(rng, [shape], dtype)[0]
        check_op("Tile", [("x", x), ("r", reps.astype(np.int64))], consts={"r"})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("blocksize", [1, 2, 3])
def test_depth_to_space(mode, blocksize):
    rng = rng_for("d2s", mode, blocksize)
    x = rand(rng, 2, 2 * blocksize * blocksize, 3, 4)
    check_op("DepthToSpace", [("x", x)], {"blocksize": blocksize, "mode": mode})


@pytest.mark.parametrize("blocksize", [1, 2, 3])
def test_space_to_depth(blocksize):
    rng = rng_for("s2d", blocksize)
    check_op("SpaceToDepth", [("x", rand(rng, 2, 3, 2 * blocksize, 3 * blocksize))], {"blocksize": blocksize})
    check_op("SpaceToDepth", [("x", rand(rng, 1, 2, 2 * blocksize, blocksize, dtype=np.float64))],
             {"blocksize": blocksize})


@pytest.mark.parametrize("time_axis", [0, 1])
def test_reverse_sequence(time_axis):
    rng = rng_for("revseq", time_axis)
    steps, batch = 5, 4
    shape = (steps, batch, 3) if time_axis == 0 else (batch, steps, 2)
    lens = rng.integers(1, steps, size=batch, endpoint=True).astype(np.int64)
    check_op("ReverseSequence", [("x", rand(rng, *shape)), ("l", lens)],
             {"time_axis": time_axis, "batch_axis": 1 - time_axis})


# -- indexing: GatherElements, GatherND, ScatterElements, ScatterND, OneHot --------------------------

@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_gather_elements(idx_dtype):
    rng = rng_for("gather_elements", idx_dtype.__name__)
    for _ in range(5):
        shape = rand_shape(rng, 1, 4, lo=2)
        axis = int(rng.integers(-len(shape), len(shape)))
        ishape = [int(rng.integers(1, d, endpoint=True)) for d in shape]  # off-axis dims may be smaller
        ishape[axis] = int(rng.integers(1, 6))
        n = shape[axis]
        idx = rng.integers(-n, n, size=ishape).astype(idx_dtype)  # negative ones count from the end
        check_op("GatherElements", [("x", rand(rng, *shape)), ("i", idx)], {"axis": axis})


GATHER_ND = [  # data shape, indices shape (last = tuple length), batch_dims
    ((4, 5), (3, 2), 0), ((4, 5), (3, 1), 0), ((2, 3, 4), (2, 2, 3), 0), ((2, 3, 4), (5, 2), 0),
    ((2, 3, 4), (2, 1), 1), ((2, 3, 4), (2, 4, 2), 1), ((2, 3, 4, 2), (2, 3, 1), 2), ((2, 3, 4), (2, 3, 2, 1), 2),
]


@pytest.mark.parametrize("case", GATHER_ND, ids=[str(c) for c in GATHER_ND])
def test_gather_nd(case):
    dshape, ishape, b = case
    rng = rng_for("gather_nd", case)
    k = ishape[-1]
    idx = np.stack([rng.integers(-dshape[b + j], dshape[b + j], size=ishape[:-1]) for j in range(k)], -1)
    check_op("GatherND", [("x", rand(rng, *dshape)), ("i", idx.astype(np.int64))], {"batch_dims": b})


def _distinct_along(rng, shape, axis, n):
    """Indices into n positions, distinct along ``axis`` of ``shape``."""
    moved = [d for i, d in enumerate(shape) if i != axis] + [shape[axis]]
    rows = [rng.permutation(n)[:shape[axis]] for _ in range(int(np.prod(moved[:-1])))]
    return np.moveaxis(np.array(rows).reshape(moved), -1, axis)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_elements(reduction, dtype):
    rng = rng_for("scatter_elements", reduction, dtype.__name__)
    for _ in range(4):
        shape = rand_shape(rng, 1, 3, lo=2, hi=6)
        axis = int(rng.integers(-len(shape), len(shape)))
        ishape = [int(rng.integers(1, d, endpoint=True)) for d in shape]
        n = shape[axis]
        ishape[axis] = min(ishape[axis], n)
        if reduction == "none":  # duplicate targets are undefined without a reduction
            idx = _distinct_along(rng, ishape, axis % len(shape), n)
        else:
            idx = rng.integers(-n, n, size=ishape)
        data = _operands(rng, [shape], dtype)[0]
        upd = _operands(rng, [idx.shape], dtype)[0]
        check_op("ScatterElements", [("x", data), ("i", idx.astype(np.int64)), ("u", upd)],
                 {"axis": axis, "reduction": reduction}, opset=18)


SCATTER_ND = [((5,), (3, 1)), ((4, 3), (2, 1)), ((4, 3), (5, 2)), ((2, 3, 4), (2, 2, 2)), ((2, 3, 4), (1, 3))]


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("shapes", SCATTER_ND, ids=[str(s) for s in SCATTER_ND])
def test_scatter_nd(reduction, shapes):
    dshape, ishape = shapes
    rng = rng_for("scatter_nd", reduction, shapes)
    k = ishape[-1]
    cells = int(np.prod(dshape[:k]))
    m = int(np.prod(ishape[:-1]))
    flat = rng.permutation(cells)[:m] if reduction == "none" else rng.integers(0, cells, size=m)
    idx = np.stack(np.unravel_index(flat, dshape[:k]), -1).reshape(ishape)
    idx = np.where(rng.integers(0, 2, size=idx.shape) == 1, idx - np.array(dshape[:k]), idx)  # negative too
    upd = rand(rng, *ishape[:-1], *dshape[k:])
    check_op("ScatterND", [("x", rand(rng, *dshape)), ("i", idx.astype(np.int64)), ("u", upd)],
             {"reduction": reduction}, opset=18)


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("values_dtype", [np.float32, np.int64])
def test_onehot(axis, values_dtype):
    rng = rng_for("onehot", axis, values_dtype.__name__)
    depth = 5
    idx = rng.integers(-depth - 1, depth + 1, size=(3, 4)).astype(np.int64)  # out of range ones stay all-off
    values = np.array([-2, 7], values_dtype)
    check_op("OneHot", [("i", idx), ("d", np.array(depth, np.int64)), ("v", values)], {"axis": axis},
             consts={"d", "v"})
    # int32 indices and depth, float values (the other combination ONNX Runtime has a kernel for)
    inputs = [("i", idx[0].astype(np.int32)), ("d", np.array([3], np.int32)), ("v", values.astype(np.float32))]
    check_op("OneHot", inputs, {"axis": min(axis, 0) if axis != -2 else -1}, consts={"d", "v"})


# -- Range, Size, Einsum, Trilu, EyeLike -------------------------------------------------------------

RANGES = [(0, 10, 1, np.int64), (10, 0, -3, np.int64), (5, 5, 1, np.int32), (3, -2, 1, np.int32),
          (-7, 9, 4, np.int16), (0.5, 3.3, 0.7, np.float32), (2.0, -1.0, -0.25, np.float32),
          (1.0, 11.0, 2.5, np.float64), (0.0, 1.0, 0.1, np.float32)]


@pytest.mark.parametrize("case", RANGES, ids=[str(r[:3]) for r in RANGES])
def test_range(case):
    start, limit, delta, dtype = case
    check_op("Range", [("s", np.array(start, dtype)), ("l", np.array(limit, dtype)), ("d", np.array(delta, dtype))],
             consts={"s", "l", "d"})


def test_range_needs_known_bounds():
    model, _ = one_node_model("Range", [("s", np.array(0, np.int64)), ("l", np.array(5, np.int64)),
                                        ("d", np.array(1, np.int64))], consts={"s", "d"})
    with pytest.raises(NpuforgeError, match="limit must be known"):
        npuforge.import_onnx(model)


@pytest.mark.parametrize("shape", [(2, 3, 4), (), (5,), (1, 0, 3)])
def test_size(shape):
    check_op("Size", [("x", np.zeros(shape, np.float32))])


EINSUMS = [  # equation, input shapes
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij->ji", [(3, 5)]), ("ij->", [(3, 5)]), ("i,i", [(6,), (6,)]),
    ("i,j->ij", [(3,), (4,)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij,ij->i", [(2, 3), (1, 3)]), ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]), ("...i->...", [(2, 3, 4)]),
    ("b i j , b j -> b i", [(2, 3, 4), (2, 4)]), ("ijk->kji", [(2, 3, 4)]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
@pytest.mark.parametrize("case", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum(dtype, case):
    equation, shapes = case
    rng = rng_for("einsum", equation, dtype.__name__)
    xs = [(f"x{k}", rand(rng, *s) if dtype == np.float32 else ints(rng, *s, lo=-5, hi=5)) for k, s in enumerate(shapes)]
    check_op("Einsum", xs, {"equation": equation})


@pytest.mark.parametrize("equation,shapes", [
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # ellipses of different ranks broadcast
    ("cb,bA", [(2, 3), (3, 4)]),  # implicit output with capitals: in ASCII order, "Ac"
    ("Bi,iB->B", [(3, 2), (2, 3)]),
])
def test_einsum_against_numpy(equation, shapes):
    # cases the ONNX spec (numpy's rules) allows and ONNX Runtime refuses
    rng = rng_for("einsum_numpy", equation)
    xs = [rand(rng, *s) for s in shapes]
    model, feeds = one_node_model("Einsum", [(f"x{k}", x) for k, x in enumerate(xs)], {"equation": equation})
    np.testing.assert_allclose(run_ours(model, feeds)[0], np.einsum(equation, *xs), rtol=1e-5, atol=1e-5)
    assert npuforge.import_onnx(model).values["y0"].shape == np.einsum(equation, *xs).shape


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -2, 5, -6])
def test_trilu(upper, k):
    rng = rng_for("trilu", upper, k)
    for shape in ((4, 5), (2, 3, 3), (2, 1, 5, 2)):
        inputs = [("x", rand(rng, *shape)), ("k", None if k is None else np.array(k, np.int64))]
        check_op("Trilu", inputs, {"upper": upper}, opset=14, consts={"k"})
    check_op("Trilu", [("x", ints(rng, 3, 4))], {"upper": upper}, opset=14)


@pytest.mark.parametrize("k", [0, 1, -1, 3, -5])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT64, TensorProto.FLOAT, TensorProto.INT32])
def test_eyelike(k, dtype):
    rng = rng_for("eyelike", k, dtype)
    attrs = {"k": k, **({} if dtype is None else {"dtype": dtype})}
    check_op("EyeLike", [("x", rand(rng, 3, 5))], attrs)
    check_op("EyeLike", [("x", ints(rng, 4, 2))], attrs)


# -- normalizations and GlobalMaxPool --------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("n_outputs", [1, 3])
def test_layer_normalization(axis, with_bias, n_outputs):
    rng = rng_for("layernorm", axis, with_bias, n_outputs)
    x = rand(rng, 2, 3, 4, 5, lo=-5, hi=5)
    norm_shape = x.shape[axis:]
    # Scale / B may broadcast to the normalized shape
    scale_shape = norm_shape if axis % 2 else (1,) * (len(norm_shape) - 1) + norm_shape[-1:]
    inputs = [("x", x), ("s", rand(rng, *scale_shape)), ("b", rand(rng, *norm_shape) if with_bias else None)]
    check_op("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, n_outputs=n_outputs, opset=17,
             consts={"s", "b"})


def test_layer_normalization_float64_and_scale_as_input():
    rng = rng_for("layernorm64")
    x = rand(rng, 3, 6, dtype=np.float64)
    check_op("LayerNormalization", [("x", x), ("s", rand(rng, 6, dtype=np.float64))], opset=17)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 3), (1, 2, 2, 3, 2)])
def test_instance_normalization(shape):
    rng = rng_for("instnorm", shape)
    c = shape[1]
    check_op("InstanceNormalization", [("x", rand(rng, *shape)), ("s", rand(rng, c)), ("b", rand(rng, c))],
             {"epsilon": 1e-4}, consts={"s", "b"})


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((2, 4, 3, 3), 2), ((1, 4, 2, 3), 4), ((2, 3, 4), 1)])
def test_group_normalization(opset, shape, groups):
    rng = rng_for("groupnorm", opset, shape, groups)
    n = groups if opset < 21 else shape[1]  # opset 18: scale and B per group; 21: per channel
    inputs = [("x", rand(rng, *shape, lo=-4, hi=4)), ("s", rand(rng, n)), ("b", rand(rng, n))]
    check_op("GroupNormalization", inputs, {"num_groups": groups, "epsilon": 1e-4}, opset=opset, consts={"s", "b"})


def test_group_normalization_opset18_needs_constant_scale():
    model, _ = one_node_model("GroupNormalization", [("x", np.ones((1, 4, 3), np.float32)),
                                                     ("s", np.ones(2, np.float32)), ("b", np.ones(2, np.float32))],
                              {"num_groups": 2}, opset=18, consts={"b"})
    with pytest.raises(NpuforgeError, match="must be a constant"):
        npuforge.import_onnx(model)


@pytest.mark.parametrize("size", [1, 3, 5, 7])
def test_lrn(size):
    rng = rng_for("lrn", size)
    attrs = {"size": size} if size != 5 else {"size": size, "alpha": 0.01, "beta": 0.5, "bias": 2.0}
    check_op("LRN", [("x", rand(rng, 2, 6, 3, 4, lo=-5, hi=5))], attrs)


@pytest.mark.parametrize("size,shape", [(4, (2, 5, 4)), (2, (1, 6, 3, 2)), (3, (2, 4, 3))])
def test_lrn_even_sizes_and_rank3_against_the_formula(size, shape):
    # ONNX Runtime only runs odd sizes on 4-D inputs; the spec's window is floor((size-1)/2) channels before
    # and ceil((size-1)/2) after
    rng = rng_for("lrn_formula", size, shape)
    x = rand(rng, *shape)
    model, feeds = one_node_model("LRN", [("x", x)], {"size": size, "alpha": 0.1})
    before = (size - 1) // 2
    pad = np.pad(x * x, [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (x.ndim - 2))
    square_sum = sum(pad[:, k:k + shape[1]] for k in range(size))
    np.testing.assert_allclose(run_ours(model, feeds)[0], x / (1 + 0.1 / size * square_sum) ** 0.75, rtol=1e-5)


@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3], [-1, 0]])
def test_mean_variance_normalization(axes):
    rng = rng_for("mvn", axes)
    check_op("MeanVarianceNormalization", [("x", rand(rng, 2, 3, 4, 2, lo=-2, hi=6))],
             {} if axes is None else {"axes": axes})


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization(p, axis):
    rng = rng_for("lpnorm", p, axis)
    check_op("LpNormalization", [("x", rand(rng, 3, 4, 2))], {"p": p, "axis": axis})


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 6), (1, 2, 3, 4, 5)])
def test_global_max_pool(shape):
    check_op("GlobalMaxPool", [("x", rand(rng_for("gmp", shape), *shape))])


# -- NonMaxSuppression -----------------------------------------------------------------------------

def _nms_boxes(rng, batches, n, center):
    centers = rng.uniform(0, 10, size=(batches, n, 2))
    sizes = rng.uniform(0.5, 4, size=(batches, n, 2))
    if center:
        return np.concatenate([centers, sizes], -1).astype(np.float32)
    lo, hi = centers - sizes / 2, centers + sizes / 2
    boxes = np.concatenate([lo[..., ::-1], hi[..., ::-1]], -1)  # [y1, x1, y2, x2]
    flip = rng.integers(0, 2, size=(batches, n)) == 1  # corners in either order
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    return boxes.astype(np.float32)


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("batches,classes", [(1, 1), (2, 3), (3, 2)])
@pytest.mark.parametrize("limits", ["all", "max_out", "score", "none"])
def test_non_max_suppression(center_point_box, batches, classes, limits):
    rng = rng_for("nms", center_point_box, batches, classes, limits)
    n = 30
    boxes = _nms_boxes(rng, batches, n, center_point_box)
    scores = rng.uniform(0, 1, size=(batches, classes, n)).astype(np.float32)
    scores[..., 5] = scores[..., 6]  # an equal pair: the lower index goes first
    max_out = {"all": 100, "max_out": 4, "score": 20, "none": None}[limits]
    iou = float(rng.uniform(0.1, 0.6))
    inputs = [("b", boxes), ("s", scores), ("m", None if max_out is None else np.array([max_out], np.int64)),
              ("iou", None if max_out is None else np.array([iou], np.float32)),
              ("st", np.array([0.4], np.float32) if limits == "score" else None)]
    model, feeds = one_node_model("NonMaxSuppression", inputs, {"center_point_box": center_point_box},
                                  consts={"m", "iou", "st"})
    ref, ours = run_ort(model, feeds)[0], run_ours(model, feeds)[0]
    np.testing.assert_array_equal(ours, ref)
    assert (len(ref) == 0) == (max_out is None)


# -- values known at import: shape arithmetic folds to static shapes --------------------------------

def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def test_static_shape_arithmetic_imports_with_static_shapes():
    # x [2, 3, 5, 5] flattened, padded to whole rows of 8 and reshaped to [N, ceil(C*H*W / 8), 8]: the target
    # comes from Shape -> Gather -> ReduceProd -> Cast -> Div -> Ceil -> Cast -> Concat; then Mod / Equal / Where
    # on the row count choose a Tile count, and an Expand target.
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("idx0", np.array([0], np.int64)), _const("idx_rest", np.array([1, 2, 3], np.int64)),
        helper.make_node("Gather", ["shape", "idx0"], ["n"], axis=0),
        helper.make_node("Gather", ["shape", "idx_rest"], ["chw"], axis=0),
        helper.make_node("ReduceProd", ["chw"], ["elems"], keepdims=1),
        helper.make_node("Cast", ["elems"], ["elems_f"], to=TensorProto.FLOAT),
        _const("eight_f", np.array([8.0], np.float32)),
        helper.make_node("Div", ["elems_f", "eight_f"], ["rows_f"]),
        helper.make_node("Ceil", ["rows_f"], ["rows_up"]),
        helper.make_node("Cast", ["rows_up"], ["rows"], to=TensorProto.INT64),
        _const("eight", np.array([8], np.int64)),
        helper.make_node("Concat", ["n", "rows", "eight"], ["target"], axis=0),
        helper.make_node("Mul", ["rows", "eight"], ["padded_len"]),
        helper.make_node("Sub", ["padded_len", "elems"], ["tail"]),
        _const("zero", np.array([0], np.int64)),
        helper.make_node("Concat", ["zero", "zero", "zero", "tail"], ["pads"], axis=0),
        helper.make_node("Flatten", ["x"], ["flat"], axis=1),
        helper.make_node("Pad", ["flat", "pads"], ["flat_padded"]),
        helper.make_node("Reshape", ["flat_padded", "target"], ["y"]),
        # 2 tiles along axis 1 when the row count is odd, else 1; then Expand to [2, 1, 1]
        _const("two", np.array([2], np.int64)), _const("one", np.array([1], np.int64)),
        helper.make_node("Mod", ["rows", "two"], ["odd"]),
        helper.make_node("Equal", ["odd", "one"], ["is_odd"]),
        helper.make_node("Where", ["is_odd", "two", "one"], ["times"]),
        helper.make_node("Concat", ["one", "times", "one"], ["reps"], axis=0),
        helper.make_node("Tile", ["y", "reps"], ["tiled"]),
        helper.make_node("Concat", ["two", "one", "one"], ["expand_to"], axis=0),
        helper.make_node("Expand", ["tiled", "expand_to"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 5])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    g = npuforge.import_onnx(model)
    # 75 elements -> 10 rows of 8 (5 padded); 10 is even, so one tile
    assert g.values["y"].shape == (2, 10, 8)
    assert g.values["z"].shape == (2, 10, 8)
    x = rand(rng_for("static_shapes"), 2, 3, 5, 5)
    np.testing.assert_allclose(g.run({"x": x})["z"], run_ort(model, {"x": x})[0], rtol=1e-6)


def test_symbolic_batch_flows_through_expand_where_and_size():
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["x"], ["count"]),
        _const("mask", np.array([False, True])),
        _const("fixed", np.array([7, 3], np.int64)),
        helper.make_node("Where", ["mask", "fixed", "shape"], ["target"]),  # [N, 3]: the symbolic dim picked
        helper.make_node("Where", ["mask", "shape", "fixed"], ["target2"]),  # [7, 3] again, from x's dim 1
        helper.make_node("Expand", ["b", "target"], ["y"]),
        helper.make_node("Expand", ["b", "target2"], ["y2"]),
        _const("axis0", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["count", "axis0"], ["count1"]),
        helper.make_node("Expand", ["one", "count1"], ["y3"]),
        _const("one", np.array([1.0], np.float32)),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
                                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "y2", "y3")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    g = npuforge.import_onnx(model)
    assert g.values["y"].shape == ("N", 3)
    assert g.values["y2"].shape == (7, 3)
    assert g.values["y3"].shape == ("N*3",)
    feeds = {"x": np.zeros((5, 3), np.float32), "b": np.ones((1, 3), np.float32)}
    out = g.run(feeds)
    assert out["y"].shape == (5, 3) and out["y2"].shape == (7, 3) and out["y3"].shape == (15,)


# -- quantization kinds, end to end on the integer simulator ----------------------------------------

def test_quant_kinds_of_the_breadth_ops_run_in_the_integer_simulator():
    from npuforge.ops import get_op
    from npuforge.sim.fake_quant import run_fake_quant
    from npuforge.sim.integer import run_integer

    rng = rng_for("quant")
    nodes = [
        helper.make_node("Erf", ["x"], ["a"]),  # lut
        helper.make_node("Pow", ["a", "two"], ["p"]),  # lut: a one-element constant exponent
        helper.make_node("Max", ["p", "floor"], ["m"]),  # lut: Max(x, constant)
        helper.make_node("DepthToSpace", ["m"], ["d"], blocksize=2),  # passthrough
        helper.make_node("Tile", ["d", "reps"], ["t"]),  # passthrough
        helper.make_node("GlobalMaxPool", ["t"], ["g"]),  # passthrough
        helper.make_node("ReduceMax", ["t", "axes"], ["r"], keepdims=0),  # passthrough
    ]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([0.05], np.float32), "floor"),
             numpy_helper.from_array(np.array([1, 1, 2, 1], np.int64), "reps"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("g", "r")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    g = npuforge.import_onnx(model)
    kinds = {n.op: get_op(n.op).quant_kind(n, g) for n in g.nodes}
    assert kinds == {"Erf": "lut", "Pow": "lut", "Max": "lut", "DepthToSpace": "passthrough",
                     "Tile": "passthrough", "GlobalMaxPool": "passthrough", "ReduceMax": "passthrough"}
    calib = [rand(rng, 1, 8, 4, 4, lo=-2, hi=2) for _ in range(4)]
    q = npuforge.quantize(g, calib, {"strict": True}, optimize=False)
    x = calib[0]
    # the tables and the moved codes give what rounding each value to its grid gives
    fake, sim = run_fake_quant(q, {"x": x}), run_integer(q, {"x": x})
    for name in ("g", "r"):
        step = float(q.values[name].quant.scale)
        assert np.abs(sim[name] - fake[name]).max() <= step * 1.001, name


def test_integer_abs_is_shape_arithmetic_not_a_table():
    from npuforge.ops import get_op

    model, _ = one_node_model("Abs", [("x", np.array([1, -2], np.int64))])
    g = npuforge.import_onnx(model)
    assert get_op("Abs").quant_kind(g.nodes[0], g) == "shape"


# -- coverage -------------------------------------------------------------------------------------

def test_registry_lists_at_least_100_ops():
    from npuforge.ops.registry import all_ops

    ops = all_ops()
    assert len(ops) >= 100
    breadth = """Erf LayerNormalization Expand Equal Where Sqrt ReduceSum Ceil Mod InstanceNormalization ReduceL2 Sin
    Cos CumSum And GatherElements GreaterOrEqual Min Max Abs Neg Exp Log Reciprocal Pow Floor Round Sign Mish Softplus
    Elu Selu Celu ThresholdedRelu GlobalMaxPool ReduceMax ReduceMin ReduceProd ReduceL1 ReduceLogSumExp
    ReduceSumSquare ArgMax ArgMin TopK DepthToSpace SpaceToDepth Tile Range Einsum GatherND ScatterND
    GroupNormalization LRN Not Or Xor Less Greater LessOrEqual NonMaxSuppression""".split()
    assert not set(breadth) - set(ops)
    assert all(op.summary for op in ops.values())
