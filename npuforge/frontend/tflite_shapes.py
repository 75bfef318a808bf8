"""The TFLite importer's rules for constants and shape arithmetic (mixed into ``_Importer`` with
the operator rules): DEQUANTIZE of a constant and DENSIFY fold at import; SHAPE of a static
tensor, and STRIDED_SLICE, PACK, GATHER, REDUCE_PROD and CONCATENATION (tflite_ops.py) of integer
constants fold too: TensorFlow's converter writes Keras' Reshape and Tensordot with them, to
compute shapes the file already knows, or gives as placeholders of dynamic tensors
(``resolve_shape``). STRIDED_SLICE of an activation becomes a Slice on the IR's axes, GATHER of a
constant table by integer ids (an embedding) a Gather."""

from __future__ import annotations

import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType as Act

from .tflite_ops import IR_AXIS


class ShapeRules:
    """Folding and value-moving rules of the TFLite importer."""

    def dequantize(self, ins, o, opt):
        """DEQUANTIZE of a constant: folded. Of an int8 activation inside an int8 model (where the
        converter leaves an operator in float): an Identity to a value without parameters, the start
        of a float island that a QUANTIZE ends."""
        data = self.data(ins[0])
        if data is None:
            if not self.int8_model or self.dtype(ins[0]) != "int8" or self.dtype(o) != "float32":
                self.refuse(f"dequantizes a {self.dtype(ins[0])} activation to {self.dtype(o)}; npuforge reads "
                            f"int8 to float32")
            self.activation_q(ins[0])  # (per tensor)
            node = self.emit("Identity", [self.value(ins[0])], out=self.fresh(self.tname(o)), suffix="dequantize")
            self.bind(o, node.outputs[0])
            return
        p = self.qparams(ins[0], self.dtype(ins[0]))
        self.folded[o] = (p.dequantize(data) if p is not None and data.dtype.kind in "iu"
                          else data.astype(np.float32))

    def quantize_op(self, ins, o, opt):
        """QUANTIZE of a float32 activation to int8 inside an int8 model, the end of a float island: an
        Identity whose output has the file's parameters (the integer program quantizes it there)."""
        if self.dtype(ins[0]) != "float32" or self.dtype(o) != "int8" or self.data(ins[0]) is not None:
            self.refuse(f"quantizes a {self.dtype(ins[0])} tensor to {self.dtype(o)}; npuforge reads QUANTIZE of a "
                        f"float32 activation to int8 (an int8 -> int8 requantization is not imported)")
        self.quantized = True  # (its output is an int8 activation: activation_q reads it)
        node = self.emit("Identity", [self.value(ins[0])], out=self.fresh(self.tname(o)),
                         quant=self.activation_q(o), suffix="quantize")
        self.bind(o, node.outputs[0])

    def densify(self, ins, o, opt):
        """DENSIFY of constant sparse weights: the dense array, folded at import (``data`` densifies)."""
        data = self.data(ins[0])
        if data is None:
            self.refuse("densifies a tensor computed at run time; npuforge imports DENSIFY of constant weights")
        if data.shape != self.file_shape(o):
            self.bad(f"a dense output of shape {list(self.file_shape(o))} for a tensor of shape {list(data.shape)}")
        self.folded[o] = data

    def fold(self, o: int, value: np.ndarray) -> None:
        """An integer constant computed at import (shape arithmetic), in the output's dtype."""
        self.resolve_shape(o, value.shape)
        if value.shape != self.file_shape(o):
            self.bad(f"an output of shape {list(self.file_shape(o))} where its constant inputs give "
                     f"{list(value.shape)}")
        self.folded[o] = value.astype(self.dtype(o))

    def integer_constants(self, ins) -> list | None:
        values = [self.data(i) for i in ins]
        return values if all(v is not None and v.dtype.kind in "iu" for v in values) else None

    def gather(self, ins, o, opt):
        """GATHER of integer constants (a shape's dims picked), folded at import."""
        values = self.integer_constants(ins[:2])
        if values is None:
            return self.embedding(ins, o, opt)
        params, indices = values
        axis = opt.Axis() % params.ndim if params.ndim else 0
        if opt.BatchDims() or np.any((indices < -params.shape[axis]) | (indices >= params.shape[axis])):
            self.bad(f"indices {indices.reshape(-1)[:8].tolist()} for an axis of {params.shape[axis]} "
                     f"(batch_dims {opt.BatchDims()})")
        self.fold(o, np.take(params, indices, axis=axis))

    def embedding(self, ins, o, opt):
        """GATHER of rows of a constant table by indices computed at run time (token ids): Gather, the
        table's codes copied (an int8 file's output must share the table's grid)."""
        table, indices = ins[:2]
        if self.data(table) is None or self.data(indices) is not None or opt.BatchDims():
            self.refuse("gathers from a tensor computed at run time, which npuforge does not import (it imports "
                        "GATHER of a constant table by indices, and of shape constants)")
        if self.dtype(indices) not in ("int32", "int64"):
            self.bad(f"{self.dtype(indices)} indices")
        rank = len(self.file_shape(table))
        if rank == 4 or len(self.file_shape(o)) == 4:
            self.refuse("gathers a 4-D table or into a 4-D output, which npuforge does not import")
        q = self.activation_q(o)
        if q is not None and not (self.qparams(table) is not None and self.qparams(table).same_as(q)):
            self.refuse("gathers int8 rows quantized unlike its output (LiteRT copies the codes), which npuforge "
                        "does not import")
        self.with_activation(Act.NONE, o, "Gather", [self.value(table), self.value(indices)],
                             {"axis": opt.Axis() % rank})

    def reduce_prod(self, ins, o, opt):
        """REDUCE_PROD of an integer constant (a shape's element count), folded at import."""
        values = self.integer_constants(ins[:2])
        if values is None:
            self.refuse("multiplies tensors computed at run time; npuforge imports REDUCE_PROD of shape constants only")
        x, axes = values
        axes = tuple(sorted({int(a) % max(x.ndim, 1) for a in axes.reshape(-1)}))
        self.fold(o, np.prod(x, axis=axes, keepdims=bool(opt.KeepDims())))

    def shape_op(self, ins, o, opt):
        """SHAPE of a tensor of static shape: the constant, folded at import (Keras' Reshape writes
        SHAPE, STRIDED_SLICE and PACK to compute a shape the file already knows)."""
        if self.dtype(o) not in ("int32", "int64"):
            self.bad(f"a {self.dtype(o)} output (SHAPE writes int32 or int64)")
        self.folded[o] = np.asarray(self.file_shape(ins[0]), self.dtype(o))

    def pack(self, ins, o, opt):
        """PACK of constants (a shape being assembled), folded at import."""
        values = [self.data(i) for i in ins]
        if any(v is None for v in values):
            self.refuse("packs tensors computed at run time; npuforge imports PACK of constants (shapes) only")
        if len({v.shape for v in values}) != 1 or not -values[0].ndim - 1 <= opt.Axis() <= values[0].ndim:
            self.bad(f"values of shapes {[list(v.shape) for v in values]} packed along axis {opt.Axis()}")
        packed = np.stack(values, axis=opt.Axis())
        if packed.shape != self.file_shape(o):
            self.bad(f"an output of shape {list(self.file_shape(o))} for values packed to {list(packed.shape)}")
        self.folded[o] = packed

    def strided_slice(self, ins, o, opt):
        """TF's strided slice (begin / end / strides constants and the five masks) as a Slice on the
        IR's axes, then the shrunk axes dropped and the new ones inserted: Squeeze / Unsqueeze, or for
        a 4-D input or output a Reshape in the file's element order (``reshape``)."""
        shape = self.file_shape(ins[0])
        rank = len(shape)
        begin, end, strides = (self.const(i, what).astype(np.int64).reshape(-1).tolist()
                               for i, what in zip(ins[1:4], ("begins", "ends", "strides")))
        n = len(begin)
        if len(end) != n or len(strides) != n or 0 in strides:
            self.bad(f"begins {begin}, ends {end} and strides {strides} (of one length, no stride 0)")
        if opt.Offset():
            self.refuse("has offset=true (ends counted from the begins), which npuforge does not import")
        begin_mask, end_mask, ellipsis, new_axis, shrink = (opt.BeginMask(), opt.EndMask(), opt.EllipsisMask(),
                                                            opt.NewAxisMask(), opt.ShrinkAxisMask())
        bit = lambda mask, i: bool((mask >> i) & 1) if i < 32 else False  # noqa: E731
        if bin(ellipsis & ((1 << n) - 1)).count("1") > 1:
            self.bad(f"the ellipsis mask {ellipsis}, with more than one ellipsis")
        spans = sum(1 for i in range(n) if not bit(ellipsis, i) and not bit(new_axis, i))
        out, cuts, axis = [], [], 0  # out: ("keep" | "shrink", input axis) or ("new", None), in output order
        entries = list(range(n)) + ([] if any(bit(ellipsis, i) for i in range(n)) else [None])
        for i in entries:
            if i is None or bit(ellipsis, i):  # the ellipsis (implicit at the end): the dims no entry spans
                if rank < spans:
                    self.bad(f"{spans} slice entries for a rank-{rank} input")
                out += [("keep", axis + j) for j in range(rank - spans)]
                axis += rank - spans
                continue
            if bit(new_axis, i):
                out.append(("new", None))
                continue
            if axis >= rank:
                self.bad(f"{spans} slice entries for a rank-{rank} input")
            dim = shape[axis]
            if bit(shrink, i):
                b = begin[i] + dim if begin[i] < 0 else begin[i]
                if not 0 <= b < dim:
                    self.bad(f"the index {begin[i]} of a dim of {dim} (shrink_axis_mask)")
                picked = range(b, b + 1)
            else:
                picked = range(dim)[slice(None if bit(begin_mask, i) else begin[i],
                                          None if bit(end_mask, i) else end[i], strides[i])]
            if len(picked) == 0:
                self.refuse(f"selects nothing along dim {axis} (an empty tensor), which npuforge does not import")
            if picked != range(dim):
                cuts.append((axis, picked))
            out.append(("shrink" if bit(shrink, i) else "keep", axis))
            axis += 1
        constant = self.data(ins[0])
        if constant is not None and constant.dtype.kind in "iu":  # shape arithmetic: folded at import
            for a, r in cuts:
                constant = np.take(constant, list(r), axis=a)
            if constant.size != int(np.prod(self.file_shape(o))):
                self.bad(f"an output of shape {list(self.file_shape(o))} for {constant.size} selected values")
            self.folded[o] = constant.reshape(self.file_shape(o))
            return
        q = self.activation_q(o)
        x = self.value(ins[0])
        sliced = list(shape)
        if cuts:
            ir_axis = [IR_AXIS[a] if rank == 4 else a for a, _ in cuts]
            ends = [r.start + r.step * len(r) for _, r in cuts]
            ends = [e if e >= 0 else -shape[a] - 1 for e, (a, _) in zip(ends, cuts)]  # -1: before index 0
            for a, r in cuts:
                sliced[a] = len(r)
            x = self.emit("Slice", [x, self.int64s(f"{self.base}::starts", [r.start for _, r in cuts]),
                                    self.int64s(f"{self.base}::ends", ends), self.int64s(f"{self.base}::axes", ir_axis),
                                    self.int64s(f"{self.base}::steps", [r.step for _, r in cuts])],
                          quant=q, suffix="slice").outputs[0]
        result = [1 if kind == "new" else sliced[a] for kind, a in out if kind != "shrink"]
        if tuple(result) != self.file_shape(o):
            self.bad(f"an output of shape {list(self.file_shape(o))} where the slice gives {result}")
        dropped = [a for kind, a in out if kind == "shrink"]
        added = [k for k, (kind, _) in enumerate(e for e in out if e[0] != "shrink") if kind == "new"]
        if not dropped and not added:
            return self.bind(o, x)
        if rank == 4 or len(result) == 4:
            return self.bind(o, self.reshape(x, tuple(sliced), tuple(result), q, self.fresh(self.tname(o))))
        if dropped:
            x = self.emit("Squeeze", [x, self.int64s(f"{self.base}::squeeze", dropped)], quant=q,
                          out=None if added else self.fresh(self.tname(o)), suffix="squeeze").outputs[0]
        if added:
            x = self.emit("Unsqueeze", [x, self.int64s(f"{self.base}::unsqueeze", added)], quant=q,
                          out=self.fresh(self.tname(o)), suffix="unsqueeze").outputs[0]
        self.bind(o, x)

    # the inputs each rule reads whatever the file says (the others are optional: a bias, PADV2's value)
