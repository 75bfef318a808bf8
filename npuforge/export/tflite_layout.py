"""Layout facts the TFLite export shares: 4-D tensors are NHWC in the file, NCHW in the IR."""

from __future__ import annotations

from ..errors import UnsupportedError

NCHW_TO_NHWC = (0, 2, 3, 1)  # file axis k holds IR axis NCHW_TO_NHWC[k]
NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}  # an NCHW axis -> the same axis in NHWC


def file_axis(axis: int, rank: int) -> int:
    """The file's axis of IR axis ``axis`` (any sign) of a rank-``rank`` tensor."""
    axis %= rank
    return NHWC_AXIS[axis] if rank == 4 else axis


def same_order(shape) -> bool:
    """Whether a 4-D tensor's elements come in one order in NCHW and NHWC (C == 1 or H * W == 1)."""
    return shape[1] == 1 or shape[2] * shape[3] == 1


def refuse(node, why: str):
    raise UnsupportedError(f"node '{node.name}' ({node.op}): {why}; it has no int8 TFLite form")
