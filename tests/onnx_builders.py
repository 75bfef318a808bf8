"""Build one-node ONNX models and run them in ONNX Runtime and in npuforge."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import npuforge


def tensor_type(arr: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def one_node_model(op: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1, opset: int = 17,
                   consts: set | None = None) -> tuple[onnx.ModelProto, dict]:
    """inputs: list of (name, array or None). Names in ``consts`` become initializers;
    None marks an omitted optional input. Returns (model, runtime feeds)."""
    consts = consts or set()
    graph_inputs, inits, feeds, names = [], [], {}, []
    for name, arr in inputs:
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if name in consts:
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, tensor_type(arr), list(arr.shape)))
            feeds[name] = arr
    while names and not names[-1]:
        names.pop()  # trailing omitted inputs are left out, not named ""
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, name="the_node", **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, feeds


def run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_ours(model: onnx.ModelProto, feeds: dict) -> list:
    graph = npuforge.import_onnx(model)
    out = graph.run(feeds)
    return [out[name] for name in graph.outputs]


def assert_close(ours: np.ndarray, ref: np.ndarray, rel: float = 1e-5, what: str = "") -> float:
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs ORT {ref.shape}"
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} vs ORT {ref.dtype}"
    if ref.dtype.kind in "fc":
        scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
        diff = float(np.abs(ours.astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
        assert diff <= rel * scale, f"{what}: max abs diff {diff:.3g} > {rel} x {scale:.3g}"
        return diff
    np.testing.assert_array_equal(ours, ref, err_msg=what)
    return 0.0


def check_op(op: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1, opset: int = 17,
             consts: set | None = None, rel: float = 1e-5) -> list:
    model, feeds = one_node_model(op, inputs, attrs, n_outputs, opset, consts)
    ref = run_ort(model, feeds)
    ours = run_ours(model, feeds)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert_close(a, b, rel, f"{op} {attrs} output {k}")
    # the shape rule must agree with what actually came out
    graph = npuforge.import_onnx(model)
    for name, arr in zip(graph.outputs, ref):
        assert tuple(graph.values[name].shape) == arr.shape, f"{op}: inferred {graph.values[name].shape} vs {arr.shape}"
    return ours
