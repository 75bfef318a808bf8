"""The integer Softmax (quantization kind "softmax"): decided once by the quantizer,
run by the integer simulator.

With ``s_x`` the input's scale and ``s_y`` / ``zp_y`` the output's (calibrated as any
activation), along the op's axis:

1. ``d = q - max(q)``: an integer in ``[-(L - 1), 0]``, L the input's code count;
2. ``e = EXP[d + L - 1]``: a table of ``round(2^16 * exp(s_x * d))``, int32;
3. ``S = sum(e)``, int64;
4. ``y = floor((2 * e * R + S * 2^m) / (2 * S * 2^m)) + zp_y``, saturated: ``e / S / s_y``
   rounded half up, with ``R = round(2^m / s_y)`` for the largest ``m <= 24`` that keeps
   R below 2^31 (an int32, 30 bits or more unless the output step exceeds 2^-6).

Every step is exact integer arithmetic on int64; what rounds is the table (at most
2^-17 of the largest term) and R (at most 2^-25 relative). The zero point of the
input cancels in ``d``. ONNX has no integer Softmax: ONNX Runtime's com.microsoft
QLinearSoftmax builds a float table instead, a peer to agree with within a code.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import NpuforgeError

EXP_BITS = 16
MAX_M = 24


def _output_multiplier(s_y: float) -> tuple[int, int]:
    m = MAX_M
    while m > 0 and round(2.0 ** m / s_y) >= 1 << 31:
        m -= 1
    return int(round(2.0 ** m / s_y)), m


def quantize_integers(graph, node, add) -> None:
    """Store the exp table, R and m of one Softmax node (``add(role, array)``)."""
    xp, yp = graph.values[node.inputs[0]].quant, graph.values[node.outputs[0]].quant
    levels = xp.qmax - xp.qmin + 1
    d = np.arange(-(levels - 1), 1, dtype=np.float64)
    add("exp", np.rint(np.exp(float(xp.scale) * d) * (1 << EXP_BITS)).astype(np.int32))
    n = graph.values[node.inputs[0]].shape[node.attrs["axis"]]
    if isinstance(n, int) and n * (1 << EXP_BITS) * 2 * (1 << (MAX_M + 1)) >= 1 << 62:  # 2 S 2^m < 2^62
        raise NpuforgeError(f"node '{node.name}' (Softmax): an axis of {n} elements is too long for the "
                            f"int64 sum; keep it in float (keep_float)")
    r, m = _output_multiplier(float(yp.scale))
    add("multiplier", np.asarray(r, np.int32))
    add("shift", np.asarray(m, np.int32))


def integer_forward(sim, node, env) -> list:
    q = sim._as_codes(node.inputs[0], env).to(torch.int64)
    axis = node.attrs["axis"]
    table = torch.from_numpy(sim._int(node, "exp").astype(np.int64))
    e = table[q - q.amax(dim=axis, keepdim=True) + (len(table) - 1)]
    total = e.sum(dim=axis, keepdim=True)
    r, m = int(sim._int(node, "multiplier")), int(sim._int(node, "shift"))
    y = torch.div(2 * e * r + (total << m), (2 * total) << m, rounding_mode="floor")
    p = sim._q(node.outputs[0])
    return [sim._store(y + int(p.zero_point), p)]
