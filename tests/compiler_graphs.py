"""Random small CNNs as ONNX models, for the compiler's differential tests: conv stacks with
stride, asymmetric padding, dilation and groups (depthwise included), fused activations,
residual adds, channel concats, max / average pooling, bilinear resizes, lookup-table
activations, a gated multiply, 1-D convolutions and pools over the map as a signal, Split / Concat
of channels, a Pad of its own, a LayerNorm over the rows, and an optional classifier head."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, rng, c: int, h: int, w: int):
        self.rng = rng
        self.nodes, self.inits = [], []
        self.shape = (c, h, w)
        self.k = 0

    def name(self, base: str) -> str:
        self.k += 1
        return f"{base}{self.k}"

    def const(self, arr) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def node(self, op, inputs, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def model(self, outputs: list[str], name: str = "random_cnn"):
        """The ONNX model of everything added so far, with ``outputs`` as its outputs."""
        in_shape = [1, *self.shape]
        g = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], self.inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    # -- blocks ---------------------------------------------------------------------------------
    def conv(self, x, shape, cout, k, stride, dilation, group, pads, act):
        c, h, w = shape
        wt = self.rng.normal(0, 1.0 / np.sqrt(c // group * k * k), (cout, c // group, k, k)).astype(np.float32)
        b = self.rng.normal(0, 0.1, cout).astype(np.float32)
        y = self.node("Conv", [x, self.const(wt), self.const(b)], kernel_shape=[k, k], strides=[stride, stride],
                      dilations=[dilation, dilation], group=group, pads=pads)
        if act == "relu":
            y = self.node("Relu", [y])
        elif act == "relu6":
            y = self.node("Clip", [y, self.const(np.float32(0)), self.const(np.float32(6))])
        elif act == "leaky":
            y = self.node("LeakyRelu", [y], alpha=0.1)
        oh = (h + pads[0] + pads[2] - dilation * (k - 1) - 1) // stride + 1
        ow = (w + pads[1] + pads[3] - dilation * (k - 1) - 1) // stride + 1
        return y, (cout, oh, ow)


def conv_args(draw, st, shape):
    c, h, w = shape
    k = draw(st.sampled_from([1, 3, 5] if min(h, w) >= 5 else [1, 3]))
    dilation = draw(st.sampled_from([1, 2])) if k > 1 and min(h, w) >= 2 * k else 1
    stride = draw(st.sampled_from([1, 2]))
    span = dilation * (k - 1)
    pads = [draw(st.integers(0, k // 2 + (1 if k > 1 else 0))) for _ in range(4)]
    pads = [min(p, span) for p in pads]  # ONNX allows pads up to the window; keep them inside it
    if h + pads[0] + pads[2] <= span or w + pads[1] + pads[3] <= span:
        pads = [span, span, span, span]
    groups = [1] + ([c] if c > 1 else []) + ([2] if c % 2 == 0 and c > 2 else [])
    group = draw(st.sampled_from(groups))
    cout = c if group == c else draw(st.integers(1, 8)) * (group if group > 1 else 1)
    cout = min(cout, 16)
    if group > 1 and cout % group:
        cout = group
    act = draw(st.sampled_from(["", "relu", "relu6", "leaky"]))
    return dict(cout=cout, k=k, stride=stride, dilation=dilation, group=group, pads=pads, act=act)


def random_model(draw, st, rng):
    """(ONNX model, input shape) drawn with hypothesis strategies ``st``."""
    c = draw(st.integers(1, 6))
    h, w = draw(st.integers(5, 18)), draw(st.integers(5, 18))
    b = Builder(rng, c, h, w)
    x, shape = "input", (c, h, w)
    for _ in range(draw(st.integers(1, 6))):
        # the last three have no NPU kernel on npu256: node commands on the host CPU between NPU layers
        kind = draw(st.sampled_from(["conv", "conv", "residual", "concat", "maxpool", "avgpool", "resize", "lut",
                                     "gate", "transpose", "softmax", "scale", "signal", "split", "pad", "norm"]))
        c, h, w = shape
        if kind == "conv" or (kind in ("maxpool", "avgpool") and min(h, w) < 3):
            x, shape = b.conv(x, shape, **conv_args(draw, st, shape))
        elif kind == "residual":
            y, _ = b.conv(x, shape, c, 3, 1, 1, 1, [1, 1, 1, 1], draw(st.sampled_from(["", "relu"])))
            x = b.node("Add", [x, y])
        elif kind == "concat":
            y1, s1 = b.conv(x, shape, draw(st.integers(1, 6)), 1, 1, 1, 1, [0, 0, 0, 0], "relu")
            y2, s2 = b.conv(x, shape, draw(st.integers(1, 6)), 3, 1, 1, 1, [1, 1, 1, 1], "")
            x, shape = b.node("Concat", [y1, y2], axis=1), (s1[0] + s2[0], h, w)
        elif kind == "maxpool":
            k, s = draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2]))
            p = draw(st.integers(0, k // 2))
            x = b.node("MaxPool", [x], kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
            shape = (c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
        elif kind == "avgpool":
            s = draw(st.sampled_from([1, 2]))
            x = b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[s, s], pads=[1, 1, 1, 1],
                       count_include_pad=draw(st.sampled_from([0, 1])))
            shape = (c, (h - 1) // s + 1, (w - 1) // s + 1)
        elif kind == "resize" and max(h, w) <= 12:
            mode = draw(st.sampled_from(["half_pixel", "align_corners", "asymmetric"]))
            sizes = b.const(np.array([1, c, 2 * h, 2 * w], np.int64))
            x = b.node("Resize", [x, "", "", sizes], mode="linear", coordinate_transformation_mode=mode)
            shape = (c, 2 * h, 2 * w)
        elif kind == "lut":
            x = b.node(draw(st.sampled_from(["Sigmoid", "HardSwish", "Tanh"])), [x])
        elif kind == "transpose":  # H and W swap: the channel-last bytes move
            x, shape = b.node("Transpose", [x], perm=[0, 1, 3, 2]), (c, w, h)
        elif kind == "softmax":
            x = b.node("Softmax", [x], axis=1)
        elif kind == "scale":  # a per-channel constant operand
            x = b.node("Mul", [x, b.const(rng.uniform(0.5, 2.0, (1, c, 1, 1)).astype(np.float32))])
        elif kind == "signal":  # the map as a [1, C, H * W] signal through 1-D convolutions and a pool, and back
            y = b.node("Reshape", [x, b.const(np.array([1, c, h * w], np.int64))])
            for _ in range(draw(st.integers(1, 2))):
                cout, group = (c, c) if draw(st.booleans()) else (draw(st.integers(1, 6)), 1)
                wt = rng.normal(0, 1.0 / np.sqrt(3 * c // group), (cout, c // group, 3)).astype(np.float32)
                y = b.node("Relu", [b.node("Conv", [y, b.const(wt)], kernel_shape=[3], pads=[1, 1], group=group)])
                c = cout
            y = b.node(draw(st.sampled_from(["MaxPool", "AveragePool"])), [y], kernel_shape=[3], pads=[1, 1])
            x, shape = b.node("Reshape", [y, b.const(np.array([1, c, h, w], np.int64))]), (c, h, w)
        elif kind == "split" and c >= 2:  # channel halves swapped: Split (a slice each) and a Concat
            k = draw(st.integers(1, c - 1))
            first, second = f"{b.name('split')}_a", f"{b.name('split')}_b"
            b.nodes.append(helper.make_node("Split", [x, b.const(np.array([k, c - k], np.int64))], [first, second],
                                            name=first, axis=1))
            x = b.node("Concat", [second, first], axis=1)
        elif kind == "pad":  # zero padding of its own (not folded into a convolution: a Relu reads it)
            p = [0, 0, draw(st.integers(0, 2)), draw(st.integers(0, 2)), 0, 0, draw(st.integers(0, 2)), 1]
            x = b.node("Relu", [b.node("Pad", [x, b.const(np.array(p, np.int64))], mode="constant")])
            shape = (c, h + p[2] + p[6], w + p[3] + p[7])
        elif kind == "norm":  # a LayerNorm over the rows (W), a transformer's normalization
            scale, bias = (rng.uniform(0.5, 1.5, w).astype(np.float32), rng.uniform(-0.2, 0.2, w).astype(np.float32))
            x = b.node("LayerNormalization", [x, b.const(scale), b.const(bias)], axis=-1, epsilon=1e-5)
        else:  # gate: x * sigmoid(conv(x))
            y, _ = b.conv(x, shape, c, 1, 1, 1, 1, [0, 0, 0, 0], "")
            x = b.node("Mul", [x, b.node("Sigmoid", [y])])
    outputs = [x]
    if draw(st.booleans()):
        pooled = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
        n = draw(st.integers(2, 10))
        wt = rng.normal(0, 0.3, (n, shape[0])).astype(np.float32)
        outputs = [b.node("Gemm", [pooled, b.const(wt), b.const(np.zeros(n, np.float32))], transB=1)]
    return b.model(outputs), (1, *b.shape)
