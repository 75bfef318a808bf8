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

MediaPipe's attention-mesh ops of version 2 (``landmarks_to_transform_matrix.cc``,
``transform_tensor_bilinear.cc``, ``transform_landmarks.cc``, float32 only) become the IR's ops
of :mod:`npuforge.ops.geometry`; their options are FlexBuffers maps:
``Landmarks2TransformMatrix`` ([1, L, 3] landmarks -> [1, 4, 4]) reads subset_idxs (a typed
vector of landmark indices, read in pairs; an odd count repeats its last), left_rotation_idx,
right_rotation_idx, target_rotation_radians, output_height, output_width, scale_x, scale_y;
``TransformTensorBilinear`` (NHWC features, matrix -> NHWC crop) output_height and
output_width; ``TransformLandmarks`` ([1, L, 2 or 3], matrix) none.

``MaxPoolingWithArgmax2D`` and ``MaxUnpooling2D`` (``max_pool_argmax.cc``, ``max_unpooling.cc``,
float32 only) become :mod:`npuforge.ops.unpool`'s MaxPoolWindowArgmax and MaxUnpoolWindow. Their
options are a ``TfLitePoolParams`` C struct as it lies in memory, little-endian int32: padding
(1 SAME, 2 VALID), stride_width, stride_height, filter_width, filter_height, activation (then
TFLite's computed padding, unread). The pooling's output size and padding are TFLite's
(``(n + s - 1) // s`` under SAME, its head ``max(((out - 1) s + k - n) // 2, 0)``); the
unpooling's output is ``n * k`` per axis, its padding ``max(((n - 1) s + k - n k) // 2, 0)``. The
pooling's second output (window-local indices as floats ``i + 0.1``) is int64 in the IR and may
only feed unpoolings.

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

    CUSTOM_HANDLERS = {"Convolution2DTransposeBias": ("transpose_conv_bias", None),
                       "Landmarks2TransformMatrix": ("landmarks_to_transform_matrix", None),
                       "TransformTensorBilinear": ("transform_tensor_bilinear", None),
                       "TransformLandmarks": ("transform_landmarks", None),
                       "MaxPoolingWithArgmax2D": ("max_pool_argmax", None),
                       "MaxUnpooling2D": ("max_unpooling", None)}
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

    # -- MediaPipe's attention-mesh geometry (version 2) ----------------------------------------
    def geometry_options(self, ins, n_inputs: int, keys: dict) -> dict:
        """The checks the three geometry ops share: their version (2), input count and float32 tensors;
        -> their FlexBuffers options, each of ``keys`` (name -> kind: int, float or ints) present."""
        version = self.model.OperatorCodes(self.sg.Operators(self.custom_index).OpcodeIndex()).Version()
        if version != 2:
            self.refuse(f"is version {version} of the op; npuforge imports MediaPipe's version 2")
        if len(ins) != n_inputs:
            self.bad(f"{len(ins)} inputs ({n_inputs} expected)")
        if self.quantized or any(self.dtype(i) != "float32" for i in ins):
            self.refuse("is on int8 tensors; MediaPipe's kernel is float32 only")
        if not keys:
            return {}
        from flatbuffers import flexbuffers

        try:
            options = flexbuffers.Loads(self.custom_options())
        except Exception:  # the FlexBuffers reader raises whatever the bytes lead it to
            options = None
        if not isinstance(options, dict):
            self.bad("custom options that are not a FlexBuffers map")
        kinds = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
                 "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                 "ints": lambda v: isinstance(v, list) and bool(v) and all(kinds["int"](x) for x in v)}
        for key, kind in keys.items():
            if not kinds[kind](options.get(key)):
                self.bad(f"no usable '{key}' in its custom options ({kind} expected)")
        return options

    def landmarks_to_transform_matrix(self, ins, o, opt):
        keys = {"subset_idxs": "ints", "left_rotation_idx": "int", "right_rotation_idx": "int",
                "target_rotation_radians": "float", "output_height": "int", "output_width": "int",
                "scale_x": "float", "scale_y": "float"}
        k = self.geometry_options(ins, 1, keys)
        subset = list(k["subset_idxs"]) + list(k["subset_idxs"][-1:]) * (len(k["subset_idxs"]) % 2)
        attrs = {"subset": subset, "left": k["left_rotation_idx"], "right": k["right_rotation_idx"],
                 "target_rotation": float(k["target_rotation_radians"]),
                 "output_size": [k["output_height"], k["output_width"]],
                 "scale": [float(k["scale_x"]), float(k["scale_y"])]}
        node = self.emit("LandmarksToTransformMatrix", [self.value(ins[0])], attrs, out=self.fresh(self.tname(o)))
        self.bind(o, node.outputs[0])

    def transform_tensor_bilinear(self, ins, o, opt):
        k = self.geometry_options(ins, 2, {"output_height": "int", "output_width": "int"})
        node = self.emit("TransformTensorBilinear", [self.value(ins[0]), self.value(ins[1])],
                         {"output_size": [k["output_height"], k["output_width"]]}, out=self.fresh(self.tname(o)))
        self.bind(o, node.outputs[0])

    def transform_landmarks(self, ins, o, opt):
        self.geometry_options(ins, 2, {})
        node = self.emit("TransformLandmarks", [self.value(ins[0]), self.value(ins[1])], out=self.fresh(self.tname(o)))
        self.bind(o, node.outputs[0])

    # -- MediaPipe's pooling with window-local indices ---------------------------------------------
    def pool_params(self, ins, n_inputs: int) -> tuple:
        """(kernel (h, w), strides (h, w), SAME?) from the TfLitePoolParams options, after the checks
        both ops share (float32, input count, no fused activation: MediaPipe's unpooling ignores it)."""
        if len(ins) != n_inputs:
            self.bad(f"{len(ins)} inputs ({n_inputs} expected)")
        if self.quantized or any(self.dtype(i) != "float32" for i in ins):
            self.refuse("is on int8 tensors; MediaPipe's kernel is float32 only")
        raw = self.custom_options()
        if len(raw) < 24:
            self.bad(f"{len(raw)} bytes of custom options (MediaPipe's TfLitePoolParams: at least 24)")
        padding, stride_w, stride_h, filter_w, filter_h, activation = struct.unpack("<6i", raw[:24])
        if padding not in (_SAME, _VALID):
            self.bad(f"the padding code {padding} in its custom options (SAME is {_SAME}, VALID {_VALID})")
        if activation != Act.NONE:
            self.refuse(f"has the fused activation {activation}, which npuforge does not import here")
        strides = self.at_least_1("strides", [stride_h, stride_w])
        kernel = self.at_least_1("filter sizes", [filter_h, filter_w])
        if len(self.file_shape(ins[0])) != 4:
            self.bad(f"an input of shape {list(self.file_shape(ins[0]))}; it must be 4-D (NHWC)")
        return kernel, strides, padding == _SAME

    def max_pool_argmax(self, ins, o, opt):
        kernel, strides, same = self.pool_params(ins, 1)
        sizes = self.file_shape(ins[0])[1:3]
        out = [(n + s - 1) // s if same else (n - k + s) // s for n, k, s in zip(sizes, kernel, strides)]
        if min(out) < 1:
            self.bad(f"a window {kernel} larger than its input {list(sizes)} (VALID padding)")
        pads = [max(((m - 1) * s + k - n) // 2, 0) for n, k, s, m in zip(sizes, kernel, strides, out)]
        values, indices = self.op_tensors(self.op_index)[1]
        users = [k for k in self.consumers(indices) if self.op_tensors(k)[0][1:2] != [indices]
                 or self.op_name(k) != "the custom op 'MaxUnpooling2D'"]
        if users or indices in [int(t) for t in self.sg.OutputsAsNumpy()]:
            self.refuse("has its indices read by another operator than MaxUnpooling2D (or as a graph output); "
                        "npuforge imports them only into unpoolings")
        attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "output_size": out}
        node = self.emit("MaxPoolWindowArgmax", [self.value(ins[0])], attrs,
                         outs=[self.fresh(self.tname(t)) for t in (values, indices)])
        for name, t in zip(node.outputs, (values, indices)):
            self.bind(t, name)

    def max_unpooling(self, ins, o, opt):
        kernel, strides, _ = self.pool_params(ins, 2)
        sizes = self.file_shape(ins[0])[1:3]
        if self.file_shape(ins[1]) != self.file_shape(ins[0]):
            self.bad(f"indices of shape {list(self.file_shape(ins[1]))} for values of {list(self.file_shape(ins[0]))}")
        out = [n * k for n, k in zip(sizes, kernel)]
        pads = [max(((n - 1) * s + k - m) // 2, 0) for n, k, s, m in zip(sizes, kernel, strides, out)]
        attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "output_size": out}
        node = self.emit("MaxUnpoolWindow", [self.value(ins[0]), self.value(ins[1])], attrs,
                         out=self.fresh(self.tname(o)))
        self.bind(o, node.outputs[0])
