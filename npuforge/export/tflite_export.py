"""Export a quantized IR as a full-integer int8 TFLite model (TFLite's quantization spec).

What is written:

* activations int8 (a uint8 value with zero point z becomes int8 with z - 128: the
  same real numbers, every code shifted by 128, so every op computes the same);
* Conv / depthwise Conv weights int8 symmetric per output channel (zero point 0),
  int32 biases at scale ``s_x * s_w``; 4-D tensors in NHWC (TFLite's layout), explicit
  pads as SAME / VALID or a PAD op; a ConvTranspose is TRANSPOSE_CONV (OHWI weights), its pads
  SAME / VALID or VALID and a STRIDED_SLICE crop;
* graph inputs and outputs int8 (``io="int8"``, what an NPU compiler such as Vela
  takes) or float32 behind QUANTIZE / DEQUANTIZE (``io="float"``).

LiteRT derives every requantization multiplier from the float scales in the file, so
an export that is to compute what the IR's integer simulator computes needs the IR's
stored integers to be TFLite's: each node is checked (multipliers, TFLite's ADD and
MEAN arithmetic, fused-activation bounds) and a graph quantized otherwise is refused
with the reason (quantize with ``--target tflite``).
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuforgeError, UnsupportedError
from ..quant.fixedpoint import round_half_away
from ..quant.params import QParams
from ..quant.tflite_16x8 import ADD_LEFT_SHIFT_16, WIDENING_BITS, add_multipliers_16, multiplier_16x8
from ..quant.tflite_tables import activation_range
from ..quant.requant import (TFLITE_ADD_LEFT_SHIFT, quantize_multiplier, tflite_add_multipliers, tflite_mean_multiplier,
                             tflite_mul_multiplier)
from .tflite_layout import NCHW_TO_NHWC as _NCHW_TO_NHWC, NHWC_AXIS as _NHWC_AXIS, refuse as _refuse, same_order
from . import tflite_lstm, tflite_select, tflite_tensor_ops as tensor_ops
from .tflite_writer import TensorQuant, TFLiteWriter

IO_TYPES = ("int8", "float")


def _codes():
    from tflite.BuiltinOperator import BuiltinOperator as B
    from tflite.BuiltinOptions import BuiltinOptions as O

    return B, O


def _tflite_nearest(n_in: int, n_out: int, align: bool, half: bool) -> np.ndarray:
    """TFLite's nearest-neighbour source index of every output position (float32 arithmetic)."""
    f32 = np.float32
    scale = f32(n_in - 1) / f32(n_out - 1) if align and n_out > 1 else f32(n_in) / f32(n_out)
    pos = (np.arange(n_out, dtype=f32) + f32(0.5 if half else 0.0)) * scale
    idx = round_half_away(pos) if align else np.floor(pos)
    idx = np.minimum(idx.astype(np.int64), n_in - 1)
    return np.maximum(idx, 0) if half else idx


def _conv_out_size(padding: int, size: int, kernel: int, stride: int) -> int:
    """TFLite's ComputeOutSize: a convolution's output size on an input of ``size`` (C's division)."""
    from tflite.Padding import Padding

    num = size + stride - 1 if padding == Padding.SAME else size - kernel + stride
    return num // stride if num >= 0 else -(-num // stride)


def transpose_conv_crop(padding: int, size: int, in_size: int, kernel: int, stride: int) -> int | None:
    """The rows LiteRT's TRANSPOSE_CONV drops at the head of the full transposed convolution for an output
    of ``size`` rows: the padding TFLite computes for a convolution whose input is that output
    (ComputePaddingHeightWidth, the smaller half of the total); None where LiteRT refuses the size (its
    Prepare wants that convolution's output size to be the input's, ``in_size``)."""
    out = _conv_out_size(padding, size, kernel, stride)
    if out != in_size:
        return None
    return max((out - 1) * stride + kernel - size, 0) // 2


