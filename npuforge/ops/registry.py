"""The op registry: one class per op, holding everything npuforge knows about it.

An op class gives, side by side:

* ``attrs``: the attributes it accepts, with their defaults (``REQUIRED`` where
  ONNX has no default). Import fills every default so the IR is explicit.
* ``from_onnx``: how an ONNX node of opsets 13..21 becomes an IR node (attribute
  validation, auto_pad resolution, older-opset spellings). The default copies
  the attributes.
* ``infer``: the shape rule, from the inputs' :class:`TensorInfo` to the outputs'.
* ``forward``: the float computation with torch functional ops, batched.
* ``propagate``: the output *values* when they are known at import time, so that
  static shape subgraphs (Shape -> Gather -> Concat -> Reshape) give static shapes.

The registry is the single truth of coverage: ``npuforge ops`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import ShapeError, UnsupportedError
from ..ir import dtypes

REQUIRED = object()
_REGISTRY: dict[str, "Op"] = {}

# Values are propagated at import only for tensors this small: shape
# arithmetic, never weights.
_PROPAGATE_LIMIT = 1 << 16


@dataclass
class TensorInfo:
    dtype: str
    shape: tuple | None
    value: np.ndarray | None = None  # known at import; object dtype if it holds symbolic dims

    @property
    def rank(self) -> int:
        return len(self.shape)


class Op:
    name: ClassVar[str]
    attrs: ClassVar[dict[str, Any]] = {}
    # ONNX attributes of older opsets that ``from_onnx`` converts (and removes)
    onnx_only_attrs: ClassVar[tuple[str, ...]] = ()
    inputs: ClassVar[tuple[int, int]] = (1, 1)  # min, max input count
    outputs: ClassVar[tuple[int, int]] = (1, 1)
    summary: ClassVar[str] = ""
    # The kind of each attribute's value (INT, FLOAT, STR, INTS, FLOATS) where its default does not
    # tell it (REQUIRED, None, a list of floats); see attr_kind.
    attr_kinds: ClassVar[dict[str, str]] = {}
    # Inclusive (low, high) bounds of integer attributes, each entry of a list: a stride of 0 divides
    # by zero and a pad of 2^31 is no tensor ONNX Runtime would build.
    attr_ranges: ClassVar[dict[str, tuple[int, int]]] = {}

    # -- import --------------------------------------------------------------
    def from_onnx(self, ctx, node) -> None:
        """Adjust ``node`` (an IR node whose attrs are the ONNX ones) in place.

        Defaults are already filled and unknown attributes rejected by the
        importer; override to validate values or resolve spellings.
        """

    # -- shape rule and values -----------------------------------------------
    def infer(self, node, ins: list) -> list[TensorInfo]:
        raise NotImplementedError

    def propagate(self, node, ins: list, outs: list[TensorInfo]) -> list | None:
        """Output values when every input value is known; None when they are not."""
        present = [i for i in ins if i is not None]
        if not present or any(i.value is None or i.value.dtype == object for i in present):
            return None  # (symbolic values only flow through Structural ops)
        if sum(i.value.size for i in present) > _PROPAGATE_LIMIT:
            return None
        xs = [None if i is None else torch.from_numpy(np.array(i.value)) for i in ins]
        with torch.no_grad():
            ys = self.forward(node, xs)
        return [y.numpy() for y in ys]

    # -- float computation ----------------------------------------------------
    def forward(self, node, xs: list) -> list:
        raise NotImplementedError

    # -- quantization rule ----------------------------------------------------------
    # How the quantizer treats the op (see npuforge/quant/quantize.py):
    #   "compute"      constant weights (int8) and bias (int32), int32 accumulation, requantized output
    #   "matmul"       two quantized activations multiplied, requantized output
    #   "elementwise"  Add/Sub/Mul: each input keeps its parameters; rescaled to the output's
    #   "pool"         averaging: integer sum, requantized (divided) output
    #   "lut"          unary elementwise: a lookup table over every input code
    #   "passthrough"  moves or selects values: the output shares the input's parameters
    #   "interpolate"  a linear Resize on the input's grid: integer bilinear weights (quant/resize_rule.py)
    #   "concat"       inputs and output share one set of parameters
    #   "prelu"        PRelu with a constant slope: int8 slope codes, two requantizations (quant/prelu_rule.py)
    #   "minmax"       Max / Min of activations, Clip with computed bounds: each operand requantized to the
    #                  output's grid, then max / min of the codes (quant/minmax_rule.py)
    #   "divide"       Div by an activation: the exact quotient of the codes times the ratio of scales,
    #                  rounded once (quant/div_rule.py)
    #   "shape"        integer shape arithmetic: stays as it is
    #   None           no rule: kept in float (a warning; an error under strict)
    quant: ClassVar[str | None] = None

    def quant_kind(self, node, graph) -> str | None:
        return self.quant

    def weight_axis(self, node, graph) -> int | None:
        """Output-channel axis of a "compute" op's weight (input 1); None: per tensor only."""
        return None

    # -- cost ---------------------------------------------------------------------
    def macs(self, node, ins: list, outs: list) -> int:
        """Multiply-accumulates for static shapes (dynamic dims counted as 1)."""
        return 0


