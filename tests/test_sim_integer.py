"""The integer simulator, op by op.

* ``onnx`` rounding: bit for bit against ONNX Runtime's QLinear ops on one-node
  models (QLinearConv, QLinearMatMul, com.microsoft QLinearAdd / QLinearMul /
  QLinearAveragePool / QLinearGlobalAveragePool / QLinearSigmoid, QuantizeLinear,
  DequantizeLinear) with random tensors and parameters.
* ``fixedpoint`` rounding: bit for bit against the deliberately plain NumPy
  int64 reference below (gemmlowp's code, transcribed; loops, no float).
* The exactness proof of float accumulation, and the int64 fallback.
"""

from __future__ import annotations

import platform

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npuforge.ir.graph import Graph, Node, Value
from npuforge.quant.params import QParams, QRANGES
from npuforge.quant.requant import quantize_multiplier
from npuforge.sim.int_ops import (exact_float_dtype, requantize_fixedpoint, requantize_fixedpoint_steps,
                                  requantize_single)
from npuforge.sim.integer import IntegerSimulator, dequantize_output, quantize_input

NP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32}


# -- building one-node quantized graphs and one-node ONNX models ---------------------------------


def qp(dtype, scale, zp, axis=None) -> QParams:
    return QParams(dtype, np.asarray(scale, np.float32), np.asarray(zp, np.int32), axis)


def rand_params(rng, dtype="uint8", lo=0.005, hi=0.05) -> QParams:
    qmin, qmax = QRANGES[dtype]
    return qp(dtype, rng.uniform(lo, hi), rng.integers(qmin, qmax + 1))


def codes(rng, p: QParams, shape) -> np.ndarray:
    return rng.integers(p.qmin, p.qmax + 1, shape).astype(NP[p.dtype])


class G:
    """A one-node quantized graph built by hand: inputs with params, constants with
    integer data, node.quant constants as the quantizer would store them."""

    def __init__(self):
        self.g = Graph("one")

    def input(self, name, shape, p):
        self.g.add_value(Value(name, "float32", tuple(shape), quant=p))
        self.g.inputs.append(name)
        return name

    def const(self, name, data, p=None):
        v = self.g.add_const(name, np.asarray(data))
        v.quant = p
        return name

    def node(self, op, inputs, out_shape, out_p, attrs=None, ints=None):
        self.g.add_value(Value("y", "float32", tuple(out_shape), quant=out_p))
        n = Node("n", op, list(inputs), ["y"], dict(attrs or {}))
        for role, data in (ints or {}).items():
            name = f"n::{role}"
            self.g.add_const(name, np.asarray(data))
            n.quant[role] = name
        self.g.nodes.append(n)
        self.g.outputs = ["y"]
        return self.g


def requant_ints(m, role=""):
    mult, shift = quantize_multiplier(np.atleast_1d(np.asarray(m, np.float64)))
    return {f"multiplier{role}": mult, f"shift{role}": shift}