class _Exporter:
    def __init__(self, graph, io: str):
        if io not in IO_TYPES:
            raise NpuforgeError(f"TFLite input/output type '{io}' is not one of {', '.join(IO_TYPES)}")
        if not any(v.quant is not None for v in graph.values.values()):
            raise NpuforgeError(f"graph '{graph.name}' is not quantized; quantize it first (npuforge quantize)")
        self.g, self.io = graph, io
        # quantized with target='tflite': its int16 values are the ones the 16x8 mode writes (quant/tflite_16x8.py)
        self.for_tflite = graph.metadata.get("quantization", {}).get("config", {}).get("target") == "tflite"
        self.w = TFLiteWriter()
        self.tensor: dict[str, int] = {}  # IR value -> TFLite tensor (4-D activations in NHWC)
        self.widened: dict[int, int] = {}  # int8 tensor -> its exact int16 copy (16x8 inputs)
        self.B, self.O = _codes()

    # -- values ------------------------------------------------------------------------
    def qp(self, name: str, node=None) -> QParams:
        """The value's parameters as TFLite stores them (uint8 -> int8, zero point - 128)."""
        p = self.g.values[name].quant
        if p is None:
            raise UnsupportedError(self.why_float(name))
        if p.dtype == "uint8":
            return QParams("int8", p.scale, p.zero_point.astype(np.int64) - 128, p.axis)
        if p.dtype == "int16" and self.for_tflite and not np.any(p.zero_point):  # TFLite's 16x8 mode
            return p
        if p.dtype != "int8":
            raise UnsupportedError(f"value '{name}' is {p.dtype}; the TFLite export writes int8 values, and int16 "
                                   f"ones where LiteRT's 16x8 kernels compute npuforge's integers (quantize with "
                                   f"--target tflite, which keeps int16 only there)")
        return p

    def why_float(self, name: str) -> str:
        """Why a value has no parameters, naming the option or op that left it in float."""
        meta = self.g.metadata.get("quantization", {})
        asked = set(meta.get("config", {}).get("keep_float", []))
        producer = next((n for n in self.g.nodes if name in n.outputs), None)
        readers = [n for n in self.g.nodes if name in n.inputs]
        what = f"value '{name}'" if producer else f"graph input '{name}'"
        kept = [n.name for n in ([producer] if producer else readers) if n.name in asked]
        if kept:
            return (f"{what} is float: node '{kept[0]}' was kept in float by --keep-float; a full-integer TFLite "
                    f"model has no float values: leave it out of --keep-float")
        if producer is None:
            return (f"graph input '{name}' is float: the nodes reading it ({', '.join(n.name for n in readers[:3])}) "
                    f"were kept in float; a full-integer TFLite model has no float values")
        return (f"value '{name}' is float: node '{producer.name}' ({producer.op}) has no int8 rule, so the "
                f"quantizer kept it in float; a full-integer TFLite model has no float values")

    def remedy(self) -> str:
        """What to do about integers that are not TFLite's: quantize for TFLite, or, where that was
        done, report it (never the option the user already gave)."""
        if self.g.metadata.get("quantization", {}).get("config", {}).get("tflite_multipliers"):
            return "it was quantized with TFLite's arithmetic, so this is an npuforge defect: please report it"
        return "quantize with --target tflite"

    def dims(self, name: str) -> tuple:
        """The value's static shape, every symbol (the batch) 1: a symbolic dimension is a product
        such as 'N*900' (a Reshape that folds the batch in), written as 900."""
        return tuple(d if isinstance(d, int) else int(np.prod([int(p) for p in d.split("*") if p.lstrip("-").isdigit()]))
                     for d in self.g.values[name].shape)

    def shape(self, name: str) -> tuple:
        shape = self.dims(name)
        return tuple(shape[i] for i in _NCHW_TO_NHWC) if len(shape) == 4 else shape

    def quant(self, p: QParams, axis: int = 0) -> TensorQuant:
        return TensorQuant(np.atleast_1d(p.scale), np.atleast_1d(p.zero_point), axis)

    def activation(self, name: str) -> int:
        """The TFLite tensor of an activation, created on first use."""
        if name not in self.tensor:
            v = self.g.values[name]
            if v.quant is None and v.dtype in ("int32", "int64", "bool"):  # token ids, indices: int32 in TFLite
                self.tensor[name] = self.w.tensor(name, self.shape(name), "bool" if v.dtype == "bool" else "int32")
                return self.tensor[name]
            p = self.qp(name)
            data = None
            if v.is_const:  # a constant an op reads as an operand (a class token a Concat joins): its codes
                data = v.quant.quantize(v.data).astype(np.int64) - (128 if v.quant.dtype == "uint8" else 0)
                data = (data.transpose(_NCHW_TO_NHWC) if data.ndim == 4 else data).astype(p.dtype)
            self.tensor[name] = self.w.tensor(name, self.shape(name), p.dtype, data=data, quant=self.quant(p))
        return self.tensor[name]

    def new_tensor(self, name: str, shape, p: QParams) -> int:
        return self.w.tensor(name, shape, p.dtype, quant=self.quant(p))

    def const(self, name: str, data: np.ndarray, dtype: str, p: TensorQuant | None = None) -> int:
        return self.w.tensor(name, data.shape, dtype, data=data.astype(dtype), quant=p)

    def int32s(self, name: str, values) -> int:
        return self.const(name, np.asarray(values, np.int32), "int32")

    def stored(self, node, role: str) -> np.ndarray:
        return np.asarray(self.g.values[node.quant[role]].data)

    def op(self, name: str, inputs, outputs, options: str | None = None, version: int = 1, **fields):
        self.w.operator(getattr(self.B, name), inputs, outputs, options,
                        getattr(self.O, options) if options else 0, version, **fields)

    def nchw_order(self, name: str) -> int:
        """The value's tensor with its elements in the IR's (NCHW) order: a TRANSPOSE for a
        4-D tensor whose NHWC order differs (C > 1 and H * W > 1)."""
        t = self.activation(name)
        shape = self.dims(name)
        if len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1:
            return t
        out = self.new_tensor(f"{name}::nchw", tuple(shape), self.qp(name))
        self.op("TRANSPOSE", [t, self.int32s(f"{name}::perm", (0, 3, 1, 2))], [out], "TransposeOptions")
        return out

    def ir_shaped(self, name: str) -> int:
        """The value's tensor in the IR's order and shape (ops that read shapes: BATCH_MATMUL, a
        FULLY_CONNECTED keeping dims): a 4-D tensor TRANSPOSEd, or RESHAPEd where the orders agree."""
        shape = self.dims(name)
        if len(shape) != 4 or not same_order(shape):
            return self.nchw_order(name)
        out = self.new_tensor(f"{name}::nchw", shape, self.qp(name))
        self.op("RESHAPE", [self.activation(name), self.int32s(f"{name}::nchw_shape", shape)], [out],
                "ReshapeOptions", NewShape=list(shape))
        return out

    # -- checks ------------------------------------------------------------------------
    def check_multiplier(self, node, role: str, real, mean_count: int | None = None, wide: bool = False) -> None:
        real = np.atleast_1d(np.asarray(real, np.float64))
        if wide:  # LiteRT's 16x8 requantization (quant/tflite_16x8.py)
            want_m, want_s = multiplier_16x8(real)
        else:
            want_m, want_s = quantize_multiplier(real) if mean_count is None else tflite_mean_multiplier(real, mean_count)
        m, s = self.stored(node, f"multiplier{role}"), self.stored(node, f"shift{role}")
        if not (np.array_equal(m.reshape(-1), want_m) and np.array_equal(s.reshape(-1), want_s)):
            _refuse(node, f"its requantization multipliers are not the ones LiteRT derives from the scales "
                          f"({self.remedy()})")

    def fused(self, node, yq: QParams) -> int:
        """The TFLite fused activation whose saturation bounds equal the node's."""
        from .tflite_writer import fused_activation

        if "act_min" in node.quant:
            shift = 128 if self.g.values[node.outputs[0]].quant.dtype == "uint8" else 0
            want = (int(self.stored(node, "act_min")) - shift, int(self.stored(node, "act_max")) - shift)
        elif node.attrs.get("activation", ""):
            _refuse(node, f"TFLite has no fused {node.attrs['activation']} (quantize with --target tflite, which "
                          f"splits it off the convolution)")
        else:
            want = (yq.qmin, yq.qmax)
        for kind in ("", "Relu", "Relu6", "ReluN1To1"):
            if activation_range(kind, yq) == want:
                return fused_activation(kind)
        _refuse(node, f"its saturation bounds {want} are none of TFLite's fused activations")

    # -- ops ---------------------------------------------------------------------------
    def padding(self, node, x: str, kernel, strides, dilations, pads, pad_value: int | None):
        """(TFLite padding, input tensor): SAME or VALID when the explicit pads are exactly
        that, else a PAD op and VALID. ``pad_value``: 0 fills with the zero point (PAD), a
        code fills with that code (PADV2), None refuses."""
        from tflite.Padding import Padding

        size = self.dims(x)[2:]
        same = []
        for n, k, s, d in zip(size, kernel, strides, dilations):
            out = -(-n // s)
            same.append(max((out - 1) * s + (k - 1) * d + 1 - n, 0))
        same_pads = [t // 2 for t in same] + [t - t // 2 for t in same]
        if list(pads) == same_pads:
            return Padding.SAME, self.activation(x)
        if not any(pads):
            return Padding.VALID, self.activation(x)
        if pad_value is None:
            _refuse(node, f"pads {list(pads)} are neither TFLite's SAME nor VALID")
        return Padding.VALID, self.padded(node, x, pads, pad_value)

    def padded(self, node, x: str, pads, pad_value: int) -> int:
        """The 4-D value ``x`` with explicit pads [top, left, bottom, right]: PAD with the zero point
        (``pad_value`` 0), or PADV2 with another fill code."""
        t = self.activation(x)
        p = self.qp(x)
        fill = int(p.zero_point) if pad_value == 0 else pad_value
        shape = list(self.shape(x))
        shape[1] += pads[0] + pads[2]
        shape[2] += pads[1] + pads[3]
        padded = self.new_tensor(f"{node.name}::padded", shape, p)
        table = np.array([[0, 0], [pads[0], pads[2]], [pads[1], pads[3]], [0, 0]], np.int32)
        ins = [t, self.const(f"{node.name}::pads", table, "int32")]
        if fill == int(p.zero_point):
            self.op("PAD", ins, [padded], "PadOptions", version=2)
        else:  # PADV2: an explicit fill code (a max pool's padding is the lowest code)
            fill_t = self.const(f"{node.name}::fill", np.array([fill]), "int8", self.quant(p))
            self.op("PADV2", ins + [fill_t], [padded], "PadV2Options", version=2)
        return padded

    def compute_io(self, node, xt: int, xq: QParams, wscale, units: int, optional_bias: bool = False) -> tuple:
        """(input tensor, bias tensor, 16x8?) of a CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED /
        TRANSPOSE_CONV: the int8 input and int32 biases; for an int16 output TFLite's 16x8 mode: the input
        widened exactly (QUANTIZE to the grid s_x / 2^7, zero point 0: each code minus its zero point, times
        2^7) and int64 biases at the widened scale (codes times 2^7). ``optional_bias``: no bias tensor
        (None) for an int8 node without biases (TRANSPOSE_CONV's bias input is optional)."""
        wide = self.g.values[node.outputs[0]].quant.dtype == "int16"
        bias = (self.stored(node, "bias").astype(np.int64).reshape(units) if "bias" in node.quant
                else np.zeros(units, np.int64))
        scale = np.float64(xq.scale)
        if wide:
            p16 = QParams("int16", np.float32(np.float32(xq.scale) / (1 << WIDENING_BITS)), np.int32(0))
            if xt not in self.widened:  # one QUANTIZE per int8 tensor, whoever reads it widened
                self.widened[xt] = self.new_tensor(f"{self.w.tensors[xt].name}::int16", self.w.tensors[xt].shape, p16)
                self.op("QUANTIZE", [xt], [self.widened[xt]], version=4)
            xt, bias, scale = self.widened[xt], bias << WIDENING_BITS, np.float64(p16.scale)
        elif optional_bias and "bias" not in node.quant:
            return xt, None, wide
        bscale = (scale * np.atleast_1d(wscale).astype(np.float64)).astype(np.float32)
        bt = self.const(f"{node.inputs[1]}::bias", bias, "int64" if wide else "int32",
                        TensorQuant(bscale, np.zeros(bscale.size, np.int64), 0))
        return xt, bt, wide

    def conv(self, node):
        g, a = self.g, node.attrs
        x, wname = node.inputs[0], node.inputs[1]
        if len(g.values[x].shape) != 4:
            _refuse(node, "only 2-D convolutions have a TFLite builtin")
        xq, yq = self.qp(x), self.qp(node.outputs[0])
        wq = g.values[wname].quant
        w = self.stored(node, "weight").astype(np.int8)
        if wq.dtype != "int8" or np.any(wq.zero_point != 0):
            _refuse(node, "TFLite's int8 convolution takes symmetric int8 weights (zero point 0)")
        cout, cin_g = w.shape[:2]
        cin = g.values[x].shape[1]
        group = a["group"]
        depthwise = group > 1 and group == cin and cin_g == 1
        if group > 1 and not depthwise:
            _refuse(node, f"grouped convolution (group {group}) has no TFLite builtin")
        real = np.float64(xq.scale) * wq.scale.astype(np.float64) / np.float64(yq.scale)
        self.check_multiplier(node, "", real, wide=yq.dtype == "int16")
        act = self.fused(node, yq)
        padding, xt = self.padding(node, x, a["kernel_shape"], a["strides"], a["dilations"], a["pads"], 0)
        axis = 3 if depthwise else 0
        wdata = w.transpose(1, 2, 3, 0) if depthwise else w.transpose(0, 2, 3, 1)
        wt = self.const(wname, wdata, "int8", TensorQuant(np.broadcast_to(wq.scale, (cout,)),
                                                          np.zeros(cout, np.int64), axis))
        xt, bt, wide = self.compute_io(node, xt, xq, np.broadcast_to(wq.scale, (cout,)), cout)
        common = dict(Padding=padding, StrideH=a["strides"][0], StrideW=a["strides"][1],
                      DilationHFactor=a["dilations"][0], DilationWFactor=a["dilations"][1],
                      FusedActivationFunction=act)
        ins, outs = [xt, wt, bt], [self.activation(node.outputs[0])]
        if depthwise:
            self.op("DEPTHWISE_CONV_2D", ins, outs, "DepthwiseConv2DOptions", version=5 if wide else 3,
                    DepthMultiplier=cout // cin, **common)
        else:
            self.op("CONV_2D", ins, outs, "Conv2DOptions", version=4 if wide else 3, **common)

    def conv_transpose(self, node):
        """ConvTranspose: TRANSPOSE_CONV (inputs: the output's NHWC shape, weights OHWI [C_out, KH, KW, C_in]
        per output channel, the input, optional biases). LiteRT scatters every input pixel's products into
        the full transposed convolution and keeps the output's rows from a head its padding computes on the
        output's size (0 for VALID); ONNX crops ``pads`` head and tail and pads ``output_padding`` at the
        tail, biases only. Where SAME or VALID gives the node's head pads, the output is the node's; else
        VALID on the whole transposed convolution (grown by ``output_padding``), then a STRIDED_SLICE (a copy
        of codes) crops the pads."""
        from tflite.Padding import Padding

        g, a = self.g, node.attrs
        x, wname, y = node.inputs[0], node.inputs[1], node.outputs[0]
        if len(self.dims(x)) != 4:
            _refuse(node, "only 2-D transposed convolutions have a TFLite builtin (TRANSPOSE_CONV)")
        if a["group"] != 1:
            _refuse(node, f"TFLite's TRANSPOSE_CONV has no groups (group {a['group']})")
        if any(d != 1 for d in a["dilations"]):
            _refuse(node, f"TFLite's TRANSPOSE_CONV has no dilations (dilations {list(a['dilations'])})")
        xq, yq = self.qp(x), self.qp(y)
        wq = g.values[wname].quant
        if wq.dtype != "int8" or np.any(wq.zero_point != 0):
            _refuse(node, "TFLite's int8 TRANSPOSE_CONV takes symmetric int8 weights (zero point 0)")
        w = self.stored(node, "weight").astype(np.int8)  # [C_in, C_out, KH, KW]
        cout = w.shape[1]
        wscale = np.broadcast_to(wq.scale, (cout,))
        real = np.float64(xq.scale) * wscale.astype(np.float64) / np.float64(yq.scale)
        wide = yq.dtype == "int16"
        self.check_multiplier(node, "", real, wide=wide)
        if wide != ("single_rounding" in node.quant):  # LiteRT's int8 kernel rounds twice, its 16x8 one once
            kernel, rounds = ("16x8", "once") if wide else ("int8", "twice")
            _refuse(node, f"LiteRT's {kernel} TRANSPOSE_CONV rounds {rounds}, this node's requantization does not "
                          f"({self.remedy()})")
        act = self.fused(node, yq)
        k, s, pads = a["kernel_shape"], a["strides"], a["pads"]
        n, c, h, w_ = self.dims(y)
        in_hw = self.dims(x)[2:]
        heads = list(pads[:2])

        def crops(p, sizes):
            return [transpose_conv_crop(p, sz, i, kk, ss) for sz, i, kk, ss in zip(sizes, in_hw, k, s)]

        size = (h, w_)
        padding = next((p for p in (Padding.VALID, Padding.SAME) if crops(p, size) == heads), None)
        if padding is None:  # VALID on the whole transposed convolution (and the output padding), then a crop
            full = [(i - 1) * ss + kk for i, kk, ss in zip(in_hw, k, s)]
            padding, size = Padding.VALID, tuple(max(o + hd, f) for o, hd, f in zip((h, w_), heads, full))
            if crops(padding, size) != [0, 0]:
                _refuse(node, f"pads {list(pads)} and output_padding {list(a['output_padding'])} are no crop of "
                              f"TFLite's TRANSPOSE_CONV output")
        wdata = w.transpose(1, 2, 3, 0)  # OHWI
        wt = self.const(wname, wdata, "int8", TensorQuant(wscale, np.zeros(cout, np.int64), 0))
        xt, bt, wide = self.compute_io(node, self.activation(x), xq, wscale, cout, optional_bias=True)
        shape = (n, size[0], size[1], c)
        out = self.activation(y) if size == (h, w_) else self.new_tensor(f"{y}::uncropped", shape, self.qp(y))
        ins = [self.int32s(f"{node.name}::output_shape", shape), wt, xt] + ([bt] if bt is not None else [])
        fields = dict(Padding=padding, StrideH=s[0], StrideW=s[1])
        if act:
            fields["FusedActivationFunction"] = act
        # versions: 2 int8 (16x8 with int64 biases too), 3 with a bias input, 4 with a fused activation
        self.op("TRANSPOSE_CONV", ins, [out], "TransposeConvOptions",
                version=4 if act else 3 if bt is not None else 2, **fields)
        if out != self.activation(y):
            self.op("STRIDED_SLICE", [out, self.int32s(f"{y}::begin", (0, heads[0], heads[1], 0)),
                                      self.int32s(f"{y}::end", (n, heads[0] + h, heads[1] + w_, c)),
                                      self.int32s(f"{y}::strides", (1, 1, 1, 1))],
                    [self.activation(y)], "StridedSliceOptions", version=4, BeginMask=0, EndMask=0,
                    EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0, Offset=False)

    def matmul(self, node):
        """A MatMul with a constant weight is a FULLY_CONNECTED (the quantizer's compute kind), one of
        two activations a BATCH_MATMUL."""
        if "weight" in node.quant:
            return self.gemm(node)
        return tensor_ops.batch_matmul(self, node)

    def gemm(self, node):
        """Gemm, or MatMul by a constant [K, N] matrix: FULLY_CONNECTED; an input of rank > 2 keeps its
        leading dimensions (KeepNumDims), taken in the IR's order."""
        g, a = self.g, node.attrs
        if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
            _refuse(node, "FULLY_CONNECTED has no transA, alpha or beta")
        x, wname = node.inputs[0], node.inputs[1]
        if len(self.dims(wname)) != 2:
            _refuse(node, "FULLY_CONNECTED takes one weight matrix (a constant of rank 2)")
        xq, yq, wq = self.qp(x), self.qp(node.outputs[0]), g.values[wname].quant
        if wq.dtype != "int8" or np.any(wq.zero_point != 0):
            _refuse(node, "TFLite's int8 FULLY_CONNECTED takes symmetric int8 weights (zero point 0)")
        w = self.stored(node, "weight").astype(np.int8)
        w = w if a.get("transB", 0) else w.T  # TFLite: [units, depth] (a MatMul's weight is [depth, units])
        units = w.shape[0]
        real = np.float64(xq.scale) * wq.scale.astype(np.float64) / np.float64(yq.scale)
        self.check_multiplier(node, "", real, wide=yq.dtype == "int16")
        if "single_rounding" not in node.quant:
            _refuse(node, f"LiteRT's FULLY_CONNECTED rounds once; this node was quantized to round twice "
                          f"({self.remedy()})")
        act = self.fused(node, yq)
        wt = self.const(wname, w, "int8", TensorQuant(np.atleast_1d(wq.scale), np.zeros(wq.scale.size, np.int64), 0))
        keep = len(self.dims(x)) > 2
        xt, bt, wide = self.compute_io(node, self.ir_shaped(x) if keep else self.nchw_order(x), xq, wq.scale, units)
        tensor_ops.write_in_ir_order(self, node.outputs[0], lambda out: self.op(
            "FULLY_CONNECTED", [xt, wt, bt], [out], "FullyConnectedOptions",
            version=7 if wide else 5 if wq.per_channel else 4, FusedActivationFunction=act, KeepNumDims=keep))

    def operand(self, node, k: int) -> int:
        """Operand k of an elementwise op: an activation, or a constant stored as codes
        (broadcast shape moved to NHWC beside a 4-D output)."""
        name = node.inputs[k]
        if f"input{k}" not in node.quant:
            if len(self.g.values[name].shape) != len(self.g.values[node.outputs[0]].shape):
                _refuse(node, "operands of different rank")
            return self.activation(name)
        p = self.qp(name)
        codes = self.stored(node, f"input{k}").astype(np.int64)
        if self.g.values[name].quant.dtype == "uint8":
            codes = codes - 128
        if self.g.values[node.outputs[0]].quant.dtype == "int16":  # a 16x8 op: int16 codes, zero point 0
            codes, p = codes - p.zero_point.astype(np.int64), QParams("int16", p.scale, np.zeros_like(p.zero_point),
                                                                          p.axis)
        if len(self.g.values[node.outputs[0]].shape) == 4:
            codes = codes.reshape((1,) * (4 - codes.ndim) + codes.shape).transpose(_NCHW_TO_NHWC)
        return self.const(f"{node.name}::input{k}", codes, p.dtype, self.quant(p))

    def add(self, node):
        qs = [self.qp(i) for i in node.inputs[:2]]
        yq = self.qp(node.outputs[0])
        wide = yq.dtype == "int16"  # LiteRT's int16 ADD / SUB with general scales (quant/tflite_16x8.py)
        want_shift = ADD_LEFT_SHIFT_16 if wide else TFLITE_ADD_LEFT_SHIFT
        if "multiplierout" not in node.quant or int(self.stored(node, "left_shift")) != want_shift:
            _refuse(node, f"it was quantized with npuforge's own Add arithmetic, not TFLite's ({self.remedy()})")
        reals = (add_multipliers_16 if wide else tflite_add_multipliers)(qs[0].scale, qs[1].scale, yq.scale)
        for role, real in reals.items():
            self.check_multiplier(node, role, real)
        extra = dict(PotScaleInt16=False) if wide else {}
        self.op("ADD" if node.op == "Add" else "SUB", [self.operand(node, 0), self.operand(node, 1)],
                [self.activation(node.outputs[0])], "AddOptions" if node.op == "Add" else "SubOptions",
                version=3 if wide else 2, FusedActivationFunction=0, **extra)

    def mul(self, node):
        qs = [self.qp(i) for i in node.inputs[:2]]
        yq = self.qp(node.outputs[0])
        self.check_multiplier(node, "", tflite_mul_multiplier(qs[0].scale, qs[1].scale, yq.scale))
        self.op("MUL", [self.operand(node, 0), self.operand(node, 1)], [self.activation(node.outputs[0])],
                "MulOptions", version=4 if yq.dtype == "int16" else 2, FusedActivationFunction=0)

    def squared_difference(self, node):
        """SquaredDifference (from an int8 .tflite): SQUARED_DIFFERENCE again, its integers LiteRT's."""
        if "multiplierout" not in node.quant:
            _refuse(node, "it has no integer multipliers (it was kept in float)")
        self.op("SQUARED_DIFFERENCE", [self.operand(node, 0), self.operand(node, 1)],
                [self.activation(node.outputs[0])])

    def div(self, node):
        _refuse(node, "a Div by a computed value is written as a table of 1 / d and MUL only when quantized "
                      "with --target tflite (LiteRT's int8 DIV is not exact)")

    def minmax(self, node):
        """Max / Min of activations, and a Clip whose bounds are computed: MAXIMUM / MINIMUM, which
        compare codes, so every operand must be on the output's grid (``--target tflite`` shares it;
        npuforge's rule then requantizes by 1, i.e. compares the codes too). A constant operand is
        its stored codes on that grid; a Clip is MAXIMUM with its low bound, then MINIMUM with its high."""
        y = node.outputs[0]
        yq = self.qp(y)
        operand = lambda k: self.grid_operand(node, k)  # noqa: E731
        steps = [("MAXIMUM" if node.op == "Max" else "MINIMUM", k) for k in range(1, len(node.inputs))] \
            if node.op != "Clip" else [(op, k) for op, k in (("MAXIMUM", 1), ("MINIMUM", 2))
                                       if k < len(node.inputs) and node.inputs[k]]
        current = operand(0)
        for i, (op, k) in enumerate(steps):
            out = self.activation(y) if i == len(steps) - 1 else self.new_tensor(f"{node.name}::{i}", self.shape(y), yq)
            self.op(op, [current, operand(k)], [out], "MaximumMinimumOptions", version=2)
            current = out

    def grid_operand(self, node, k: int) -> int:
        """Operand k of a minmax-kind node (Max, Min, a Clip with computed bounds, Where), which
        selects codes: an activation on the output's grid, or a constant's stored output codes."""
        name, y = node.inputs[k], node.outputs[0]
        yq, rank = self.qp(y), len(self.g.values[y].shape)
        if f"input{k}" in node.quant:
            codes = self.stored(node, f"input{k}").astype(np.int64)
            codes = codes - 128 if self.g.values[y].quant.dtype == "uint8" else codes
            if rank == 4 and codes.ndim:
                codes = codes.reshape((1,) * (4 - codes.ndim) + codes.shape).transpose(_NCHW_TO_NHWC)
            return self.const(f"{node.name}::input{k}", codes, yq.dtype, self.quant(yq))
        if not self.qp(name).same_as(yq):
            _refuse(node, f"operand '{name}' is not on the output's grid, and {node.op} selects codes "
                          f"({self.remedy()})")
        if len(self.g.values[name].shape) not in (0, rank):
            _refuse(node, "operands of different rank")
        return self.activation(name)

    def clip(self, node):
        computed = any(name and not self.g.values[name].is_const for name in node.inputs[1:3])
        return self.minmax(node) if computed else self.activation_op(node)

    def mean(self, node):
        x = node.inputs[0]
        rank = len(self.dims(x))
        if node.op == "ReduceMean":
            axes = sorted(int(v) % rank for v in np.asarray(self.g.values[node.inputs[1]].data).reshape(-1))
        else:
            axes = list(range(2, rank))
        xq, yq = self.qp(x), self.qp(node.outputs[0])
        if "divisor" not in node.quant or int(self.stored(node, "divisor")) != 1 or \
                int(self.stored(node, "extra_bits")) != 0:
            _refuse(node, f"it was quantized with npuforge's own averaging, not TFLite's MEAN ({self.remedy()})")
        count = int(np.prod([self.dims(x)[a] for a in axes]))
        self.check_multiplier(node, "", np.float64(xq.scale) / np.float64(yq.scale), count)
        keep = node.op == "GlobalAveragePool" or bool(node.attrs.get("keepdims", 1))
        tensor_ops.reduce(self, node, "MEAN", axes, keep)

    def pool(self, node):
        from tflite.Padding import Padding

        a = node.attrs
        x, y = node.inputs[0], node.outputs[0]
        xq, yq = self.qp(x), self.qp(y)
        if len(self.g.values[x].shape) != 4 or any(d != 1 for d in a.get("dilations") or [1]):
            _refuse(node, "TFLite pools 4-D tensors without dilations")
        if a.get("ceil_mode", 0) and node.op == "AveragePool":
            _refuse(node, "TFLite's AVERAGE_POOL_2D has no ceil_mode")
        if node.op == "AveragePool" and (not xq.same_as(yq) or "code_average" not in node.quant):
            _refuse(node, f"TFLite's int8 AVERAGE_POOL_2D averages codes on its input's grid ({self.remedy()})")
        k, s = a["kernel_shape"], a["strides"] or [1, 1]
        pads = a["pads"] or [0] * 4
        if a.get("ceil_mode", 0):  # the last windows reach past the input: padded with the lowest code
            from ..ops.registry import get_op

            pads = [max(0, p) for p in get_op("MaxPool").exact_pads(node, self.dims(x))]
        if node.op == "AveragePool" and a.get("count_include_pad", 0) and any(pads):
            # counted padding: the zero point's code padded in (PAD), then every window is whole (VALID)
            padding, xt = Padding.VALID, self.padded(node, x, pads, 0)
        else:  # an average's SAME padding is not counted, as ONNX's count_include_pad=0; other pads refused
            padding, xt = self.padding(node, x, k, s, [1, 1], pads, xq.qmin if node.op == "MaxPool" else None)
        self.op("AVERAGE_POOL_2D" if node.op == "AveragePool" else "MAX_POOL_2D", [xt], [self.activation(y)],
                "Pool2DOptions", version=2, Padding=padding, StrideH=s[0], StrideW=s[1], FilterHeight=k[0],
                FilterWidth=k[1], FusedActivationFunction=0)

    def reshape(self, node):
        x, y = node.inputs[0], node.outputs[0]
        out = self.dims(y)
        src = self.nchw_order(x)
        if len(out) == 4 and out[1] > 1 and out[2] * out[3] > 1:  # NCHW result, then to NHWC
            mid = self.new_tensor(f"{y}::nchw", out, self.qp(y))
            self.op("RESHAPE", [src, self.int32s(f"{y}::shape", out)], [mid], "ReshapeOptions", NewShape=list(out))
            self.op("TRANSPOSE", [mid, self.int32s(f"{y}::perm", _NCHW_TO_NHWC)], [self.activation(y)],
                    "TransposeOptions")
            return
        new = self.shape(y)
        self.op("RESHAPE", [src, self.int32s(f"{y}::shape", new)], [self.activation(y)], "ReshapeOptions",
                NewShape=list(new))

    def transpose(self, node):
        """TRANSPOSE with the permutation moved into the file's layouts (NHWC for 4-D tensors);
        one that leaves the file's element order alone is a RESHAPE."""
        x, y = node.inputs[0], node.outputs[0]
        rank = len(self.dims(x))
        perm = [int(p) % rank for p in (node.attrs.get("perm") or reversed(range(rank)))]
        px = list(_NCHW_TO_NHWC) if rank == 4 else list(range(rank))  # file axis -> IR axis
        py = list(_NCHW_TO_NHWC) if len(self.dims(y)) == 4 else list(range(rank))
        inv_px = np.argsort(px)
        file_perm = [int(inv_px[perm[py[i]]]) for i in range(rank)]
        if file_perm == list(range(rank)):
            self.op("RESHAPE", [self.activation(x), self.int32s(f"{y}::shape", self.shape(y))], [self.activation(y)],
                    "ReshapeOptions", NewShape=list(self.shape(y)))
            return
        self.op("TRANSPOSE", [self.activation(x), self.int32s(f"{node.name}::perm", file_perm)], [self.activation(y)],
                "TransposeOptions", version=2)

    def concat(self, node):
        rank = len(self.g.values[node.outputs[0]].shape)
        axis = node.attrs["axis"] % rank
        self.op("CONCATENATION", [self.activation(i) for i in node.inputs], [self.activation(node.outputs[0])],
                "ConcatenationOptions", version=2, Axis=_NHWC_AXIS[axis] if rank == 4 else axis,
                FusedActivationFunction=0)

    def pad(self, node):
        x, y = node.inputs[0], node.outputs[0]
        if node.attrs.get("mode", "constant") != "constant":
            _refuse(node, f"pad mode {node.attrs['mode']}")
        pads = np.asarray(self.g.values[node.inputs[1]].data).reshape(-1).astype(np.int64)
        if len(node.inputs) > 2 and node.inputs[2] and float(np.asarray(self.g.values[node.inputs[2]].data)) != 0.0:
            _refuse(node, "TFLite's PAD fills with the zero point (pad value 0.0)")
        rank = len(pads) // 2
        table = np.stack([pads[:rank], pads[rank:]], axis=1)
        if rank == 4:
            table = table[list(_NCHW_TO_NHWC)]
        self.op("PAD", [self.activation(x), self.const(f"{node.name}::pads", table, "int32")], [self.activation(y)],
                "PadOptions", version=2)

    def activation_op(self, node):
        """Relu / Clip / Sigmoid / Tanh / HardSwish: TFLite's own kernel, whose table must be
        the node's stored one (the quantizer fills it with TFLite's arithmetic)."""
        from ..quant.tflite_tables import RELU_KINDS, clip_bounds, fixed_output, tflite_table

        x, y = node.inputs[0], node.outputs[0]
        xp, yp = self.g.values[x].quant, self.g.values[y].quant
        if "int16" in (xp.dtype, yp.dtype):  # an int8 -> int16 table: no builtin takes it, GATHER does
            return self.table(node)
        if node.op in ("Relu", "Clip"):
            kind = RELU_KINDS.get(clip_bounds(self.g, node))
            if kind is None:  # bounds of no TFLite builtin: its table
                return self.table(node)
            name = {"Relu": "RELU", "Relu6": "RELU6", "ReluN1To1": "RELU_N1_TO_1"}[kind]
        elif node.op == "LeakyRelu":
            name = "LEAKY_RELU"
        else:
            name = {"Sigmoid": "LOGISTIC", "Tanh": "TANH", "HardSwish": "HARD_SWISH"}[node.op]
            fixed = fixed_output(node.op, yp.dtype)
            if fixed is not None and not fixed.same_as(yp):  # no builtin computes it: its table does
                return self.table(node)
        want = tflite_table(self.g, node, xp, yp)
        if want is not None and not np.array_equal(self.stored(node, "lut").astype(np.int64), want):
            return self.table(node)  # another table than TFLite's kernel computes: written as it is
        if name == "LEAKY_RELU":
            self.op(name, [self.activation(x)], [self.activation(y)], "LeakyReluOptions", version=2,
                    Alpha=float(node.attrs["alpha"]))
            return
        self.op(name, [self.activation(x)], [self.activation(y)], version=1 if name in ("HARD_SWISH", "RELU_N1_TO_1")
                else 2)

    def strided_slice(self, node, y: str, ranges: dict) -> None:
        """``y`` = STRIDED_SLICE of the node's input: ``ranges`` maps an IR axis to (first index, step,
        count); the other axes are whole. A copy of codes: the output shares the input's grid."""
        x = node.inputs[0]
        dims = self.dims(x)
        rank = len(dims)
        to_file = list(_NCHW_TO_NHWC) if rank == 4 else list(range(rank))  # file axis -> IR axis
        begin, end, strides, end_mask = [], [], [], 0
        for k, axis in enumerate(to_file):
            first, step, count = ranges.get(axis, (0, 1, dims[axis]))
            last = first + step * count  # one past the last index taken, in the step's direction
            begin.append(first)
            strides.append(step)
            if last < 0:  # a negative step down to index 0: 'to the end' is the mask, not -1
                end.append(0)
                end_mask |= 1 << k
            else:
                end.append(last)
        self.op("STRIDED_SLICE", [self.activation(x), self.int32s(f"{y}::begin", begin),
                                  self.int32s(f"{y}::end", end), self.int32s(f"{y}::strides", strides)],
                [self.activation(y)], "StridedSliceOptions", version=4, BeginMask=0, EndMask=end_mask,
                EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0, Offset=False)

    def slice(self, node):
        from ..ops.registry import get_op

        values = [None if not i else np.asarray(self.g.values[i].data).reshape(-1) for i in node.inputs[1:]]
        ranges = {}
        for axis, idx in get_op("Slice").indices(node, self.dims(node.inputs[0]), values):
            step = idx[1] - idx[0] if len(idx) > 1 else 1
            ranges[axis] = (idx[0] if idx else 0, step, len(idx))
        self.strided_slice(node, node.outputs[0], ranges)

    def split(self, node):
        rank = len(self.dims(node.inputs[0]))
        axis = node.attrs["axis"] % rank
        first = 0
        for y in node.outputs:  # each part a slice of the sizes the shape rule gave the outputs
            size = self.dims(y)[axis]
            self.strided_slice(node, y, {axis: (first, 1, size)})
            first += size

    def table(self, node):
        """Any lookup-table node, exactly, from builtins: its input codes widened to int32 (CAST), moved
        to table indices (ADD 128, or 32768 for int16) and looked up in its stored table (GATHER; the
        table carries the output's parameters, which GATHER passes on)."""
        x, y = node.inputs[0], node.outputs[0]
        xp, yp = self.qp(x), self.qp(y)
        if "lut" not in node.quant:
            _refuse(node, "it has no table (it was kept in float)")
        table = self.stored(node, "lut").astype(np.int64)
        if self.g.values[y].quant.dtype == "uint8":
            table = table - 128  # the file's int8 codes of the same reals
        offset = 128 if xp.dtype == "int8" else 32768  # file code -> table index (code - qmin)
        if len(table) != (256 if xp.dtype == "int8" else 65536):
            _refuse(node, f"a {len(table)}-entry table for {xp.dtype} input codes")
        wide = self.w.tensor(f"{node.name}::codes", self.shape(x), "int32")
        index = self.w.tensor(f"{node.name}::index", self.shape(x), "int32")
        self.op("CAST", [self.activation(x)], [wide], version=2)
        self.op("ADD", [wide, self.int32s(f"{node.name}::offset", [offset])], [index], "AddOptions", version=4,
                FusedActivationFunction=0)
        lut = self.const(f"{node.name}::table", table, self.qp(y).dtype, self.quant(yp))
        self.op("GATHER", [lut, index], [self.activation(y)], "GatherOptions", version=2, Axis=0, BatchDims=0)

    def prelu(self, node):
        """PRelu with a constant slope: PRELU, whose int8 kernel (two requantizations, the alpha's codes
        with their own scale) is npuforge's PRelu rule under TFLite's arithmetic (quant/prelu_rule.py);
        the slope's codes broadcast in the file's layout."""
        x, a = node.inputs
        v = self.g.values[a]
        if not v.is_const or v.quant is None or v.quant.per_channel or v.quant.dtype != "int8":
            _refuse(node, "its slope is not a constant with one int8 scale (quantize with --target tflite)")
        rank = len(self.dims(x))
        codes = v.quant.quantize(v.data).astype(np.int64)
        codes = codes.reshape((1,) * (rank - codes.ndim) + codes.shape)
        if rank == 4:
            codes = codes.transpose(_NCHW_TO_NHWC)
        alpha = self.const(f"{node.name}::alpha", np.ascontiguousarray(codes), "int8", self.quant(v.quant))
        self.op("PRELU", [self.activation(x), alpha], [self.activation(node.outputs[0])])

    def resize(self, node):
        """Nearest Resize: RESIZE_NEAREST_NEIGHBOR, with the one (align_corners, half_pixel_centers)
        whose source index of every output row and column equals the IR op's."""
        from ..ops.registry import get_op

        import torch

        x, y = node.inputs[0], node.outputs[0]
        (n, c, h, w), (_, _, oh, ow) = self.dims(x), self.dims(y)
        if (n, c) != tuple(self.dims(y)[:2]):
            _refuse(node, "TFLite resizes H and W only")
        if node.attrs["mode"] == "linear":
            if "half_pixel_centers" not in node.quant:
                _refuse(node, "this linear Resize has no integer rule (it runs in float)")
            self.op("RESIZE_BILINEAR", [self.activation(x), self.int32s(f"{node.name}::size", (oh, ow))],
                    [self.activation(y)], "ResizeBilinearOptions", version=3,
                    AlignCorners=bool(self.stored(node, "align_corners")),
                    HalfPixelCenters=bool(self.stored(node, "half_pixel_centers")))
            return
        probe = torch.arange(h * w, dtype=torch.float32).reshape(1, 1, h, w)
        extra = [None if not i else torch.from_numpy(np.array(self.g.values[i].data)) for i in node.inputs[1:]]
        src = get_op("Resize").forward(node, [probe, *extra])[0][0, 0].numpy().astype(np.int64)
        rows, cols = src[:, 0] // w, src[0, :] % w
        for align, half in ((False, False), (False, True), (True, False)):
            if np.array_equal(_tflite_nearest(h, oh, align, half), rows) and \
                    np.array_equal(_tflite_nearest(w, ow, align, half), cols):
                self.op("RESIZE_NEAREST_NEIGHBOR", [self.activation(x), self.int32s(f"{node.name}::size", (oh, ow))],
                        [self.activation(y)], "ResizeNearestNeighborOptions", version=3, AlignCorners=align,
                        HalfPixelCenters=half)
                return
        _refuse(node, "its source pixels match none of TFLite's nearest-neighbour modes")

    def softmax(self, node):
        from ..quant.tflite_tables import fixed_output

        yp = self.g.values[node.outputs[0]].quant
        if "tflite_softmax" not in node.quant or not fixed_output("Softmax", yp.dtype).same_as(yp):
            _refuse(node, f"it was quantized with npuforge's own Softmax, not TFLite's ({self.remedy()})")
        tensor_ops.softmax(self, node)

    HANDLERS = {"Conv": conv, "ConvTranspose": conv_transpose, "Gemm": gemm, "MatMul": matmul, "Add": add, "Sub": add, "Mul": mul, "Div": div, "SquaredDifference": squared_difference, "GlobalAveragePool": mean,
                "ReduceMean": mean, "AveragePool": pool, "MaxPool": pool, "Flatten": reshape, "Reshape": reshape,
                "Squeeze": reshape, "Unsqueeze": reshape, "Concat": concat, "Pad": pad, "Relu": activation_op,
                "Clip": clip, "Max": minmax, "Min": minmax, "LeakyRelu": activation_op, "PRelu": prelu, "Sigmoid": activation_op, "Tanh": activation_op, "HardSwish": activation_op,
                "Resize": resize, "Softmax": softmax, "Transpose": transpose, "Slice": slice, "Split": split,
                "Gather": lambda self, node: tensor_ops.gather(self, node),
                "ReduceMax": lambda self, node: tensor_ops.reduce_select(self, node),
                "ReduceMin": lambda self, node: tensor_ops.reduce_select(self, node),
                "Tile": lambda self, node: tensor_ops.tile(self, node),
                "Expand": lambda self, node: tensor_ops.expand(self, node),
                "Where": lambda self, node: tflite_select.select(self, node),
                "SequenceLSTM": lambda self, node: tflite_lstm.sequence_lstm(self, node),
                **dict.fromkeys(tflite_select.COMPARISONS, lambda self, node: tflite_select.comparison(self, node))}

    # -- graph -------------------------------------------------------------------------
    def boundary(self, name: str, output: bool) -> int:
        if self.io == "int8" or self.g.values[name].quant is None:  # (integer ids stay int32)
            return self.activation(name)
        t = self.w.tensor(f"{name}::float", self.shape(name), "float32")
        if output:
            self.op("DEQUANTIZE", [self.activation(name)], [t], version=2)
        else:
            self.op("QUANTIZE", [t], [self.activation(name)], version=2)
        return t

    def run(self) -> bytes:
        g = self.g
        inputs = [self.boundary(name, output=False) for name in g.inputs]
        for node in g.nodes:
            handler = self.HANDLERS.get(node.op)
            if handler is None and "lut" in (node.quant or {}):  # any elementwise op quantized as a table
                handler = _Exporter.table
            if handler is None:
                _refuse(node, "no TFLite mapping for this op yet (docs/tflite.md lists the ops written)")
            if not node.quant and node.op not in ("Flatten", "Reshape", "Squeeze", "Unsqueeze", "Concat", "Pad",
                                                  "MaxPool", "Resize", "Transpose", "Slice", "Split", "Gather",
                                                  "ReduceMax", "ReduceMin", "Tile", "Expand",
                                                  *tflite_select.COMPARISONS):
                _refuse(node, "it was kept in float")
            handler(self, node)
        outputs = [self.boundary(name, output=True) for name in g.outputs]
        return self.w.finish(inputs, outputs, description=f"npuforge int8 export of {g.name}")


def to_tflite(graph, io: str = "int8") -> bytes:
    """The quantized IR ``graph`` as the bytes of a full-integer int8 ``.tflite`` model."""
    from .tflite_rewrite import for_tflite

    return _Exporter(for_tflite(graph), io).run()
