"""TFLite custom operators the importer reads: MediaPipe's ``Convolution2DTransposeBias``
(the segmentation models' upsampling head), mixed into ``_Importer`` like the other rules.

A custom operator is named by its operator code's ``custom_code`` string, and its options
are the operator's ``custom_options`` bytes, in whatever format the kernel's author chose.

``Convolution2DTransposeBias`` (MediaPipe's ``transpose_conv_bias.cc``, float32 only) is
TFLite's TRANSPOSE_CONV with a bias and without the output-shape input: inputs (input
NHWC, weights [O, KH, KW, I] like TRANSPOSE_CONV's, bias [O]); the options are a
``TfLiteTransposeConvParams`` C struct read as it lies in memory, three little-endian
int32: the padding (TfLitePadding: 1 SAME, 2 VALID; 0 is "unknown"), stride_width,
stride_height. The kernel sizes its own output: with ``P = max(0, K - (n - 1) % s - 1)``
under SAME and 0 under VALID, each spatial dim is ``s * (n - 1) + K - P``, the full
transposed convolution cropped by ``P // 2`` at the start (the rest at the end), the bias
added everywhere. That is the IR's ConvTranspose with pads ``[P // 2, P - P // 2]`` per
axis and weights transposed to [I, O, KH, KW].

Every other custom operator is refused in one line naming it and the operator.
"""

from __future__ import annotations

import struct

import numpy as np
from tflite.ActivationFunctionType import ActivationFunctionType as Act
from tflite.BuiltinOperator import BuiltinOperator

from ..errors import UnsupportedError
from .tflite_verify import _Walker

# MediaPipe's TfLitePadding values (the C API's enum, not the schema's Padding: SAME 0, VALID 1)
_SAME, _VALID = 1, 2
_CUSTOM_OPTIONS = 14  # Operator.custom_options: its vtable slot


class CustomRules:
    """The custom-op rules of the TFLite importer: custom_code -> method (options: None)."""

    CUSTOM_HANDLERS = {"Convolution2DTransposeBias": ("transpose_conv_bias", None)}
    custom_index = -1  # the custom operator being imported (custom_options reads its bytes)

    def custom_handler(self, index: int) -> tuple | None:
        """The rule of operator ``index`` when it is a custom op (None for a builtin); a custom
        op without a rule is refused here, naming it and the operator."""
        table = self.model.OperatorCodes(self.sg.Operators(index).OpcodeIndex())
        if max(table.BuiltinCode(), table.DeprecatedBuiltinCode()) != BuiltinOperator.CUSTOM:
            return None
        handler = self.CUSTOM_HANDLERS.get((table.CustomCode() or b"").decode("utf-8", "replace"))
        if handler is None:
            outs = self.op_tensors(index)[1]
            node = f" (output '{self.tname(outs[0])}')" if outs else ""
            raise UnsupportedError(f"{self.where}: operator {index}{node} is {self.op_name(index)}, which npuforge "
                                   f"does not import (`npuforge ops` lists the ops it reads; docs/tflite.md the "
                                   f"TFLite operators and custom ops)")
        self.custom_index = index
        return handler

    def custom_options(self) -> bytes:
        """The custom_options bytes of the operator being imported, bounds-checked."""
        op = self.sg.Operators(self.custom_index)
        start, n = _Walker(self.buf, self.where).vector(op._tab, _CUSTOM_OPTIONS, 1,
                                                         f"the custom options of {self.at}")
        return self.buf[start:start + n]

    def transpose_conv_bias(self, ins, o, opt):
        if len(ins) != 3:
            self.bad(f"{len(ins)} inputs (Convolution2DTransposeBias takes the input, the weights and the bias)")
        raw = self.custom_options()
        if len(raw) != 12:
            self.bad(f"{len(raw)} bytes of custom options (MediaPipe's TfLiteTransposeConvParams: padding, "
                     f"stride_width, stride_height, 12 bytes)")
        padding, stride_w, stride_h = struct.unpack("<3i", raw)
        if padding not in (_SAME, _VALID):
            self.bad(f"the padding code {padding} in its custom options (SAME is {_SAME}, VALID {_VALID})")
        strides = self.at_least_1("strides", [stride_h, stride_w])
        if self.quantized:
            self.refuse("is on int8 tensors; MediaPipe's kernel is float32 only")
        x, w_i, b_i = ins
        shape = self.file_shape(x)
        if len(shape) != 4:
            self.bad(f"an input of shape {list(shape)}; it must be 4-D (NHWC)")
        if self.dtype(x) != "float32":
            self.refuse(f"has a {self.dtype(x)} input; MediaPipe's kernel is float32 only")
        w = self.weights(w_i, 4, "weights")  # [O, KH, KW, I]
        if w.shape[3] != shape[3]:
            self.bad(f"weights of shape {list(w.shape)} for an input of {shape[3]} channels ([O, KH, KW, "
                     f"{shape[3]}])")
        bias = self.const(b_i, "biases")
        if bias.shape != (w.shape[0],) or bias.dtype != np.float32:
            self.bad(f"{bias.dtype} biases of shape {list(bias.shape)} (float32 [{w.shape[0]}])")
        kernel = [w.shape[1], w.shape[2]]
        total = [max(0, k - (n - 1) % s - 1) if padding == _SAME else 0
                 for n, k, s in zip(shape[1:3], kernel, strides)]
        size = [s * (n - 1) + k - p for n, k, s, p in zip(shape[1:3], kernel, strides, total)]
        if self.file_shape(o) != (shape[0], *size, w.shape[0]):  # (before a mutated stride sizes the IR)
            self.bad(f"an output of shape {list(self.file_shape(o))} where its input, weights, strides and "
                     f"padding give {[shape[0], *size, w.shape[0]]}")
        attrs = {"kernel_shape": kernel, "strides": strides, "dilations": [1, 1], "group": 1,
                 "output_padding": [0, 0],
                 "pads": [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]}
        self.compute(o, x, "ConvTranspose", [self.value(x)], attrs, Act.NONE, w.transpose(3, 0, 1, 2), w_i, b_i,
                     0)
