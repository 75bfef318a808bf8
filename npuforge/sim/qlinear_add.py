"""Proving ONNX Runtime's ``QLinearAdd`` equal to an integer Add of two uint8 activations.

An Add of two 8-bit activations has 256 x 256 possible operand pairs, so its whole
behaviour is a table, which the plain simulator fills (npuforge's two-multiplier
fixed-point Add, TFLite's three-multiplier ADD or ONNX Runtime's own rule). MLAS's
x86 kernel for com.microsoft ``QLinearAdd`` computes, on the raw codes ``a`` and
``b`` of two same-shaped inputs, ``rne(fma(a, rA, fma(b, rB, F)))`` in float32, with
``rA = sA / sC``, ``rB = sB / sC`` and ``F = zC - (rA * zA + rB * zB)``: so with
``sC = 1`` the two ratios are free float32 parameters. :func:`fit` searches the
float32 values next to the rule's real ratios for a pair whose result equals the
table on every pair of codes (evaluated here in NumPy, as that kernel does), then
runs ONNX Runtime's own kernel once on all 65,536 pairs and keeps the pair only
if that equals the table too: a proof on this machine's kernel, not a sample of it.

Same-shaped inputs only: with a broadcast operand MLAS folds it into ``F`` first
and rounds differently. Fitted once per process for each distinct table
(a mixed-precision search builds the same Adds many times).
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from ..errors import UnsupportedError

NUDGES = 8  # float32 ulps tried on each side of each ratio
_FITTED: dict = {}  # digest of (table, zero points, ratios) -> (rA, rB) or None


def _mlas(ra: np.float32, rb: np.float32, za: int, zb: int, zc: int) -> np.ndarray:
    """MLAS's QLinearAdd (x86, same-shaped inputs) on every pair of uint8 codes -> [256, 256]
    (row: a's code). Each fma is one rounding: exact in float64, then rounded to float32."""
    f64, f32 = np.float64, np.float32
    fixed = f32(f64(zc) - f32(f64(ra) * za + f64(f32(rb * f32(zb)))))
    codes = np.arange(256, dtype=f64)
    inner = (codes * f64(rb) + f64(fixed)).astype(f32)  # fma(b, rB, F)
    out = (codes[:, None] * f64(ra) + inner[None, :].astype(f64)).astype(f32)  # fma(a, rA, inner)
    return np.clip(np.rint(out), 0, 255).astype(np.int64)


def _nudged(r: np.float32, ulps: int) -> np.float32:
    step = np.float32(np.inf if ulps > 0 else -np.inf)
    for _ in range(abs(ulps)):
        r = np.nextafter(r, step)
    return r


def fit(table: np.ndarray, za: int, zb: int, zc: int, ka: float, kb: float):
    """(rA, rB) float32 with which ``QLinearAdd(a, rA, za, b, rB, zb, 1, zc)`` equals
    ``table`` ([256, 256] output codes, row a's code) on every pair, or None. ``ka``, ``kb``:
    the rule's real ratios of the operand scales to the output's (the search's centre)."""
    table = np.ascontiguousarray(table, np.int64)
    key = hashlib.sha256(table.tobytes() + repr((za, zb, zc, float(ka), float(kb))).encode()).hexdigest()
    if key not in _FITTED:
        if len(_FITTED) >= 1024:
            _FITTED.clear()
        _FITTED[key] = _search(table, za, zb, zc, np.float32(ka), np.float32(kb))
    return _FITTED[key]


def _search(table, za, zb, zc, ka, kb):
    if not (np.isfinite(ka) and np.isfinite(kb) and ka > 0 and kb > 0):
        return None
    steps = sorted(((da, db) for da in range(-NUDGES, NUDGES + 1) for db in range(-NUDGES, NUDGES + 1)),
                   key=lambda d: (abs(d[0]) + abs(d[1]), d))
    for da, db in steps:
        ra, rb = _nudged(ka, da), _nudged(kb, db)
        if np.array_equal(_mlas(ra, rb, za, zb, zc), table):
            try:
                return (ra, rb) if np.array_equal(_ort_grid(float(ra), float(rb), za, zb, zc), table) else None
            except UnsupportedError:  # an ONNX Runtime without the kernel: the Add keeps its table
                return None
    return None


@functools.lru_cache(maxsize=256)
def _ort_grid(ra: float, rb: float, za: int, zb: int, zc: int) -> np.ndarray:
    """ONNX Runtime's QLinearAdd on all 65,536 pairs of codes, as one [1, 1, 256, 256] Add."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from .lowered import _session

    params = {"sa": np.float32(ra), "za": np.uint8(za), "sb": np.float32(rb), "zb": np.uint8(zb),
              "sc": np.float32(1), "zc": np.uint8(zc)}
    shape = [1, 1, 256, 256]
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                            domain="com.microsoft")
    graph = helper.make_graph([node], "qlinear_add_proof",
                              [helper.make_tensor_value_info(n, TensorProto.UINT8, shape) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = _session(model, options)
    codes = np.arange(256, dtype=np.uint8)
    a = np.ascontiguousarray(np.broadcast_to(codes[:, None], (256, 256))).reshape(shape)
    b = np.ascontiguousarray(np.broadcast_to(codes[None, :], (256, 256))).reshape(shape)
    return session.run(None, {"a": a, "b": b})[0].reshape(256, 256).astype(np.int64)
