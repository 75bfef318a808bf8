"""Elementwise activations, Softmax / LogSoftmax / Hardmax, and the activations a Conv or Gemm can carry fused."""

import numpy as np
import torch
import torch.nn.functional as F

from .dtype_rules import FLOAT, NUMERIC, require_dtype
from .registry import Op, TensorInfo, fail, norm_axis, register, unsupported

# Activations a Conv / Gemm may carry in its ``activation`` attribute (set by the
# fusion pass), with what ``activation_params`` holds for each. Clip's bounds are
# numbers, or lists with one bound per output channel (axis 1): cross-layer
# equalization rescales channels, and ReLU6's bound 6 becomes 6 / s per channel.
FUSED_ACTIVATIONS = {
    "": (),
    "Relu": (),
    "Clip": ("min", "max"),
    "LeakyRelu": ("alpha",),
}
FUSED_ATTRS = {"activation": "", "activation_params": []}
FUSED_KINDS = {"activation_params": None}  # numbers or per-channel lists of them: check_fused reads them


def check_fused(node, channels=None) -> None:
    name, params = node.attrs["activation"], node.attrs["activation_params"]
    if name not in FUSED_ACTIVATIONS:
        unsupported(node, f"fused activation '{name}' is not one of {', '.join(a for a in FUSED_ACTIVATIONS if a)}")
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not isinstance(params, list) or not all(number(p) or (isinstance(p, list) and all(map(number, p)))
                                               for p in params):
        fail(node, f"activation_params {params!r:.60} must be a list of numbers or per-channel lists of them")
    if len(params) != len(FUSED_ACTIVATIONS[name]):
        fail(node, f"activation {name} takes params {list(FUSED_ACTIVATIONS[name])}, got {params}")
    for key, p in zip(FUSED_ACTIVATIONS[name], params):
        if isinstance(p, list) and (name != "Clip" or (isinstance(channels, int) and len(p) != channels)):
            fail(node, f"activation {name} {key}: {len(p)} per-channel values for {channels} output channels")


