"""One module per op family; each op registers itself (see registry.py)."""

from .registry import Op, TensorInfo, all_ops, get_op, register

__all__ = ["Op", "TensorInfo", "all_ops", "get_op", "register"]