def ort_run(nodes, inputs, inits, outputs, opsets=(("", 21),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def ort_one(op, feeds: dict, consts: dict, order: list, out_dtype, attrs=None, domain=""):
    """Run one ONNX node; ``order`` lists its input names (feeds or consts) in order."""
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
              for k, v in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    node = helper.make_node(op, order, ["out"], domain=domain, **(attrs or {}))
    out = helper.make_tensor_value_info("out", out_dtype, None)
    opsets = [("", 21)] + ([(domain, 1)] if domain else [])
    sess = ort_run([node], inputs, inits, [out], opsets)
    return sess.run(None, feeds)[0]


def scalars(prefix, p: QParams):
    return {f"{prefix}_scale": np.asarray(p.scale, np.float32), f"{prefix}_zp": np.asarray(p.zero_point, NP[p.dtype])}


def sim(graph, feeds, rounding, accumulate="auto"):
    return IntegerSimulator(graph, rounding, accumulate).run(feeds, dequantize=False)["y"]


# -- the plain NumPy int64 reference of fixedpoint mode ----------------------------------------


def sat32(x):
    return np.clip(x, -(2**31), 2**31 - 1)


def srdhm(a: int, b: int) -> int:
    """gemmlowp SaturatingRoundingDoublingHighMul, int64 and C truncating division."""
    if a == b == -(2**31):
        return 2**31 - 1
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    num = ab + nudge
    q = abs(num) // (1 << 31)
    return q if num >= 0 else -q


def rdbpot(x: int, exponent: int) -> int:
    """gemmlowp RoundingDivideByPOT."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def mbqm(x: int, multiplier: int, shift: int) -> int:
    """TFLite MultiplyByQuantizedMultiplier (int32 saturation where the NPU saturates)."""
    left, right = max(shift, 0), max(-shift, 0)
    x = int(sat32(int(sat32(x)) * (1 << left)))
    return rdbpot(srdhm(x, multiplier), right)


def single(x: int, multiplier: int, shift: int) -> int:
    """TFLite MultiplyByQuantizedMultiplier under TFLITE_SINGLE_ROUNDING (64-bit product, one rounding)."""
    total = 31 - shift
    return (int(sat32(x)) * multiplier + (1 << (total - 1))) >> total


def ref_requant(acc: np.ndarray, mult, shift, axis=None, fn=mbqm) -> np.ndarray:
    out = np.empty(acc.shape, np.int64)
    mult, shift = np.atleast_1d(mult), np.atleast_1d(shift)
    for idx in np.ndindex(*acc.shape):
        c = idx[axis] if (axis is not None and mult.size > 1) else 0
        out[idx] = fn(int(acc[idx]), int(mult[c]), int(shift[c]))
    return out


def ref_conv2d(x, w, bias, zp, strides, pads, dil, group):
    """int64 loops: acc[n, o, i, j] = bias[o] + sum w[o, c, ki, kj] * (x - zp)[n, g*cg + c, ...]."""
    n, cin, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xs = x.astype(np.int64) - zp
    xp = np.zeros((n, cin, h + pads[0] + pads[2], wd + pads[1] + pads[3]), np.int64)
    xp[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = xs
    oh = (xp.shape[2] - (dil[0] * (kh - 1) + 1)) // strides[0] + 1
    ow = (xp.shape[3] - (dil[1] * (kw - 1) + 1)) // strides[1] + 1
    og = o // group
    acc = np.zeros((n, o, oh, ow), np.int64)
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(oh):
                for j in range(ow):
                    s = int(bias[oc]) if bias is not None else 0
                    for c in range(cg):
                        for ki in range(kh):
                            for kj in range(kw):
                                s += int(w[oc, c, ki, kj]) * int(xp[b, g * cg + c, i * strides[0] + ki * dil[0],
                                                                    j * strides[1] + kj * dil[1]])
                    acc[b, oc, i, j] = s
    return acc


def bitlen_bits(max_abs, shift):
    return max(0, min(20, 30 - int(max_abs).bit_length() - max(0, int(shift))))


def max_abs(p):
    return max(int(p.zero_point) - p.qmin, p.qmax - int(p.zero_point))


# -- requantization arithmetic ---------------------------------------------------------------------


def test_requantize_matches_gemmlowp_reference():
    rng = np.random.default_rng(0)
    accs = np.concatenate([rng.integers(-2**31, 2**31, 300), rng.integers(-5000, 5000, 300),
                           [0, 1, -1, 2**31 - 1, -2**31, 2**30, -2**30, 3, -3]]).astype(np.int64)
    for mult, shift in [(2**30, 0), (2**30, -1), (2**31 - 1, -5), (1518500250, -12), (1 << 30, 3),
                        (1395864371, 1), (0, 0), (2**30 + 1, -31), (1073741824, -1)]:
        ours = requantize_fixedpoint(torch.from_numpy(accs), mult, shift).numpy()
        ref = np.array([mbqm(int(a), mult, shift) for a in accs])
        np.testing.assert_array_equal(ours, ref, err_msg=f"M={mult} shift={shift}")
        steps = requantize_fixedpoint_steps(torch.from_numpy(accs), mult, shift).numpy()
        np.testing.assert_array_equal(steps, ref)
        one = requantize_single(torch.from_numpy(accs), mult, shift).numpy()
        np.testing.assert_array_equal(one, [single(int(a), mult, shift) for a in accs])
    # ties: x * M / 2^31 = k + 1/2 -> SRDHM rounds up; RDBPOT rounds half away from zero
    assert mbqm(-3, 2**30, 0) == -1 and mbqm(3, 2**30, 0) == 2
    assert int(requantize_fixedpoint(torch.tensor([-3, 3, -6, 6]), 2**30, -1)[0]) == -1


def test_requantize_per_channel_matches_reference():
    rng = np.random.default_rng(1)
    acc = rng.integers(-2**24, 2**24, (3, 5, 4)).astype(np.int64)
    mult = rng.integers(2**30, 2**31, 5).astype(np.int64)
    shift = rng.integers(-20, 3, 5).astype(np.int64)
    ours = requantize_fixedpoint(torch.from_numpy(acc), torch.from_numpy(mult).reshape(1, 5, 1),
                                 torch.from_numpy(shift).reshape(1, 5, 1)).numpy()
    np.testing.assert_array_equal(ours, ref_requant(acc, mult, shift, axis=1))


# -- QuantizeLinear / DequantizeLinear: the simulator's graph boundary --------------------------------


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16"])
def test_quantize_dequantize_equal_ort(dtype):
    rng = np.random.default_rng(2)
    p = rand_params(rng, dtype, 0.001, 0.1)
    x = (rng.standard_normal((4, 50)) * 200 * float(p.scale)).astype(np.float32)
    x[0, :6] = (np.arange(6) + 0.5 + int(p.zero_point) * 0) * p.scale  # exact ties
    consts = {"s": np.asarray(p.scale, np.float32), "z": np.asarray(p.zero_point, NP[dtype])}
    ref = ort_one("QuantizeLinear", {"x": x}, consts, ["x", "s", "z"], helper.np_dtype_to_tensor_dtype(np.dtype(NP[dtype])))
    q = quantize_input(x, p)
    np.testing.assert_array_equal(q, ref)
    back = ort_one("DequantizeLinear", {"q": q}, consts, ["q", "s", "z"], TensorProto.FLOAT)
    np.testing.assert_array_equal(dequantize_output(q, p), back)


# -- Conv ----------------------------------------------------------------------------------------------


def conv_case(rng, n=2, cin=6, cout=4, hw=(9, 8), k=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), dil=(1, 1),
              group=1, wmax=127, act="", act_params=()):
    xp_ = rand_params(rng, "uint8", 0.01, 0.05)
    yp = rand_params(rng, "uint8", 0.02, 0.2)
    wscale = rng.uniform(0.001, 0.01, cout).astype(np.float32)
    wq = rng.integers(-wmax, wmax + 1, (cout, cin // group, *k)).astype(np.int8)
    bias = rng.integers(-3000, 3000, cout).astype(np.int32)
    x = codes(rng, xp_, (n, cin, *hw))
    b = G()
    b.input("x", x.shape, xp_)
    wp = QParams("int8", wscale, np.zeros(cout, np.int32), 0)
    b.const("w", wq.astype(np.float32) * wscale[:, None, None, None], wp)
    bscale = (np.float64(xp_.scale) * wscale.astype(np.float64)).astype(np.float32)
    b.const("b", bias.astype(np.float32) * bscale, QParams("int32", bscale, np.zeros(cout, np.int32), 0))
    m = np.float64(xp_.scale) * wscale.astype(np.float64) / np.float64(yp.scale)
    attrs = {"dilations": list(dil), "group": group, "kernel_shape": list(k), "pads": list(pads),
             "strides": list(strides), "activation": act, "activation_params": list(act_params)}
    out_hw = [(hw[i] + pads[i] + pads[i + 2] - (dil[i] * (k[i] - 1) + 1)) // strides[i] + 1 for i in range(2)]
    g = b.node("Conv", ["x", "w", "b"], (n, cout, *out_hw), yp, attrs,
               {"weight": wq, "bias": bias, **requant_ints(m)})
    return g, x, wq, bias, xp_, wp, yp, attrs


CONV_CASES = [
    {},
    {"strides": (2, 2), "pads": (0, 0, 1, 1)},
    {"group": 6, "cin": 6, "cout": 6, "k": (3, 3)},
    {"k": (1, 1), "pads": (0, 0, 0, 0), "cin": 16, "cout": 8},
    {"dil": (2, 2), "pads": (2, 1, 2, 1), "k": (3, 2)},
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_onnx_mode_equals_ort_qlinearconv(case):
    rng = np.random.default_rng(10 + case)
    # |w| <= 64 keeps ORT's u8s8 pair sums (2 * 255 * 64 < 2^15) clear of the int16
    # saturation of its AVX2 kernel (see test_ort_u8s8_saturation_is_what_the_cpu_documents)
    g, x, wq, bias, xp_, wp, yp, attrs = conv_case(rng, wmax=64, **CONV_CASES[case])
    consts = {**scalars("x", xp_), "w": wq, "w_scale": wp.scale, "w_zp": np.zeros(len(wp.scale), np.int8),
              **scalars("y", yp), "B": bias}
    ref = ort_one("QLinearConv", {"x": x}, consts,
                  ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "B"], TensorProto.UINT8,
                  {k: v for k, v in attrs.items() if not k.startswith("activation")})
    np.testing.assert_array_equal(sim(g, {"x": x}, "onnx"), ref)


@pytest.mark.parametrize("mode", ["fixedpoint", "single"])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_fixedpoint_equals_reference(case, mode):
    rng = np.random.default_rng(20 + case)
    fn = mbqm if mode == "fixedpoint" else single
    g, x, wq, bias, xp_, wp, yp, attrs = conv_case(rng, **CONV_CASES[case])
    node = g.nodes[0]
    acc = ref_conv2d(x, wq, bias, int(xp_.zero_point), attrs["strides"], attrs["pads"], attrs["dilations"],
                     attrs["group"])
    mult, shift = g.values[node.quant["multiplier"]].data, g.values[node.quant["shift"]].data
    ref = np.clip(ref_requant(acc, mult, shift, axis=1, fn=fn) + int(yp.zero_point), 0, 255)
    np.testing.assert_array_equal(sim(g, {"x": x}, mode), ref)
    np.testing.assert_array_equal(sim(g, {"x": x}, mode, accumulate="int64"), ref)


@pytest.mark.parametrize("act,params", [("Relu", ()), ("Clip", (0.0, 6.0)), ("Clip", (-0.5, 0.7)),
                                        ("LeakyRelu", (0.1,))])
def test_conv_fused_activation_bounds(act, params):
    rng = np.random.default_rng(30)
    g, x, wq, bias, xp_, wp, yp, attrs = conv_case(rng, act=act, act_params=params)
    node = g.nodes[0]
    acc = ref_conv2d(x, wq, bias, int(xp_.zero_point), attrs["strides"], attrs["pads"], attrs["dilations"], 1)
    mult, shift = g.values[node.quant["multiplier"]].data, g.values[node.quant["shift"]].data
    zp, s = int(yp.zero_point), np.float32(yp.scale)
    if act == "LeakyRelu":  # negative accumulators use the derived multiplier for alpha * m
        from npuforge.quant.requant import multiplier_value

        mn, sn = quantize_multiplier(params[0] * multiplier_value(mult, shift))
        y = np.where(acc < 0, ref_requant(acc, mn, sn, axis=1), ref_requant(acc, mult, shift, axis=1))
        np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), np.clip(y + zp, 0, 255))
        return
    lo, hi = (zp, 255) if act == "Relu" else (zp + int(np.rint(np.float32(params[0]) / s)),
                                              zp + int(np.rint(np.float32(params[1]) / s)))
    ref = np.clip(ref_requant(acc, mult, shift, axis=1) + zp, max(lo, 0), min(hi, 255))
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), ref)


def test_ort_u8s8_saturation_is_what_the_cpu_documents():
    """Full-range int8 weights, inputs in [200, 255]: ORT's QLinearConv u8s8 kernel
    depends on the CPU. With VNNI (vpdpbusd) it accumulates in int32 and is exact;
    without (AVX2 / AVX-512BW vpmaddubsw) it adds pairs of products in saturating
    int16 and differs (67.6 % of outputs on an AVX2 machine, docs/simulator.md). The
    simulator computes the exact sum on every CPU."""
    from npuforge.workflow import cpu_lacks_vnni

    rng = np.random.default_rng(40)
    g, x, wq, bias, xp_, wp, yp, attrs = conv_case(rng, cin=32, cout=8, k=(1, 1), pads=(0, 0, 0, 0), wmax=127)
    x[:] = rng.integers(200, 256, x.shape)
    consts = {**scalars("x", xp_), "w": wq, "w_scale": wp.scale, "w_zp": np.zeros(len(wp.scale), np.int8),
              **scalars("y", yp), "B": bias}
    ref = ort_one("QLinearConv", {"x": x}, consts,
                  ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "B"], TensorProto.UINT8,
                  {k: v for k, v in attrs.items() if not k.startswith("activation")})
    ours = sim(g, {"x": x}, "onnx")
    exact = sim(g, {"x": x}, "onnx", accumulate="int64")
    np.testing.assert_array_equal(ours, exact)
    differ = float((ours != ref).mean())
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    kind = "not x86" if not x86 else "x86 without VNNI" if cpu_lacks_vnni() else "x86 with VNNI"
    print(f"ORT QLinearConv u8s8 full-range weights on this CPU ({kind}): {100 * differ:.2f}% of outputs "
          f"differ from exact")
    if x86 and cpu_lacks_vnni():
        assert differ > 0.1  # the int16 pair saturation, as documented
    elif x86:
        assert differ == 0.0  # VNNI's int32 dot products are exact


# -- MatMul ----------------------------------------------------------------------------------------------


def test_matmul_onnx_mode_equals_ort_qlinearmatmul():
    rng = np.random.default_rng(50)
    ap, bp, yp = rand_params(rng), rand_params(rng), rand_params(rng, "uint8", 0.5, 2.0)
    a, bm = codes(rng, ap, (3, 5, 24)), codes(rng, bp, (3, 24, 7))
    b = G()
    b.input("a", a.shape, ap)
    b.input("b", bm.shape, bp)
    g = b.node("MatMul", ["a", "b"], (3, 5, 7), yp, {},
               requant_ints(np.float64(ap.scale) * np.float64(bp.scale) / np.float64(yp.scale)))
    consts = {**scalars("a", ap), **scalars("b", bp), **scalars("y", yp)}
    ref = ort_one("QLinearMatMul", {"a": a, "b": bm}, consts,
                  ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], TensorProto.UINT8)
    np.testing.assert_array_equal(sim(g, {"a": a, "b": bm}, "onnx"), ref)
    # fixedpoint against the reference
    acc = np.matmul(a.astype(np.int64) - int(ap.zero_point), bm.astype(np.int64) - int(bp.zero_point))
    n = g.nodes[0]
    ref_fp = np.clip(ref_requant(acc, g.values[n.quant["multiplier"]].data, g.values[n.quant["shift"]].data)
                     + int(yp.zero_point), 0, 255)
    np.testing.assert_array_equal(sim(g, {"a": a, "b": bm}, "fixedpoint"), ref_fp)


def test_gemm_fixedpoint_equals_reference():
    rng = np.random.default_rng(51)
    xp_, yp = rand_params(rng), rand_params(rng, "uint8", 0.05, 0.3)
    wscale = rng.uniform(0.001, 0.01, 10).astype(np.float32)
    wq = rng.integers(-127, 128, (10, 40)).astype(np.int8)  # transB: [N, K]
    bias = rng.integers(-5000, 5000, 10).astype(np.int32)
    x = codes(rng, xp_, (6, 40))
    b = G()
    b.input("x", x.shape, xp_)
    b.const("w", wq.astype(np.float32), QParams("int8", wscale, np.zeros(10, np.int32), 0))
    b.const("bias", bias.astype(np.float32))
    m = np.float64(xp_.scale) * wscale.astype(np.float64) / np.float64(yp.scale)
    g = b.node("Gemm", ["x", "w", "bias"], (6, 10), yp,
               {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1, "activation": "", "activation_params": []},
               {"weight": wq, "bias": bias, **requant_ints(m)})
    acc = (x.astype(np.int64) - int(xp_.zero_point)) @ wq.T.astype(np.int64) + bias
    n = g.nodes[0]
    ref = np.clip(ref_requant(acc, g.values[n.quant["multiplier"]].data, g.values[n.quant["shift"]].data, axis=1)
                  + int(yp.zero_point), 0, 255)
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), ref)
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint", accumulate="int64"), ref)


# -- Add / Mul ---------------------------------------------------------------------------------------------


def binary_case(rng, op, shapes=((2, 3, 4, 5), (2, 3, 4, 5))):
    ap, bp = rand_params(rng, "uint8", 0.01, 0.1), rand_params(rng, "uint8", 0.01, 0.1)
    yp = rand_params(rng, "uint8", 0.02, 0.15) if op != "Mul" else rand_params(rng, "uint8", 0.01, 0.05)
    a, bm = codes(rng, ap, shapes[0]), codes(rng, bp, shapes[1])
    b = G()
    b.input("a", a.shape, ap)
    b.input("b", bm.shape, bp)
    if op == "Mul":
        ints = requant_ints(np.float64(ap.scale) * np.float64(bp.scale) / np.float64(yp.scale))
    else:
        ints = {**requant_ints(np.float64(ap.scale) / np.float64(yp.scale), "0"),
                **requant_ints(np.float64(bp.scale) / np.float64(yp.scale), "1")}
    out_shape = np.broadcast_shapes(a.shape, bm.shape)
    return b.node(op, ["a", "b"], out_shape, yp, {}, ints), a, bm, ap, bp, yp


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_add_mul_onnx_mode_equal_ort(op, seed):
    rng = np.random.default_rng(60 + seed)
    shapes = ((2, 3, 4, 5), (2, 3, 4, 5)) if seed != 2 else ((2, 3, 4, 5), (1, 3, 1, 1))
    g, a, bm, ap, bp, yp = binary_case(rng, op, shapes)
    consts = {**scalars("a", ap), **scalars("b", bp), **scalars("y", yp)}
    ref = ort_one(f"QLinear{op}", {"a": a, "b": bm}, consts,
                  ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp", "y_scale", "y_zp"], TensorProto.UINT8,
                  domain="com.microsoft")
    np.testing.assert_array_equal(sim(g, {"a": a, "b": bm}, "onnx"), ref)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_add_sub_mul_fixedpoint_equal_reference(op):
    rng = np.random.default_rng(70)
    g, a, bm, ap, bp, yp = binary_case(rng, op, ((2, 3, 4, 5), (1, 3, 1, 5)))
    n = g.nodes[0]
    ints = {r: int(np.asarray(g.values[c].data).reshape(-1)[0]) for r, c in n.quant.items()}
    xa = (a.astype(np.int64) - int(ap.zero_point))
    xb = (bm.astype(np.int64) - int(bp.zero_point))
    xa, xb = np.broadcast_arrays(xa, xb)
    out = np.empty(xa.shape, np.int64)
    for idx in np.ndindex(*xa.shape):
        if op == "Mul":
            v = mbqm(int(xa[idx] * xb[idx]), ints["multiplier"], ints["shift"])
        else:
            bits = min(bitlen_bits(max_abs(ap), ints["shift0"]), bitlen_bits(max_abs(bp), ints["shift1"]))
            t0 = mbqm(int(xa[idx]) << bits, ints["multiplier0"], ints["shift0"])
            t1 = mbqm(int(xb[idx]) << bits, ints["multiplier1"], ints["shift1"])
            v = rdbpot(t0 + t1 if op == "Add" else t0 - t1, bits)
        out[idx] = min(255, max(0, v + int(yp.zero_point)))
    np.testing.assert_array_equal(sim(g, {"a": a, "b": bm}, "fixedpoint"), out)


def test_add_constant_operand():
    """A constant operand is read from node.quant['input1'] (its own parameters)."""
    rng = np.random.default_rng(71)
    ap, cp, yp = rand_params(rng), rand_params(rng), rand_params(rng, "uint8", 0.05, 0.1)
    a = codes(rng, ap, (2, 4))
    c = codes(rng, cp, (4,))
    b = G()
    b.input("a", a.shape, ap)
    b.const("c", cp.dequantize(c), cp)
    g = b.node("Add", ["a", "c"], (2, 4), yp, {},
               {"input1": c, **requant_ints(np.float64(ap.scale) / np.float64(yp.scale), "0"),
                **requant_ints(np.float64(cp.scale) / np.float64(yp.scale), "1")})
    b2 = G()
    b2.input("a", a.shape, ap)
    b2.input("c", (2, 4), cp)
    g2 = b2.node("Add", ["a", "c"], (2, 4), yp, {}, {r: g.values[n].data for r, n in g.nodes[0].quant.items()
                                                     if r != "input1"})
    full = np.broadcast_to(c, (2, 4)).copy()
    np.testing.assert_array_equal(sim(g, {"a": a}, "fixedpoint"), sim(g2, {"a": a, "c": full}, "fixedpoint"))


# -- pooling ------------------------------------------------------------------------------------------------


def pool_case(rng, op, shape=(2, 3, 7, 7), attrs=None):
    xp_, yp = rand_params(rng), rand_params(rng, "uint8", 0.005, 0.04)
    x = codes(rng, xp_, shape)
    b = G()
    b.input("x", shape, xp_)
    if op == "GlobalAveragePool":
        out = (*shape[:2], 1, 1)
    else:
        a = attrs
        out = (*shape[:2], *[(shape[2 + i] + a["pads"][i] + a["pads"][i + 2] - a["kernel_shape"][i])
                             // a["strides"][i] + 1 for i in range(2)])
    g = b.node(op, ["x"], out, yp, attrs or {}, requant_ints(np.float64(xp_.scale) / np.float64(yp.scale)))
    return g, x, xp_, yp


POOLS = [
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "count_include_pad": 0},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 0, 0, 0], "count_include_pad": 0},
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_average_pool_onnx_mode_equals_ort(case):
    rng = np.random.default_rng(80 + case)
    attrs = {**POOLS[case], "ceil_mode": 0, "dilations": [1, 1]}
    g, x, xp_, yp = pool_case(rng, "AveragePool", attrs=attrs)
    consts = {**scalars("x", xp_), **scalars("y", yp)}
    ort_attrs = {k: v for k, v in attrs.items() if k != "dilations"}
    ref = ort_one("QLinearAveragePool", {"x": x}, consts, ["x", "x_scale", "x_zp", "y_scale", "y_zp"],
                  TensorProto.UINT8, ort_attrs, domain="com.microsoft")
    np.testing.assert_array_equal(sim(g, {"x": x}, "onnx"), ref)


@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 16, 5, 9)])
def test_global_average_pool_onnx_mode_equals_ort(shape):
    rng = np.random.default_rng(90 + shape[1])
    g, x, xp_, yp = pool_case(rng, "GlobalAveragePool", shape)
    consts = {**scalars("x", xp_), **scalars("y", yp)}
    ref = ort_one("QLinearGlobalAveragePool", {"x": x}, consts, ["x", "x_scale", "x_zp", "y_scale", "y_zp"],
                  TensorProto.UINT8, {"channels_last": 0}, domain="com.microsoft")
    np.testing.assert_array_equal(sim(g, {"x": x}, "onnx"), ref)


def ref_pool_fixedpoint(sums, counts, xp_, yp, mult, shift):
    out = np.empty(sums.shape, np.int64)
    counts = np.broadcast_to(counts, sums.shape)
    for idx in np.ndindex(*sums.shape):
        bits = bitlen_bits(int(counts.max()) * max_abs(xp_), shift)
        t = mbqm(int(sums[idx]) << bits, mult, shift)
        d = int(counts[idx]) << bits
        q = (2 * abs(t) + d) // (2 * d)
        out[idx] = min(255, max(0, (q if t >= 0 else -q) + int(yp.zero_point)))
    return out


def test_pools_fixedpoint_equal_reference():
    rng = np.random.default_rng(95)
    g, x, xp_, yp = pool_case(rng, "GlobalAveragePool", (2, 4, 7, 7))
    n = g.nodes[0]
    m, s = int(g.values[n.quant["multiplier"]].data[0]), int(g.values[n.quant["shift"]].data[0])
    xs = x.astype(np.int64) - int(xp_.zero_point)
    sums = xs.sum(axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), ref_pool_fixedpoint(sums, np.array(49), xp_, yp, m, s))
    attrs = {**POOLS[1], "ceil_mode": 0, "dilations": [1, 1]}
    g, x, xp_, yp = pool_case(rng, "AveragePool", (1, 2, 6, 6), attrs)
    n = g.nodes[0]
    m, s = int(g.values[n.quant["multiplier"]].data[0]), int(g.values[n.quant["shift"]].data[0])
    xs = np.pad(x.astype(np.int64) - int(xp_.zero_point), ((0, 0), (0, 0), (1, 1), (1, 1)))
    sums = np.zeros((1, 2, 3, 3), np.int64)
    for i in range(3):
        for j in range(3):
            sums[:, :, i, j] = xs[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].sum(axis=(2, 3))
    counts = np.full((1, 1, 3, 3), 9)  # count_include_pad: every window counts 9 cells
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), ref_pool_fixedpoint(sums, counts, xp_, yp, m, s))


# -- lookup tables ------------------------------------------------------------------------------------------


def test_sigmoid_lut():
    rng = np.random.default_rng(100)
    xp_ = qp("uint8", 0.06, 130)
    yp = qp("uint8", 1.0 / 256, 0)
    x = np.arange(256, dtype=np.uint8).reshape(1, 256)
    table = yp.quantize(torch.sigmoid(torch.from_numpy(xp_.dequantize(np.arange(256)))).numpy())
    b = G()
    b.input("x", x.shape, xp_)
    g = b.node("Sigmoid", ["x"], x.shape, yp, {}, {"lut": table})
    np.testing.assert_array_equal(sim(g, {"x": x}, "fixedpoint"), table.reshape(1, 256))
    consts = {**scalars("x", xp_), **scalars("y", yp)}
    ref = ort_one("QLinearSigmoid", {"x": x}, consts, ["x", "x_scale", "x_zp", "y_scale", "y_zp"],
                  TensorProto.UINT8, domain="com.microsoft")
    np.testing.assert_array_equal(sim(g, {"x": x}, "onnx"), ref)
    for _ in range(6):
        xp2, yp2 = rand_params(rng, "uint8", 0.01, 0.1), qp("uint8", rng.uniform(0.002, 0.005), rng.integers(0, 20))
        b = G()
        b.input("x", x.shape, xp2)
        g = b.node("Sigmoid", ["x"], x.shape, yp2, {}, {"lut": table})
        ref = ort_one("QLinearSigmoid", {"x": x}, {**scalars("x", xp2), **scalars("y", yp2)},
                      ["x", "x_scale", "x_zp", "y_scale", "y_zp"], TensorProto.UINT8, domain="com.microsoft")
        np.testing.assert_array_equal(sim(g, {"x": x}, "onnx"), ref)


# -- exactness of float accumulation -------------------------------------------------------------------------


def test_exact_float_dtype_bounds():
    assert exact_float_dtype(2**24) == torch.float32
    assert exact_float_dtype(2**24 + 1) == torch.float64
    assert exact_float_dtype(2**53) == torch.float64
    assert exact_float_dtype(2**53 + 1) is None
    # the bound is tight: above 2^24 float32 loses integers
    assert np.float32(2**24 + 1) == np.float32(2**24)


def test_accumulation_kernel_choice_follows_the_proof():
    """A conv whose per-channel bound sum|w| * max|x - zp| crosses 2^24 moves to float64,
    one beyond 2^53 would move to int64; all give the int64 result."""
    rng = np.random.default_rng(110)
    # 1x1 conv over 1100 channels, |w| = 127, x - zp up to 128 (zp 127): 1100*127*128 > 2^24
    g, x, wq, bias, xp_, wp, yp, attrs = conv_case(rng, n=1, cin=1100, cout=2, hw=(2, 2), k=(1, 1),
                                                   pads=(0, 0, 0, 0))
    g.values["x"].quant = qp("uint8", 0.01, 127)
    g.nodes[0].quant  # weight codes: all +-127 so the bound is reached
    wfull = np.where(rng.random(wq.shape) < 0.5, -127, 127).astype(np.int8)
    g.values[g.nodes[0].quant["weight"]].data = wfull
    x = np.full(x.shape, 255, np.uint8)
    s = IntegerSimulator(g, "fixedpoint")
    auto = s.run({"x": x}, dequantize=False)["y"]
    assert s.kernels["n"] == "float64"
    exact = IntegerSimulator(g, "fixedpoint", "int64").run({"x": x}, dequantize=False)["y"]
    np.testing.assert_array_equal(auto, exact)
    g2, x2, *_ = conv_case(rng, cin=8)
    s2 = IntegerSimulator(g2, "fixedpoint")
    s2.run({"x": x2})
    assert s2.kernels["n"] == "float32"


def test_float_input_is_quantized_and_output_dequantized():
    rng = np.random.default_rng(120)
    g, x, *_ = conv_case(rng)
    xf = g.values["x"].quant.dequantize(x)
    a = IntegerSimulator(g, "fixedpoint").run({"x": xf})["y"]
    q = IntegerSimulator(g, "fixedpoint").run({"x": x}, dequantize=False)["y"]
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, g.values["y"].quant.dequantize(q))


def test_errors():
    from npuforge.errors import NpuforgeError

    rng = np.random.default_rng(130)
    g, x, *_ = conv_case(rng)
    with pytest.raises(NpuforgeError, match="rounding mode"):
        IntegerSimulator(g, "nearest")
    plain = Graph("float")
    plain.add_value(Value("x", "float32", (1,)))
    with pytest.raises(NpuforgeError, match="not quantized"):
        IntegerSimulator(plain)


def test_cli_run_modes(tmp_path, capsys):
    import npuforge
    from npuforge.cli import main

    rng = np.random.default_rng(140)
    g, x, *_ = conv_case(rng)
    npuforge.save(g, tmp_path / "q.nfir")
    xf = g.values["x"].quant.dequantize(x)
    np.save(tmp_path / "x.npy", xf)
    np.save(tmp_path / "xq.npy", x)
    assert main(["run", str(tmp_path / "q.nfir"), "--input", f"x={tmp_path / 'x.npy'}", "--mode", "int",
                 "--output", str(tmp_path / "int.npz")]) == 0
    assert main(["run", str(tmp_path / "q.nfir"), "--input", str(tmp_path / "xq.npy"), "--mode", "int", "--codes",
                 "--rounding", "onnx", "--output", str(tmp_path / "codes.npz")]) == 0
    assert main(["run", str(tmp_path / "q.nfir"), "--input", str(tmp_path / "x.npy"), "--mode", "fake",
                 "--output", str(tmp_path / "fake.npz")]) == 0
    got = np.load(tmp_path / "int.npz")["y"]
    np.testing.assert_array_equal(got, IntegerSimulator(g).run({"x": xf})["y"])
    codes_ = np.load(tmp_path / "codes.npz")["y"]
    assert codes_.dtype == np.uint8
    np.testing.assert_array_equal(codes_, IntegerSimulator(g, "onnx").run({"x": x}, dequantize=False)["y"])
    fake = np.load(tmp_path / "fake.npz")["y"]
    assert np.abs(fake - got).max() <= 2 * float(g.values["y"].quant.scale)


def test_passthrough_concat_and_a_node_kept_in_float():
    """MaxPool and Concat move codes (shared parameters); a node without a quantization
    rule (Softmax) runs in float on dequantized inputs; ReduceMean divides by its count."""
    from npuforge.ops.registry import get_op

    rng = np.random.default_rng(150)
    p = rand_params(rng, "int8")
    yp = rand_params(rng, "int8", 0.01, 0.02)
    x = codes(rng, p, (2, 3, 6, 6))
    g = Graph("chain")
    g.add_value(Value("x", "float32", x.shape, quant=p))
    g.inputs = ["x"]
    g.add_value(Value("m", "float32", (2, 3, 3, 3), quant=p))
    g.add_value(Value("c", "float32", (2, 6, 3, 3), quant=p))
    g.add_value(Value("r", "float32", (2, 6, 1, 1), quant=yp))
    g.add_value(Value("s", "float32", (2, 6, 3, 3)))
    g.add_const("axes", np.array([2, 3], np.int64))
    pool = {"ceil_mode": 0, "dilations": [1, 1], "kernel_shape": [2, 2], "pads": [0, 0, 0, 0], "strides": [2, 2],
            "storage_order": 0}
    g.nodes = [Node("pool", "MaxPool", ["x"], ["m"], pool),
               Node("cat", "Concat", ["m", "m"], ["c"], {"axis": 1}),
               Node("mean", "ReduceMean", ["c", "axes"], ["r"], {"keepdims": 1, "noop_with_empty_axes": 0}),
               Node("soft", "Softmax", ["c"], ["s"], {"axis": 1})]
    mult, shift = quantize_multiplier(np.array([np.float64(p.scale) / np.float64(yp.scale)]))
    for role, data in (("multiplier", mult), ("shift", shift)):
        g.add_const(f"mean::{role}", data)
        g.nodes[2].quant[role] = f"mean::{role}"
    g.outputs = ["c", "r", "s"]
    out = IntegerSimulator(g).run({"x": x}, dequantize=False)
    m = x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(out["c"], np.concatenate([m, m], axis=1))
    assert out["c"].dtype == np.int8
    soft = get_op("Softmax").forward(g.nodes[3], [torch.from_numpy(p.dequantize(out["c"]))])[0].numpy()
    np.testing.assert_array_equal(out["s"], soft)
    sums = (out["c"].astype(np.int64) - int(p.zero_point)).sum(axis=(2, 3), keepdims=True)
    np.testing.assert_array_equal(out["r"], _ref_int8_pool(sums, p, yp, int(mult[0]), int(shift[0])))


def _ref_int8_pool(sums, xp_, yp, mult, shift):
    out = np.empty(sums.shape, np.int64)
    for idx in np.ndindex(*sums.shape):
        bits = bitlen_bits(9 * max_abs(xp_), shift)
        t = mbqm(int(sums[idx]) << bits, mult, shift)
        d = 9 << bits
        q = (2 * abs(t) + d) // (2 * d)
        out[idx] = min(127, max(-128, (q if t >= 0 else -q) + int(yp.zero_point)))
    return out