def fused_clip_bounds(node) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) of a fused Relu or Clip as float32 arrays, 0-d or one per output channel; None otherwise."""
    name = node.attrs.get("activation", "")
    if name == "Relu":
        return np.float32(0.0), np.float32(np.inf)
    if name != "Clip":
        return None
    lo, hi = (np.asarray(p, np.float32) for p in node.attrs["activation_params"])
    return lo, hi


def _per_channel(bound: np.ndarray, rank: int) -> np.ndarray:
    return bound.reshape([-1] + [1] * (rank - 2)) if bound.ndim else bound


def onnx_with_fused(node) -> list:
    """ONNX nodes of a Conv / Gemm: the op itself, then its fused activation as a node of its own
    (per-channel Clip bounds, which ONNX's Clip cannot hold, as Max and Min with channel constants)."""
    from onnx import helper, numpy_helper

    attrs = {k: v for k, v in node.attrs.items() if k not in FUSED_ATTRS}
    name, params = node.attrs["activation"], node.attrs["activation_params"]
    if not name:
        return [helper.make_node(node.op, node.inputs, node.outputs, name=node.name, **attrs)]
    mid = f"{node.outputs[0]}::preact"
    nodes = [helper.make_node(node.op, node.inputs, [mid], name=node.name, **attrs)]
    act = f"{node.name}::{name}"
    if name == "Clip":
        lo, hi = fused_clip_bounds(node)
        rank = len(node.attrs.get("kernel_shape", [])) + 2
        bounds = [helper.make_node("Constant", [], [f"{act}::{k}"], name=f"{act}::{k}",
                                   value=numpy_helper.from_array(_per_channel(v, rank)))
                  for k, v in zip(("min", "max"), (lo, hi))]
        if lo.ndim == 0 and hi.ndim == 0:
            return nodes + bounds + [helper.make_node("Clip", [mid, f"{act}::min", f"{act}::max"], node.outputs,
                                                      name=act)]
        low = f"{act}::low"
        return nodes + bounds + [helper.make_node("Max", [mid, f"{act}::min"], [low], name=f"{act}::Max"),
                                 helper.make_node("Min", [low, f"{act}::max"], node.outputs, name=f"{act}::Min")]
    extra = {"alpha": params[0]} if name == "LeakyRelu" else {}
    return nodes + [helper.make_node(name, [mid], node.outputs, name=act, **extra)]


def apply_fused(node, y: torch.Tensor) -> torch.Tensor:
    name, params = node.attrs.get("activation", ""), node.attrs.get("activation_params", [])
    if name == "":
        return y
    if name == "Relu":
        return F.relu(y)
    if name == "Clip":
        if not any(isinstance(p, list) for p in params):
            return torch.clamp(y, params[0], params[1])
        lo, hi = (torch.from_numpy(_per_channel(b, y.dim())).to(y.dtype) for b in fused_clip_bounds(node))
        return torch.clamp(y, lo, hi)
    return F.leaky_relu(y, params[0])


class _Unary(Op):
    quant = "lut"

    def infer(self, node, ins):
        x = ins[0]
        if x.dtype not in ("float16", "float32", "float64"):
            fail(node, f"expects a float input, got {x.dtype}")
        return [TensorInfo(x.dtype, x.shape)]


class _NumericUnary(_Unary):
    """A unary op ONNX also defines on integers (Abs, Neg, Sign, Shrink). Float
    inputs get the lookup table; integer ones are exact arithmetic that stays
    as it is (the quantizer's "lut" needs a float input with parameters)."""

    dtypes = NUMERIC

    def infer(self, node, ins):
        require_dtype(node, ins[0], self.dtypes)
        return [TensorInfo(ins[0].dtype, ins[0].shape)]

    def quant_kind(self, node, graph):
        return self.quant if graph.values[node.outputs[0]].dtype in FLOAT else "shape"


@register
class Relu(_Unary):
    name = "Relu"
    summary = "max(x, 0)"

    def forward(self, node, xs):
        return [F.relu(xs[0])]


@register
class Sigmoid(_Unary):
    name = "Sigmoid"
    summary = "1 / (1 + exp(-x))"

    def forward(self, node, xs):
        return [torch.sigmoid(xs[0])]


@register
class Tanh(_Unary):
    name = "Tanh"
    summary = "tanh(x)"

    def forward(self, node, xs):
        return [torch.tanh(xs[0])]


@register
class HardSigmoid(_Unary):
    name = "HardSigmoid"
    attrs = {"alpha": 0.2, "beta": 0.5}
    summary = "clip(alpha * x + beta, 0, 1)"

    def forward(self, node, xs):
        return [torch.clamp(node.attrs["alpha"] * xs[0] + node.attrs["beta"], 0.0, 1.0)]


@register
class HardSwish(_Unary):
    name = "HardSwish"
    summary = "x * clip(x / 6 + 0.5, 0, 1)"

    def forward(self, node, xs):
        return [F.hardswish(xs[0])]


@register
class Swish(_Unary):
    name = "Swish"
    summary = "x * sigmoid(x) (npuforge op, recognised from that pattern)"

    def forward(self, node, xs):
        return [F.silu(xs[0])]

    def onnx_nodes(self, node):
        from onnx import helper

        mid = f"{node.outputs[0]}::sigmoid"
        return [helper.make_node("Sigmoid", node.inputs, [mid], name=f"{node.name}::sigmoid"),
                helper.make_node("Mul", [node.inputs[0], mid], node.outputs, name=node.name)]


@register
class Gelu(_Unary):
    name = "Gelu"
    attrs = {"approximate": "none"}
    summary = "x * Phi(x), exact (erf) or tanh approximation (ONNX opset 20)"

    def from_onnx(self, ctx, node):
        if node.attrs["approximate"] not in ("none", "tanh"):
            unsupported(node, f"approximate '{node.attrs['approximate']}' is not one of none, tanh")

    def forward(self, node, xs):
        return [F.gelu(xs[0], approximate=node.attrs["approximate"])]


@register
class LeakyRelu(_Unary):
    name = "LeakyRelu"
    attrs = {"alpha": 0.01}
    summary = "x if x >= 0 else alpha * x"

    def forward(self, node, xs):
        return [F.leaky_relu(xs[0], node.attrs["alpha"])]


@register
class PRelu(Op):
    name = "PRelu"
    inputs = (2, 2)
    summary = ("x if x >= 0 else slope * x; slope broadcasts to x (unidirectional); int8: two requantizations, "
               "an int8 slope per channel")
    quant = "prelu"  # a constant slope: quant/prelu_rule.py

    def infer(self, node, ins):
        x, slope = ins
        if len(slope.shape) > len(x.shape) or any(
            s != 1 and s != d for s, d in zip(reversed(slope.shape), reversed(x.shape))
        ):
            fail(node, f"slope shape {list(slope.shape)} does not broadcast to input shape {list(x.shape)}")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x, slope = xs
        return [torch.where(x >= 0, x, x * slope)]

    def quant_kind(self, node, graph):
        """Two requantizations with an int8 slope (quant/prelu_rule.py) where the slope is a constant."""
        x, slope, y = (graph.values[n] for n in (*node.inputs, node.outputs[0]))
        return "prelu" if slope.is_const and not x.is_const and y.dtype in FLOAT else None

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.prelu_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.prelu_rule import integer_forward

        return integer_forward(sim, node, env)


@register
class Clip(Op):
    name = "Clip"
    inputs = (1, 3)
    summary = "clamp(x, min, max); min and max optional inputs; int8: a table (computed bounds: the minmax rule)"
    quant = "lut"

    def quant_kind(self, node, graph):
        """A table of x with constant bounds; computed bounds: the Max / Min rule (quant/minmax_rule.py)."""
        bounds = [graph.values[b] for b in node.inputs[1:] if b]
        if all(b.is_const for b in bounds):
            return self.quant
        x, y = graph.values[node.inputs[0]], graph.values[node.outputs[0]]
        return "minmax" if y.dtype in FLOAT and not x.is_const else None

    def quantize_integers(self, graph, node, add, config=None):
        from ..quant.minmax_rule import quantize_integers

        quantize_integers(graph, node, add, config)

    def integer_forward(self, sim, node, env):
        from ..quant.minmax_rule import integer_forward

        return integer_forward(sim, node, env)

    def infer(self, node, ins):
        x = ins[0]
        for bound in ins[1:]:
            if bound is not None and (bound.shape not in ((), (1,)) or bound.dtype != x.dtype):
                fail(node, f"min/max must be {x.dtype} scalars, got {bound.dtype}{list(bound.shape)}")
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        x = xs[0]
        # the bounds are scalars (infer checks): as Python numbers clamp takes one pass, a
        # third of the time of a tensor maximum then minimum
        lo = xs[1].item() if len(xs) > 1 and xs[1] is not None else None
        hi = xs[2].item() if len(xs) > 2 and xs[2] is not None else None
        if lo is None and hi is None:
            return [x]
        return [torch.clamp(x, lo, hi)]


@register
class Softmax(Op):
    name = "Softmax"
    attrs = {"axis": -1}
    summary = "softmax along one axis (opset 13 semantics); int8: exp table, int64 sum, integer division"
    quant = "softmax"  # the integer rule: npuforge/quant/softmax_rule.py

    def quantize_integers(self, graph, node, add):
        from ..quant.softmax_rule import quantize_integers

        quantize_integers(graph, node, add)

    def integer_forward(self, sim, node, env):
        if "tflite_softmax" in node.quant:  # quantized with TFLite's arithmetic: its fixed-point kernel
            from ..quant.tflite_softmax import integer_forward
        else:
            from ..quant.softmax_rule import integer_forward

        return integer_forward(sim, node, env)

    def infer(self, node, ins):
        x = ins[0]
        norm_axis(node, node.attrs["axis"], len(x.shape))
        return [TensorInfo(x.dtype, x.shape)]

    def forward(self, node, xs):
        return [torch.softmax(xs[0], dim=node.attrs["axis"])]


class _AlongAxis(Op):
    """LogSoftmax and Hardmax: a float function of each slice along one axis. (Not
    subclasses of Softmax, so that a quantization rule for Softmax stays its own.)"""

    attrs = {"axis": -1}

    def infer(self, node, ins):
        x = ins[0]
        require_dtype(node, x, FLOAT)
        norm_axis(node, node.attrs["axis"], len(x.shape))
        return [TensorInfo(x.dtype, x.shape)]


@register
class LogSoftmax(_AlongAxis):
    name = "LogSoftmax"
    summary = "log of softmax along one axis, computed stably (opset 13 semantics)"

    def forward(self, node, xs):
        return [torch.log_softmax(xs[0], dim=node.attrs["axis"])]


@register
class Hardmax(_AlongAxis):
    name = "Hardmax"
    summary = "1 at the first maximum along one axis, 0 elsewhere (opset 13 semantics)"

    def forward(self, node, xs):
        x = xs[0]
        axis = node.attrs["axis"] % x.dim()
        first = x.argmax(dim=axis, keepdim=True)  # torch picks the first of equal maxima, as ONNX says
        return [torch.zeros_like(x).scatter_(axis, first, 1.0)]


# -- smooth and thresholded activations (float only, each a lookup table when quantized) --------

@register
class Softplus(_Unary):
    name = "Softplus"
    summary = "log(1 + exp(x))"

    def forward(self, node, xs):
        return [F.softplus(xs[0])]


@register
class Softsign(_Unary):
    name = "Softsign"
    summary = "x / (1 + |x|)"

    def forward(self, node, xs):
        return [F.softsign(xs[0])]


@register
class Mish(_Unary):
    name = "Mish"
    summary = "x * tanh(softplus(x)) (opset 18)"

    def forward(self, node, xs):
        return [F.mish(xs[0])]


@register
class Elu(_Unary):
    name = "Elu"
    attrs = {"alpha": 1.0}
    summary = "x if x >= 0 else alpha * (exp(x) - 1)"

    def forward(self, node, xs):
        return [F.elu(xs[0], node.attrs["alpha"])]


@register
class Selu(_Unary):
    name = "Selu"
    attrs = {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}
    summary = "gamma * (x if x > 0 else alpha * (exp(x) - 1)), with the attributes (not torch's constants)"

    def forward(self, node, xs):
        x = xs[0]
        a, g = node.attrs["alpha"], node.attrs["gamma"]
        return [g * torch.where(x > 0, x, a * torch.expm1(x))]


@register
class Celu(_Unary):
    name = "Celu"
    attrs = {"alpha": 1.0}
    summary = "max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); float32 only, as ONNX defines it"

    def infer(self, node, ins):
        require_dtype(node, ins[0], ("float32",))
        return [TensorInfo(ins[0].dtype, ins[0].shape)]

    def forward(self, node, xs):
        return [F.celu(xs[0], node.attrs["alpha"])]


@register
class ThresholdedRelu(_Unary):
    name = "ThresholdedRelu"
    attrs = {"alpha": 1.0}
    summary = "x if x > alpha else 0"

    def forward(self, node, xs):
        x = xs[0]
        return [torch.where(x > node.attrs["alpha"], x, torch.zeros_like(x))]


@register
class Shrink(_NumericUnary):
    name = "Shrink"
    attrs = {"bias": 0.0, "lambd": 0.5}
    summary = "x + bias if x < -lambd, x - bias if x > lambd, else 0; integers need a whole bias"

    def infer(self, node, ins):
        if ins[0].dtype not in FLOAT and float(node.attrs["bias"]) != int(node.attrs["bias"]):
            # ONNX does not say how x - bias would round back to an integer type
            unsupported(node, f"bias {node.attrs['bias']} on a {ins[0].dtype} input: ONNX leaves the rounding "
                              f"undefined (a whole-number bias is exact)")
        return super().infer(node, ins)

    def forward(self, node, xs):
        x = xs[0]
        lambd = node.attrs["lambd"]
        bias = node.attrs["bias"] if x.dtype.is_floating_point else int(node.attrs["bias"])
        return [torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))]
