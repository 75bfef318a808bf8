"""How each TFLite builtin becomes IR nodes: the operator rules of the TFLite importer
(:mod:`npuforge.frontend.tflite_importer`, whose ``_Importer`` they are mixed into and
whose value, layout and node helpers they call), and the layout conventions both share.

Each rule takes the operator's input tensor indices (omitted trailing inputs dropped),
its output tensor index and its options table, emits IR nodes and binds the output
tensor to its IR value. In an int8 model the Conv / Gemm rule also stores the integers
the quantizer would, from the file's codes; the other ops get theirs from the
quantizer's own rules once the graph is built.
"""

from __future__ import annotations

import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType as Act
from tflite.Padding import Padding

from ..errors import ModelFormatError
from ..quant.tflite_elementwise import gelu_table, quantize_integers as squared_difference_integers, rsqrt_table, \
    unary_table
from ..quant.tflite_softmax import input_real
from ..quant.tflite_tables import activation_range
from ..sim.integer_elementwise import tflite_sum_scale_bias
from ..quant.config import QuantConfig
from ..quant.params import QParams
from ..quant.quantize import _add_int, _quantize_node, _requant

TO_IR = (0, 3, 1, 2)  # np.transpose perm: an NHWC array -> NCHW
TO_FILE = (0, 2, 3, 1)  # NCHW -> NHWC
IR_AXIS = (0, 2, 3, 1)  # NHWC axis k is NCHW axis IR_AXIS[k]
# a fused activation as the IR's Conv / Gemm attributes and as TFLite's range kind (activation_range)
_FUSED = {Act.RELU: ("Relu", [], "Relu"), Act.RELU6: ("Clip", [0.0, 6.0], "Relu6"),
          Act.RELU_N1_TO_1: ("Clip", [-1.0, 1.0], "ReluN1To1")}
TFLITE_CONFIG = dict(activation_dtype="int8", tflite_multipliers=True)
_ACTIVATIONS = {v for k, v in vars(Act).items() if not k.startswith("_")}  # the schema's enum


def ir_shape(shape) -> tuple:
    return tuple(shape[i] for i in TO_IR) if len(shape) == 4 else tuple(shape)


def orders_differ(nhwc) -> bool:
    """Whether an NHWC tensor's element order differs from its NCHW permutation's."""
    return len(nhwc) == 4 and nhwc[3] > 1 and nhwc[1] * nhwc[2] > 1