INT, FLOAT, STR, INTS, FLOATS = "int", "float", "string", "ints", "floats"
_INT64 = (-(1 << 63), (1 << 63) - 1)
INT32_MAX = (1 << 31) - 1
# The window attributes of Conv, ConvTranspose and the pools.
WINDOW_RANGES = {"kernel_shape": (1, INT32_MAX), "strides": (1, INT32_MAX), "dilations": (1, INT32_MAX),
                 "pads": (0, INT32_MAX)}


def attr_kind(op: Op, key: str) -> str | None:
    """The declared kind of an attribute, else its default's; None: any value (a default of None)."""
    if key in op.attrs and key not in op.attr_kinds:
        default = op.attrs[key]
        if isinstance(default, bool) or isinstance(default, int):
            return INT
        if isinstance(default, float):
            return FLOAT
        if isinstance(default, str):
            return STR
        if isinstance(default, list):
            return FLOATS if default and isinstance(default[0], float) else INTS
        return None
    return op.attr_kinds.get(key)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_float(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


_FITS = {INT: _is_int, FLOAT: _is_float, STR: lambda v: isinstance(v, str),
         INTS: lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
         FLOATS: lambda v: isinstance(v, list) and all(_is_float(x) for x in v)}


_KIND_WORDS = {INT: "an integer", FLOAT: "a number", STR: "a string", INTS: "a list of integers",
               FLOATS: "a list of numbers"}


def attr_value_problems(op: Op, node) -> list[str]:
    """Every attribute of ``node`` missing, of the wrong kind or out of its op's range: the one check,
    run before an op's import, shape rule or kernel reads them (they index, divide and allocate)."""
    problems = [f"node '{node.name}' ({node.op}): attribute '{key}' is missing" for key in op.attrs
                if key not in node.attrs]
    for key, value in node.attrs.items():
        kind = attr_kind(op, key)
        if kind is None:
            continue
        if not _FITS[kind](value):
            problems.append(f"node '{node.name}' ({node.op}): attribute '{key}' is {value!r:.60}, "
                            f"expected {_KIND_WORDS[kind]}")
            continue
        if kind in (INT, INTS):
            lo, hi = op.attr_ranges.get(key, _INT64)
            bad = [x for x in (value if kind == INTS else [value]) if not lo <= x <= hi]
            if bad:
                problems.append(f"node '{node.name}' ({node.op}): attribute '{key}' holds {bad[0]}, "
                                f"outside {lo}..{hi}")
    return problems


def check_attr_values(op: Op, node) -> None:
    problems = attr_value_problems(op, node)
    if problems:
        raise UnsupportedError(problems[0] + "; fix the model's attribute")


def register(cls):
    """Class decorator: instantiate the op and enter it under ``cls.name``."""
    if cls.name in _REGISTRY:
        raise RuntimeError(f"op {cls.name} registered twice")
    _REGISTRY[cls.name] = cls()
    return cls


def get_op(name: str, where: str = "") -> Op:
    _load_all()
    if name not in _REGISTRY:
        prefix = f"{where}: " if where else ""
        raise UnsupportedError(f"{prefix}op '{name}' is not supported; `npuforge ops` lists the {len(_REGISTRY)} "
                               f"supported ops")
    return _REGISTRY[name]


def all_ops() -> dict[str, Op]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def _load_all() -> None:
    # Importing the op modules runs their @register decorators.
    from . import (  # noqa: F401
        activation, conv, elementwise, geometry, indexing, layout, linear, logic, math, normalization, pool, recurrent,
        reduce, resize, selection, shape_ops, tensor, unpool,
    )


# -- helpers shared by the shape rules ---------------------------------------


def fail(node, msg: str):
    raise ShapeError(f"node '{node.name}' ({node.op}): {msg}")


def unsupported(node, msg: str):
    raise UnsupportedError(f"node '{node.name}' ({node.op}): {msg}")


def norm_axis(node, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def broadcast_shapes(node, *shapes) -> tuple:
    """numpy (multidirectional) broadcasting, with symbolic dims."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        d = 1
        for x in dims:
            if x == 1 or x == d:
                continue
            if d == 1:
                d = x
            elif isinstance(x, int) and isinstance(d, int):
                fail(node, f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast")
            elif isinstance(d, str) and isinstance(x, int):
                d = x  # a dynamic dim broadcast against a fixed one must equal it
        out.append(d)
    return tuple(out)


def const_ints(node, info, what: str) -> list | None:
    """A constant integer input as a list (symbolic entries stay str); None if absent."""
    if info is None:
        return None
    if info.value is None:
        unsupported(node, f"{what} must be known when the graph is imported (a constant or a static shape subgraph)")
    return [v if isinstance(v, str) else int(v) for v in np.asarray(info.value).reshape(-1).tolist()]


def static_dims(node, shape, what: str = "input") -> tuple:
    if shape is None or any(not isinstance(d, int) for d in shape):
        unsupported(node, f"{what} shape {shape} must be static here; fix the model's dynamic input sizes with "
                          f"--input-shape NAME=D0,D1,... (one size per dim: 1,3,224,224 for an image, 1,16000 for a "
                          f"second of 16 kHz audio; input_shapes= in the Python API)")
    return tuple(shape)


def to_torch_dtype(name: str):
    return dtypes.to_torch(name)


def _factors(dim) -> tuple[int, list]:
    """A dim as (integer coefficient, symbols): 'N*4' -> (4, ['N'])."""
    if isinstance(dim, int):
        return dim, []
    coef, syms = 1, []
    for part in dim.split("*"):
        if part.lstrip("-").isdigit():
            coef *= int(part)
        else:
            syms.append(part)
    return coef, syms


def _join(coef: int, syms: list):
    if not syms:
        return coef
    return "*".join(sorted(syms) + ([str(coef)] if coef != 1 else []))


def dim_product(dims):
    """Product of dims; symbolic dims multiply into a symbolic expression like 'N*4'."""
    coef, syms = 1, []
    for d in dims:
        c, s = _factors(d)
        coef *= c
        syms += s
    return _join(coef, syms)


def dim_quotient(node, num, den):
    """num / den for dims that may be symbolic; the division must be exact."""
    nc, ns = _factors(num)
    dc, ds = _factors(den)
    rest = list(ns)
    for s in ds:
        if s not in rest:
            fail(node, f"cannot divide dimension {num} by {den}")
        rest.remove(s)
    if dc == 0 or nc % dc:
        fail(node, f"dimension {num} is not divisible by {den}")
    return _join(nc // dc, rest)


def concrete(value: np.ndarray) -> np.ndarray:
    """An object array of shape values with no symbol left (the channel count picked
    from [N, C, H, W], say) becomes int64, so ordinary arithmetic can use it."""
    if value.dtype == object and not any(isinstance(v, str) for v in value.reshape(-1)):
        return value.astype(np.int64)
    return value


class Structural(Op):
    """An op that only moves elements: its values propagate with numpy, so
    shape tensors holding symbolic dims (object arrays) flow through it."""

    def propagate(self, node, ins, outs):
        present = [i for i in ins if i is not None]
        if not present or any(i.value is None for i in present):
            return None
        if sum(i.value.size for i in present) > _PROPAGATE_LIMIT:
            return None
        values = self.np_forward(node, [None if i is None else i.value for i in ins], outs)
        if values is None:
            return None
        # numpy hands back a bare element for a scalar pick from an object array
        return [None if v is None else concrete(np.asarray(v, dtype=object if isinstance(v, str) else None))
                for v in values]

    def np_forward(self, node, values: list, outs: list) -> list:
        raise NotImplementedError

    def forward(self, node, xs):
        raise NotImplementedError
