"""The QDQ export against fake-quant, layer by layer with ONNX Runtime's own inputs (teacher forcing).

End to end, a QDQ file in ONNX Runtime and fake-quant part wherever a float32 sum lands on a rounding
boundary and the two kernels round it differently; a later layer carries the difference on, and how far
depends on the CPU's float kernels and the model. Layer by layer it is exactly defined: each quantized
value, recomputed in float64 by fake-quant from the values ONNX Runtime computed before it, is ONNX
Runtime's value or one step of its grid away (the float32 sum on the other side of a boundary).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from npuforge.sim.float_exec import execute


def layerwise_steps(qgraph, qdq_path, feeds: dict) -> dict:
    """{value: (largest, mean) distance in codes} between ONNX Runtime's QDQ run (graph
    optimizations off) and fake-quant in float64 fed ONNX Runtime's values of every earlier layer."""
    names = [n for n, v in qgraph.values.items()
             if v.quant is not None and not v.is_const and n not in qgraph.inputs and v.dtype == "float32"]
    proto = onnx.load(str(qdq_path))
    known = {o.name for o in proto.graph.output}
    proto.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                              for n in names if n not in known)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    runtime = dict(zip(names, sess.run(names, feeds)))
    steps = {}

    def value_hook(name, t):
        p = qgraph.values[name].quant
        if p is None:
            return t.to(torch.float64) if t.is_floating_point() else t
        ours = p.fake_quant(t.to(torch.float64))
        if name not in runtime:  # the graph input: quantized the same way by both
            return ours
        theirs = torch.from_numpy(runtime[name].astype(np.float64))
        step = torch.from_numpy(np.asarray(p._broadcast(p.scale, ours.dim()), np.float64))
        d = ((ours / step).round() - (theirs / step).round()).abs()  # codes: ONNX Runtime's DequantizeLinear
        # rounds (q - z) * s to float32, a fraction of a step off the grid for a code in the thousands
        steps[name] = (float(d.max()) if d.numel() else 0.0, float(d.mean()) if d.numel() else 0.0)
        return theirs  # the next layer reads ONNX Runtime's value

    def const_hook(value, t):
        if value.quant is None:
            return t.to(torch.float64) if t.is_floating_point() else t
        return value.quant.dequantize_torch(torch.from_numpy(value.quant.quantize(value.data)), torch.float64)

    wide = {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v for k, v in feeds.items()}
    execute(qgraph, wide, names, value_hook=value_hook, const_hook=const_hook)
    return steps