class OperatorRules:
    # -- the file's attribute values (a corrupt file can hold any) ------------------------------
    def bad(self, what: str):
        raise ModelFormatError(f"{self.where}: {self.at} has {what}; the file may be corrupt")

    def at_least_1(self, name: str, values: list) -> list:
        if any(v < 1 for v in values):
            self.bad(f"{name} {values} (each must be at least 1)")
        return values

    def padding(self, code: int) -> int:
        if code not in (Padding.SAME, Padding.VALID):
            self.bad(f"the padding code {code} (SAME is {Padding.SAME}, VALID {Padding.VALID})")
        return code

    def weights(self, i: int, rank: int, what: str) -> np.ndarray:
        """A constant weight tensor of this rank, no dimension 0 (its dims divide others)."""
        w = self.const(i, what)
        if w.ndim != rank or 0 in w.shape:
            self.bad(f"{what} of shape {list(w.shape)}; they must be {rank}-D and not empty")
        return w

    # -- activations -----------------------------------------------------------------------
    def fused_form(self, code: int) -> tuple:
        """(IR op / Conv activation, its params, TFLite's range kind) of a fused activation."""
        if code not in _ACTIVATIONS:
            self.bad(f"the fused activation code {code}, which TFLite does not define")
        if code not in _FUSED:
            self.refuse(f"has the fused activation {code} (TANH or SIGN_BIT), which npuforge does not import")
        return _FUSED[code]

    def activation(self, x: str, code: int, o: int, out: str | None, standalone: bool = False) -> str:
        """A fused activation (or a RELU operator: ``standalone``) as a Relu / Clip node; in an int8
        model its table is the quantizer's, TFLite's integer kernel (see ``integers``)."""
        if code == Act.NONE:
            return x
        op, bounds, _ = self.fused_form(code)
        ins = [x] + [self.add_const(f"{self.base}::{k}", np.float32(b)) for k, b in zip(("min", "max"), bounds)]
        return self.emit(op, ins, out=out, quant=self.activation_q(o),
                         suffix=None if standalone else op.lower()).outputs[0]

    def with_activation(self, code: int, o: int, op: str, inputs: list, attrs: dict | None = None,
                        computed_shape: tuple | None = None):
        """The op's node, then its fused activation; binds tensor o (``computed_shape``: the file shape
        the op computes, reshaped to o's after it: FULLY_CONNECTED's keep_num_dims)."""
        out = self.fresh(self.tname(o)) if computed_shape is None else None
        q = self.activation_q(o)
        node = self.emit(op, inputs, attrs, None if code != Act.NONE else out, q)
        y = self.activation(node.outputs[0], code, o, out)
        if computed_shape is not None:
            y = self.reshape(y, computed_shape, self.file_shape(o), q, self.fresh(self.tname(o)))
        self.bind(o, y)
        return node

    def compute(self, o: int, x: int, op: str, inputs: list, attrs: dict, code: int, weight: np.ndarray,
                w_tensor: int, bias: int, w_axis: int, computed_shape: tuple | None = None,
                ir_axis: int = 0) -> None:
        """Conv / Gemm / ConvTranspose: float weights (or int8 codes with the quantizer's integers) in IR
        layout; ``w_axis`` the output channels' axis in the file's weights, ``ir_axis`` in the IR's."""
        qx, qy = self.activation_q(x), self.activation_q(o)
        wq = None
        if qy is not None:
            p = self.qparams(w_tensor)
            if self.dtype(w_tensor) != "int8" or p is None or np.any(p.zero_point != 0):
                self.refuse("has weights that are not symmetric int8 (zero point 0)")
            wq = QParams("int8", p.scale, p.zero_point, ir_axis if p.per_channel else None)
            if p.per_channel and p.axis != w_axis:
                self.refuse(f"quantizes its weights along axis {p.axis}, not the output channels")
            codes, weight = weight, wq.dequantize(weight)
        elif weight.dtype != np.float32:
            self.refuse(f"has {weight.dtype} weights in a float model (a hybrid model); npuforge imports "
                        f"float and fully int8 models")
        inputs = inputs + [self.add_const(self.tname(w_tensor), weight, wq)]
        bias_codes = None
        if bias >= 0:
            b, bq = self.const(bias, "biases"), None
            if wq is not None:  # int32 codes at scale s_x * s_w (LiteRT reads no other)
                bscale = (np.float64(qx.scale) * wq.scale.astype(np.float64)).astype(np.float32)
                bq = QParams("int32", bscale, np.zeros(bscale.shape, np.int32), 0 if wq.per_channel else None)
                bias_codes, b = b.astype(np.int32), bq.dequantize(b)
            inputs.append(self.add_const(self.tname(bias), b.astype(np.float32), bq))
        fused = qy is not None and code != Act.NONE  # int8: saturation of the Conv / Gemm itself
        if fused:
            act, params, kind = self.fused_form(code)
            attrs = dict(attrs, activation=act, activation_params=list(params))
        node = self.with_activation(Act.NONE if fused else code, o, op, inputs, attrs, computed_shape)
        if qy is None:
            return
        g = self.graph
        _add_int(g, node, "weight", codes.astype(np.int8))
        if bias_codes is not None:
            _add_int(g, node, "bias", bias_codes)
        real = np.float64(qx.scale) * wq.scale.astype(np.float64) / np.float64(qy.scale)
        _requant(g, node, "", real, QuantConfig(**TFLITE_CONFIG))
        if op == "Gemm":  # LiteRT's FULLY_CONNECTED rounds once (as the quantizer stores it)
            _add_int(g, node, "single_rounding", np.asarray(1, np.int32))
        if fused:
            lo, hi = activation_range(kind, qy)
            _add_int(g, node, "act_min", np.asarray(lo, np.int32))
            _add_int(g, node, "act_max", np.asarray(hi, np.int32))

    # -- operators ------------------------------------------------------------------------
    def conv(self, ins, o, opt, depthwise: bool):
        x, w_i = ins[0], ins[1]
        w = self.weights(w_i, 4, "weights")
        if len(self.file_shape(x)) != 4:
            self.bad(f"an input of shape {list(self.file_shape(x))}; it must be 4-D (NHWC)")
        cin = self.file_shape(x)[3]
        if depthwise:  # [1, KH, KW, C * M] -> [C * M, 1, KH, KW]
            weight, group, w_axis = w.transpose(3, 0, 1, 2), cin, 3
        else:  # OHWI -> OIHW (I < C: a grouped convolution)
            weight, group, w_axis = w.transpose(0, 3, 1, 2), cin // w.shape[3], 0
        kernel = [w.shape[1], w.shape[2]]
        strides = self.at_least_1("strides", [opt.StrideH(), opt.StrideW()])
        # 0 reads as 1 (the schema's default) for files that write the field as 0
        dilations = self.at_least_1("dilations", [opt.DilationHFactor() or 1, opt.DilationWFactor() or 1])
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group,
                 "pads": self.pads(self.padding(opt.Padding()), x, kernel, strides, dilations)}
        self.compute(o, x, "Conv", [self.value(x)], attrs, opt.FusedActivationFunction(), weight, w_i,
                     ins[2] if len(ins) > 2 else -1, w_axis)

    def transpose_conv(self, ins, o, opt):
        """TRANSPOSE_CONV (inputs: the output's NHWC shape, weights [O, KH, KW, I], the input, an optional
        bias): the full transposed convolution, of which LiteRT keeps the output's rows from a head
        its padding computes on the output's size (0 for VALID; the export's ``transpose_conv_crop``);
        the IR's ConvTranspose with that head and the rest cropped, or ``output_padding`` where the
        output reaches past the full convolution (bias only there)."""
        from ..export.tflite_export import transpose_conv_crop

        if len(ins) < 3:
            self.bad(f"{len(ins)} inputs (TRANSPOSE_CONV takes the output shape, the weights and the input)")
        shape_i, w_i, x = ins[:3]
        out = [int(d) for d in self.const(shape_i, "output shape").reshape(-1)]
        shape = self.file_shape(x)
        w = self.weights(w_i, 4, "weights")  # [O, KH, KW, I]
        if len(shape) != 4 or w.shape[3] != shape[3] or tuple(out) != self.file_shape(o) or \
                out[0] != shape[0] or out[3] != w.shape[0]:
            self.bad(f"an input of shape {list(shape)}, weights of shape {list(w.shape)}, an output shape {out} and "
                     f"an output of shape {list(self.file_shape(o))}, which do not agree (NHWC, weights OHWI)")
        padding = self.padding(opt.Padding())
        strides = self.at_least_1("strides", [opt.StrideH(), opt.StrideW()])
        kernel = [w.shape[1], w.shape[2]]
        pads, extra = [0, 0, 0, 0], [0, 0]
        for axis, (size, n, k, st) in enumerate(zip(out[1:3], shape[1:3], kernel, strides)):
            head = transpose_conv_crop(padding, size, n, k, st)
            if head is None:
                self.bad(f"an output of {size} along axis {axis + 1} for an input of {n}, kernel {k} and stride {st} "
                         f"(LiteRT's Prepare refuses it)")
            tail = (n - 1) * st + k - size - head
            pads[axis], pads[axis + 2], extra[axis] = head, max(tail, 0), max(-tail, 0)
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": [1, 1], "group": 1,
                 "output_padding": extra, "pads": pads}
        self.compute(o, x, "ConvTranspose", [self.value(x)], attrs, opt.FusedActivationFunction(),
                     w.transpose(3, 0, 1, 2), w_i, ins[3] if len(ins) > 3 else -1, 0, ir_axis=1)

    def batch_matmul(self, ins, o, opt):
        """BATCH_MATMUL of two activations (attention's scores and context): a MatMul in the file's
        element order (a 4-D operand is moved from the IR's NCHW order back to it, the product to the
        IR's), adj_x / adj_y as Transposes of the last two axes; int8: the matmul kind's one
        requantization by s_a s_b / s_y, rounded twice as LiteRT's kernel does."""
        if opt.AsymmetricQuantizeInputs():
            self.refuse("quantizes its float inputs at run time (the hybrid kernel), which npuforge does not import")
        operands = []
        for i, adj in zip(ins[:2], (opt.AdjX(), opt.AdjY())):
            rank = len(self.file_shape(i))
            if rank < 2:
                self.bad(f"an operand of shape {list(self.file_shape(i))} (BATCH_MATMUL multiplies matrices)")
            if self.quantized and self.data(i) is not None:
                self.refuse("multiplies by a constant, which npuforge imports from FULLY_CONNECTED only")
            x = self.value(i)
            perm = list(TO_FILE) if rank == 4 else list(range(rank))
            if adj:
                perm[-2], perm[-1] = perm[-1], perm[-2]
            operands.append(self.transpose(x, perm))
        out_rank = len(self.file_shape(o))
        if out_rank != 4:
            self.with_activation(Act.NONE, o, "MatMul", operands)
            return
        y = self.emit("MatMul", operands, quant=self.activation_q(o)).outputs[0]
        self.bind(o, self.transpose(y, TO_IR, self.fresh(self.tname(o))))

    def fully_connected(self, ins, o, opt):
        x, w_i = ins[0], ins[1]
        if opt.WeightsFormat() != 0:
            self.refuse("has shuffled weights, which npuforge does not import")
        w = self.weights(w_i, 2, "weights")  # [units, depth]
        src, shape = self.value(x), self.file_shape(x)
        if int(np.prod(shape)) % w.shape[1]:
            self.bad(f"an input of shape {list(shape)}, not a whole number of rows of the weights' depth "
                     f"{w.shape[1]}")
        rows = int(np.prod(shape)) // w.shape[1]
        if shape != (rows, w.shape[1]):  # TFLite flattens the input to [-1, depth], in its element order
            src = self.reshape(src, shape, (rows, w.shape[1]), self.graph.values[src].quant)
        computed = None
        if len(self.file_shape(o)) == 2:
            self.resolve_shape(o, (rows, w.shape[0]))
        if self.file_shape(o) != (rows, w.shape[0]):
            if self.file_shape(o) != tuple(shape[:-1]) + (w.shape[0],):
                self.bad(f"an output of shape {list(self.file_shape(o))} for an input of shape {list(shape)} and "
                         f"{w.shape[0]} units")
            computed = (rows, w.shape[0])  # keep_num_dims: the rows' leading dims again
        self.compute(o, x, "Gemm", [src], {"transB": 1}, opt.FusedActivationFunction(), w, w_i,
                     ins[2] if len(ins) > 2 else -1, 0, computed)

    def elementwise(self, ins, o, opt, op):
        rank = len(self.file_shape(o))
        self.with_activation(opt.FusedActivationFunction(), o, op, [self.value(i, rank) for i in ins])

    def squared_difference(self, ins, o, opt):
        """SQUARED_DIFFERENCE: an int8 file's is LiteRT's own kernel (SquaredDifference, its integers from
        the file's scales); a float file's is Sub and Mul."""
        rank = len(self.file_shape(o))
        a, b = (self.value(i, rank) for i in ins[:2])
        if self.quantized:
            node = self.emit("SquaredDifference", [a, b], out=self.fresh(self.tname(o)), quant=self.activation_q(o))
            squared_difference_integers(self.graph, node, lambda role, data: _add_int(self.graph, node, role, data))
            self.bind(o, node.outputs[0])
            return
        d = self.emit("Sub", [a, b], suffix="difference").outputs[0]
        self.with_activation(Act.NONE, o, "Mul", [d, d])

    def leaky_relu(self, ins, o, opt):
        """LEAKY_RELU; an int8 file's with LiteRT's two requantizations (quant/tflite_tables.py)."""
        self.with_activation(Act.NONE, o, "LeakyRelu", [self.value(ins[0])], {"alpha": float(opt.Alpha())})

    def maximum_minimum(self, ins, o, opt, op):
        """MAXIMUM / MINIMUM of two tensors. LiteRT's int8 kernels compare the codes, so an int8 file's
        operands and output must share one grid (npuforge's rule then compares the codes too)."""
        rank = len(self.file_shape(o))
        if self.quantized:
            yq = self.activation_q(o)
            for i in ins[:2]:
                q = self.qparams(i)
                if q is None or not q.same_as(yq):
                    self.refuse("compares operands quantized unlike its output (LiteRT compares the codes as they "
                                "are), which npuforge does not import")
        self.with_activation(Act.NONE, o, op, [self.value(i, rank) for i in ins[:2]])

    def gelu(self, ins, o, opt):
        """GELU (erf, or the tanh approximation); an int8 file's with LiteRT's table."""
        approximate = bool(opt.Approximate())
        node = self.with_activation(Act.NONE, o, "Gelu", [self.value(ins[0])],
                                    {"approximate": "tanh" if approximate else "none"})
        if self.activation_q(o) is not None:
            _add_int(self.graph, node, "lut", gelu_table(self.activation_q(ins[0]), self.activation_q(o), approximate))

    def rsqrt(self, ins, o, opt):
        """RSQRT: x ^ -0.5 (Pow); an int8 file's with LiteRT's integer table (quant/tflite_elementwise.py)."""
        xq, yq = self.activation_q(ins[0]), self.activation_q(o)
        node = self.with_activation(Act.NONE, o, "Pow", [self.value(ins[0]),
                                                          self.add_const(f"{self.base}::minus_half", np.float32(-0.5))])
        if yq is not None:
            _add_int(self.graph, node, "lut", rsqrt_table(xq, yq))

    def pool(self, ins, o, opt, op):
        kernel = self.at_least_1("a filter size", [opt.FilterHeight(), opt.FilterWidth()])
        strides = self.at_least_1("strides", [opt.StrideH(), opt.StrideW()])
        if len(self.file_shape(ins[0])) != 4:
            self.bad(f"an input of shape {list(self.file_shape(ins[0]))}; it must be 4-D (NHWC)")
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": [1, 1],
                 "pads": self.pads(self.padding(opt.Padding()), ins[0], kernel, strides, [1, 1])}
        self.with_activation(opt.FusedActivationFunction(), o, op, [self.value(ins[0])], attrs)

    def concatenation(self, ins, o, opt):
        values = self.integer_constants(ins)
        if values is not None:  # shape arithmetic: folded at import
            return self.fold(o, np.concatenate([v.reshape(-1) if v.ndim == 0 else v for v in values],
                                               axis=opt.Axis() % max(values[0].ndim, 1)))
        rank = len(self.file_shape(o))
        self.with_activation(opt.FusedActivationFunction(), o, "Concat", [self.value(i) for i in ins],
                             {"axis": self.axis(opt.Axis(), rank)})

    def mean(self, ins, o, opt, op: str = "ReduceMean"):
        """MEAN (REDUCE_MAX / REDUCE_MIN: ``op``) over the file's axes, in the IR's order."""
        shape = self.file_shape(ins[0])
        rank = len(shape)
        axes = sorted({self.axis(int(a), rank) for a in self.const(ins[1], "axes").reshape(-1)})
        x, keep = self.value(ins[0]), bool(opt.KeepDims())
        global_pool = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}.get(op)
        if rank == 4 and axes == [2, 3] and keep and global_pool:
            return self.with_activation(Act.NONE, o, global_pool, [x])
        kept_ir = [a for a in range(rank) if a not in axes]  # the result's axes, in IR order
        kept_file = [a for a in (IR_AXIS if rank == 4 else range(rank)) if a not in axes]
        if keep or kept_ir == kept_file:
            node = self.with_activation(Act.NONE, o, op, [x, self.int64s(f"{self.base}::axes", axes)],
                                        {"keepdims": int(keep)})
        else:
            node = self.emit(op, [x, self.int64s(f"{self.base}::axes", axes)], {"keepdims": 0},
                             quant=self.activation_q(o), suffix="mean")  # then to the file's axis order
            self.bind(o, self.transpose(node.outputs[0], [kept_ir.index(a) for a in kept_file],
                                        self.fresh(self.tname(o))))
        if op == "ReduceSum" and self.quantized:  # LiteRT's float32 arithmetic on the codes' sum
            xq, yq = self.activation_q(ins[0]), self.activation_q(o)
            count = int(np.prod([self.graph.values[x].shape[a] for a in axes]))
            _quantize_node(self.graph, node, "pool", QuantConfig(**TFLITE_CONFIG), [])  # (what a pool carries)
            for role, v in zip(("sum_scale", "sum_bias"), tflite_sum_scale_bias(xq.scale, xq.zero_point, yq.scale,
                                                                                 count)):
                _add_int(self.graph, node, role, np.asarray(v, np.float32).reshape(1).view(np.int32))  # its bits

    def pad(self, ins, o, opt):
        x = ins[0]
        table = self.const(ins[1], "paddings").astype(np.int64)
        rank = len(self.file_shape(x))
        if table.shape != (rank, 2) or np.any(table < 0):
            self.bad(f"the paddings {table.tolist()} for a rank-{rank} input (a [{rank}, 2] table of sizes >= 0)")
        if len(table) == 4:
            table = table[list(TO_IR)]
        inputs = [self.value(x), self.int64s(f"{self.base}::pads", np.concatenate([table[:, 0], table[:, 1]]))]
        if len(ins) > 2 and ins[2] >= 0:  # PADV2: the fill value (int8: a code, as a real number)
            fill = self.const(ins[2], "pad values").reshape(-1)[:1]
            q = self.activation_q(x)
            value = q.dequantize(fill) if q is not None else fill.astype(np.float32)
            inputs.append(self.add_const(f"{self.base}::value", value.reshape(())))
        self.with_activation(Act.NONE, o, "Pad", inputs)

    def reshape_op(self, ins, o, opt):
        target = self.data(ins[1]) if len(ins) > 1 else None
        if target is not None and target.dtype.kind in "iu":  # a new shape given or computed: -1 resolved
            target = [int(d) for d in target.reshape(-1)]
            size = int(np.prod(self.file_shape(ins[0])))
            known = int(np.prod([d for d in target if d != -1]))
            if target.count(-1) <= 1 and known and size % known == 0:
                self.resolve_shape(o, tuple(size // known if d == -1 else d for d in target))
        x = self.value(ins[0])
        self.bind(o, self.reshape(x, self.file_shape(ins[0]), self.file_shape(o), self.activation_q(o),
                                  self.fresh(self.tname(o))))

    def transpose_op(self, ins, o, opt):
        perm = [int(p) for p in self.const(ins[1], "permutations").reshape(-1)]
        if sorted(perm) != list(range(len(self.file_shape(ins[0])))):
            self.bad(f"the permutation {perm} for a rank-{len(self.file_shape(ins[0]))} input")
        if len(perm) == 4:  # in IR terms: to NHWC, the file's perm, back to NCHW
            perm = [TO_FILE[perm[TO_IR[m]]] for m in range(4)]
        self.bind(o, self.transpose(self.value(ins[0]), perm, self.fresh(self.tname(o))))

    def softmax(self, ins, o, opt):
        x = self.value(ins[0])
        if not np.isfinite(opt.Beta()):
            self.bad(f"beta {opt.Beta()}")
        if abs(opt.Beta() - 1.0) > 1e-12:
            if self.quantized:
                self.refuse(f"has beta {opt.Beta()}; npuforge imports int8 SOFTMAX with beta 1 only")
            x = self.emit("Mul", [x, self.add_const(f"{self.base}::beta", np.float32(opt.Beta()))],
                          suffix="beta").outputs[0]
        xq = self.activation_q(ins[0])
        if xq is not None and not input_real(xq.scale) > 1.0:  # (a classifier of random weights: uniform logits)
            self.refuse(f"has an input scale of {float(xq.scale):.3g}, not above the 2^-26 that LiteRT's reference "
                        f"SOFTMAX takes (it aborts there; its optimized kernel reads a float table instead), so "
                        f"npuforge has no integer rule for it")
        rank = len(self.file_shape(o))
        self.with_activation(Act.NONE, o, "Softmax", [x], {"axis": self.axis(-1, rank)})

    def unary(self, ins, o, opt, op):
        self.with_activation(Act.NONE, o, op, [self.value(ins[0])])

    def float_unary(self, ins, o, opt, op):
        """ABS, NEG, EXP, LOG, SQRT, SIN, COS, ELU, SQUARE (x * x) on float tensors: a float model's, or
        the float islands of an int8 one (TensorFlow's converter leaves them in float). On int8 tensors
        ABS, EXP, LOG and SQRT have LiteRT's kernels as tables (quant/tflite_elementwise.py); the others'
        integer kernels are not reproduced."""
        if self.quantized and op not in ("Abs", "Exp", "Log", "Sqrt"):
            self.refuse("on int8 tensors: npuforge reads it in float only (LiteRT's integer kernel for it is not "
                        "reproduced)")
        x = self.value(ins[0])
        node = self.with_activation(Act.NONE, o, *(("Mul", [x, x]) if op == "Square" else (op, [x])))
        if self.quantized:
            _add_int(self.graph, node, "lut", unary_table(op, self.activation_q(ins[0]), self.activation_q(o)))

    def relu(self, ins, o, opt, code):
        self.bind(o, self.activation(self.value(ins[0]), code, o, self.fresh(self.tname(o)), standalone=True))

    def prelu(self, ins, o, opt):
        rank = len(self.file_shape(o))
        self.with_activation(Act.NONE, o, "PRelu", [self.value(ins[0]), self.value(ins[1], rank)])

    def resize(self, ins, o, opt, mode):
        align, half = bool(opt.AlignCorners()), bool(opt.HalfPixelCenters())
        if align and half:
            self.refuse("has both align_corners and half_pixel_centers")
        coords = "align_corners" if align else "half_pixel" if half else "asymmetric"
        # TF's nearest: floor((x + 0.5 * half) * in / out), or round half up with align_corners
        nearest = "round_prefer_ceil" if align or half else "floor"
        if len(self.file_shape(ins[0])) != 4:
            self.bad(f"an input of shape {list(self.file_shape(ins[0]))}; it must be 4-D (NHWC)")
        x = self.value(ins[0])
        n, c = self.graph.values[x].shape[:2]
        size = self.at_least_1("the output size", [int(s) for s in self.const(ins[1], "sizes").reshape(-1)])
        if len(size) != 2:
            self.bad(f"the output size {size} (height and width)")
        self.with_activation(Act.NONE, o, "Resize", [x, "", "", self.int64s(f"{self.base}::sizes", [n, c, *size])],
                             {"mode": mode, "coordinate_transformation_mode": coords, "nearest_mode": nearest})

    def depth_space(self, ins, o, opt, op):
        """DEPTH_TO_SPACE / SPACE_TO_DEPTH: TF's channel order (block row, block column, depth) is DCR."""
        if len(self.file_shape(ins[0])) != 4:
            self.bad(f"an input of shape {list(self.file_shape(ins[0]))}; it must be 4-D (NHWC)")
        b = self.at_least_1("a block size", [opt.BlockSize()])[0]
        attrs = {"blocksize": b, "mode": "DCR"} if op == "DepthToSpace" else {"blocksize": b}
        self.with_activation(Act.NONE, o, op, [self.value(ins[0])], attrs)

    ARITY = {"conv": 2, "fully_connected": 2, "elementwise": 2, "mean": 2, "pad": 2, "transpose_op": 2,
             "prelu": 2, "resize": 2, "strided_slice": 4, "sequence_lstm": 20, "transpose_conv": 3,
             "batch_matmul": 2, "squared_difference": 2, "gather": 2, "reduce_prod": 2,
             "maximum_minimum": 2}  # the rest: 1
    OUTPUTS = {"max_pool_argmax": 2}  # rules of operators with several outputs (the rest have one)
    SPARSE_INPUTS = ("sequence_lstm",)  # rules that read optional inputs anywhere in the list (-1: omitted)

    # builtin -> (method, options table, extra arguments)
    HANDLERS = {
        "CONV_2D": ("conv", "Conv2DOptions", False), "DEPTHWISE_CONV_2D": ("conv", "DepthwiseConv2DOptions", True),
        "FULLY_CONNECTED": ("fully_connected", "FullyConnectedOptions"),
        "TRANSPOSE_CONV": ("transpose_conv", "TransposeConvOptions"),
        "BATCH_MATMUL": ("batch_matmul", "BatchMatMulOptions"),
        "SQUARED_DIFFERENCE": ("squared_difference", None), "RSQRT": ("rsqrt", None),
        "GATHER": ("gather", "GatherOptions"), "REDUCE_PROD": ("reduce_prod", "ReducerOptions"),
        "GELU": ("gelu", "GeluOptions"), "LEAKY_RELU": ("leaky_relu", "LeakyReluOptions"),
        "MAXIMUM": ("maximum_minimum", None, "Max"), "MINIMUM": ("maximum_minimum", None, "Min"),
        "REDUCE_MAX": ("mean", "ReducerOptions", "ReduceMax"), "REDUCE_MIN": ("mean", "ReducerOptions", "ReduceMin"),
        "SUM": ("mean", "ReducerOptions", "ReduceSum"),
        "ADD": ("elementwise", "AddOptions", "Add"), "SUB": ("elementwise", "SubOptions", "Sub"),
        "MUL": ("elementwise", "MulOptions", "Mul"),
        "AVERAGE_POOL_2D": ("pool", "Pool2DOptions", "AveragePool"), "MAX_POOL_2D": ("pool", "Pool2DOptions", "MaxPool"),
        "CONCATENATION": ("concatenation", "ConcatenationOptions"), "MEAN": ("mean", "ReducerOptions"),
        "PAD": ("pad", None), "PADV2": ("pad", None), "RESHAPE": ("reshape_op", None),
        "TRANSPOSE": ("transpose_op", None), "SOFTMAX": ("softmax", "SoftmaxOptions"),
        "LOGISTIC": ("unary", None, "Sigmoid"), "TANH": ("unary", None, "Tanh"),
        **{name: ("float_unary", None, op) for name, op in (("ABS", "Abs"), ("NEG", "Neg"), ("EXP", "Exp"),
                                                             ("LOG", "Log"), ("SQRT", "Sqrt"), ("SIN", "Sin"),
                                                             ("COS", "Cos"), ("ELU", "Elu"), ("SQUARE", "Square"))},
        "HARD_SWISH": ("unary", None, "HardSwish"), "RELU": ("relu", None, Act.RELU),
        "RELU6": ("relu", None, Act.RELU6), "RELU_N1_TO_1": ("relu", None, Act.RELU_N1_TO_1),
        "PRELU": ("prelu", None), "RESIZE_BILINEAR": ("resize", "ResizeBilinearOptions", "linear"),
        "RESIZE_NEAREST_NEIGHBOR": ("resize", "ResizeNearestNeighborOptions", "nearest"),
        "DEQUANTIZE": ("dequantize", None), "QUANTIZE": ("quantize_op", None), "DENSIFY": ("densify", None),
        "STRIDED_SLICE": ("strided_slice", "StridedSliceOptions"), "SHAPE": ("shape_op", None),
        "PACK": ("pack", "PackOptions"),
        "UNIDIRECTIONAL_SEQUENCE_LSTM": ("sequence_lstm", "UnidirectionalSequenceLSTMOptions"),
        "DEPTH_TO_SPACE": ("depth_space", "DepthToSpaceOptions", "DepthToSpace"),
        "SPACE_TO_DEPTH": ("depth_space", "SpaceToDepthOptions", "SpaceToDepth"),
    }
