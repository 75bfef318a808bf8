"""Fuzzing the ONNX reader, checker and quantizer (tests/fuzz_harness.py says what a clean end is).

A small model with most attributes npuforge reads (Conv, MaxPool, Resize, reflect Pad, AveragePool,
Tile, Concat, Softmax, Gemm, LayerNormalization) is mutated structurally -- an attribute set to an
extreme value, a wrong type or removed, an input dim set to 0 or 2^40, an initializer element set to
NaN / Inf / 1e38, the outputs dropped -- or byte-wise, then run through ``npuforge check`` and
``optimize``, and every few cases ``quantize`` on two synthetic images: whatever ``check`` lets
through must calibrate in ONNX Runtime and quantize, or be refused in one line. Named tests below
pin each refusal of issue 34 (the message names the node and the attribute or initializer).
"""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from fuzz_harness import fuzz_cases, mutations, run_case
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from npuforge.errors import NpuforgeError
from npuforge.frontend.onnx_importer import import_onnx

pytestmark = pytest.mark.slow  # seconds of mutated inputs; their verdicts do not depend on float kernels


def seed_model(batch=1) -> onnx.ModelProto:
    rng = np.random.default_rng(3)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    consts = [init("w", (4, 3, 3, 3)), init("b", (4,)), init("gw", (10, 288), 0.05), init("gb", (10,)),
              numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
              numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
              numpy_helper.from_array(np.array([1, 1, 1, 1], np.int64), "repeats"),
              numpy_helper.from_array(np.ones(10, np.float32), "ln_s"), init("ln_b", (10,))]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1]),
        n("MaxPool", ["c"], ["p"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        n("Resize", ["p", "", "scales"], ["r"], name="resize", mode="nearest"),
        n("Pad", ["r", "pads"], ["pd"], name="pad", mode="reflect"),
        n("AveragePool", ["pd"], ["ap"], name="avgpool", kernel_shape=[3, 3], strides=[3, 3]),
        n("Tile", ["ap", "repeats"], ["t"], name="tile"),
        n("Concat", ["t", "ap"], ["cc"], name="concat", axis=1),
        n("Softmax", ["cc"], ["sm"], name="softmax", axis=1),
        n("Flatten", ["sm"], ["f"], name="flatten", axis=1),
        n("Gemm", ["f", "gw", "gb"], ["g"], name="gemm", alpha=1.0, beta=1.0, transB=1),
        n("LayerNormalization", ["g", "ln_s", "ln_b"], ["y"], name="layernorm", axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


INTS = [0, -1, 1, 2, 3, 2**31 - 1, 2**31, 2**40, 2**63 - 1, -2**63]
FLOATS = [float("nan"), float("inf"), -float("inf"), 1e38, 0.0, -1.0, 1e-30, 1e6]
# Values npuforge must take in any attribute's place: a number, text, non-UTF-8 bytes, lists, a tensor.
WRONG_TYPES = [1.5, "a", b"\xff\xfe", [1.5, 2.5], ["a"], [], 7, numpy_helper.from_array(np.zeros(2, np.float32))]


def _set_attr(node, name, value):
    for k, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[k]
            break
    empty = isinstance(value, list) and not value
    node.attribute.append(helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS if empty else None))


def mutate(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    kind = rng.randrange(7)
    node = rng.choice(list(g.node))
    if kind == 0 and node.attribute:  # an attribute to an extreme of its own kind
        a = rng.choice(list(node.attribute))
        if a.type == onnx.AttributeProto.INTS:
            _set_attr(node, a.name, [rng.choice(INTS) if rng.random() < 0.5 else v for v in a.ints] or [rng.choice(INTS)])
        elif a.type == onnx.AttributeProto.INT:
            _set_attr(node, a.name, rng.choice(INTS))
        elif a.type == onnx.AttributeProto.FLOAT:
            _set_attr(node, a.name, rng.choice(FLOATS))
        else:
            _set_attr(node, a.name, rng.choice(["", "wrap", "linear", "cubic", "edge", "\u00e9"]))
    elif kind == 1 and node.attribute:  # an attribute of the wrong type, or gone
        a = rng.choice(list(node.attribute))
        if rng.random() < 0.2:
            node.attribute.remove(a)
        else:
            _set_attr(node, a.name, rng.choice(WRONG_TYPES))
    elif kind == 2:  # a new attribute the op may or may not have
        _set_attr(node, rng.choice(["axis", "kernel_shape", "strides", "pads", "dilations", "group", "alpha"]),
                  rng.choice(INTS + FLOATS[:4] + WRONG_TYPES))
    elif kind == 3:  # an initializer element (or all of it) non-finite, huge, or reshaped
        t = rng.choice(list(g.initializer))
        arr = numpy_helper.to_array(t).copy()
        if arr.size == 0:
            arr = np.zeros(3, arr.dtype)
        elif arr.dtype == np.int64:
            arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice(INTS[:-1])
        elif rng.random() < 0.8:
            arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice(FLOATS)
        else:
            arr = arr.reshape(-1)[: rng.randrange(arr.size)]
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
    elif kind == 4:  # an input dim
        dim = rng.choice(list(g.input[0].type.tensor_type.shape.dim))
        dim.dim_value = rng.choice([0, 1, 2, 5, 2**31, 2**40])
    elif kind == 5:  # no outputs, or an output nothing produces
        if rng.random() < 0.5 or not g.output:
            del g.output[:]
        else:
            g.output[0].name = "nothing"
    else:  # a node dropped: its readers dangle
        g.node.remove(node)
    return m


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("calib") / "images"
    (folder / "a").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(folder / "a" / f"{i}.png")
    return folder


def test_seed_model_quantizes(tmp_path, images):
    for batch in (1, "N"):  # a fixed batch of 1 is calibrated one image at a time
        path = tmp_path / f"seed_{batch}.onnx"
        onnx.save(seed_model(batch), path)
        assert run_case(["check", path])[0] == 0
        assert run_case(["quantize", path, "--calib", images, "--num-calib", 2, "-o", tmp_path / f"q_{batch}.nfir"],
                        protect=[path])[0] == 0


def test_fuzz_onnx_structure(tmp_path, images):
    rng = random.Random(34)
    seeds = [seed_model(1), seed_model("N")]
    raw = seeds[0].SerializeToString()
    byte_cases = iter(mutations(raw, rng, fuzz_cases(150)))
    for case in range(fuzz_cases(150)):
        path = tmp_path / f"m{case % 4}.onnx"
        if case % 5 == 4:
            path.write_bytes(next(byte_cases))
        else:
            model = mutate(rng.choice(seeds), rng)
            if rng.random() < 0.3:
                model = mutate(model, rng)
            path.write_bytes(model.SerializeToString())
        code, _ = run_case(["check", path], protect=[path])
        if case % 4 == 0:
            run_case(["optimize", path, "-o", tmp_path / "o.nfir", "--force"], protect=[path])
        if code == 0 and case % 12 == 0:  # what check passes must calibrate in ONNX Runtime and quantize
            run_case(["quantize", path, "--calib", images, "--num-calib", 2, "-o", tmp_path / "q.nfir", "--force"],
                     protect=[path])


# -- one named test per refusal -------------------------------------------------------------


def _with(op_name, **attrs) -> onnx.ModelProto:
    m = seed_model()
    node = next(n for n in m.graph.node if n.op_type == op_name)
    for k, v in attrs.items():
        _set_attr(node, k, v)
    return m


def refusal(model, *fragments):
    with pytest.raises(NpuforgeError) as e:
        import_onnx(model)
    text = str(e.value)
    assert "\n" not in text
    for f in fragments:
        assert f in text, text
    return text


@pytest.mark.parametrize("op_name, attr, value, says", [
    ("Conv", "pads", [-1, 0, 0, 0], "holds -1"),
    ("Conv", "pads", [2**31, 0, 0, 0], "holds 2147483648"),
    ("Conv", "strides", [0, 1], "'strides' holds 0"),
    ("MaxPool", "strides", [0, 0], "'strides' holds 0"),
    ("MaxPool", "kernel_shape", [2.0, 2.0], "'kernel_shape' is [2.0, 2.0], expected a list of integers"),
    ("MaxPool", "dilations", [1.5, 1.0], "'dilations' is [1.5, 1.0]"),
    ("Softmax", "axis", "1", "'axis' is '1', expected an integer"),
    ("Concat", "axis", "1", "'axis' is '1'"),
    ("Gemm", "alpha", [1.5], "'alpha' is [1.5], expected a number"),
    ("Resize", "mode", b"\xff\xfe", "not UTF-8"),
])
def test_bad_attribute_is_named(op_name, attr, value, says):
    refusal(_with(op_name, **{attr: value}), f"({op_name})", says)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 1e38, 1e6])
def test_resize_scale_not_finite_or_huge(scale):
    m = seed_model()
    t = next(t for t in m.graph.initializer if t.name == "scales")
    t.CopyFrom(numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales"))
    refusal(m, "(Resize)")


def test_tile_over_the_size_limit():
    m = seed_model()
    t = next(t for t in m.graph.initializer if t.name == "repeats")
    t.CopyFrom(numpy_helper.from_array(np.array([1, 1, 2**30, 1], np.int64), "repeats"))
    refusal(m, "(Tile)", "limit of 2^31")


def test_batch_of_2_to_the_40():
    m = seed_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2**40
    refusal(m, "'x'", "limit of 2^31")


def test_reflect_pad_wider_than_its_input():
    m = seed_model()
    t = next(t for t in m.graph.initializer if t.name == "pads")
    t.CopyFrom(numpy_helper.from_array(np.array([0, 0, 16, 1, 0, 0, 1, 1], np.int64), "pads"))
    refusal(m, "(Pad)", "reflect pads")


def test_graph_without_outputs():
    m = seed_model()
    del m.graph.output[:]
    refusal(m, "no outputs")


def test_non_finite_weight_named_before_calibration(tmp_path, images):
    m = seed_model()
    t = next(t for t in m.graph.initializer if t.name == "b")
    t.CopyFrom(numpy_helper.from_array(np.array([0, -np.inf, 0, 0], np.float32), "b"))
    onnx.save(m, tmp_path / "m.onnx")
    code, err = run_case(["quantize", tmp_path / "m.onnx", "--calib", images, "--num-calib", 2,
                          "-o", tmp_path / "q.nfir"])
    assert code == 2 and "initializer 'b'" in err and "input data" not in err, err


def test_layernorm_epsilon_inf_quantizes(tmp_path, images):
    onnx.save(_with("LayerNormalization", epsilon=float("inf")), tmp_path / "m.onnx")
    code, err = run_case(["quantize", tmp_path / "m.onnx", "--calib", images, "--num-calib", 2,
                          "-o", tmp_path / "q.nfir"])
    assert code == 0, err


def test_calibration_ort_error_is_one_line(monkeypatch):
    import onnxruntime as ort

    from npuforge.quant import calibrate as cal

    class Broken:
        def __init__(self, *a, **k):
            raise ort.capi.onnxruntime_pybind11_state.Fail(
                "Non-zero status code returned while running Conv node. Name:'conv' Status Message: boom")

    graph = import_onnx(seed_model())
    monkeypatch.setattr(ort, "InferenceSession", Broken)
    with pytest.raises(NpuforgeError, match="model 'fuzz', node 'conv'"):
        cal._ort_forward(graph, {"c"})


def test_fixed_batch_split():
    from npuforge.quant.calibrate import split_to_fixed_batch

    graph = import_onnx(seed_model(2))
    parts = split_to_fixed_batch(graph, {"x": np.arange(5.0).reshape(5, 1)})
    assert [p["x"].reshape(-1).tolist() for p in parts] == [[0, 1], [2, 3], [4, 0]]
