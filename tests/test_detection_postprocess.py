"""RetinaNet and FCOS as one graph with decoding, scores and NMS (npuforge.detection.postprocess):
the float graph against the model's own decode plus a plain per-class greedy NMS, and against
ONNX Runtime running the same graph; quantized, the box path in int16 and the whole detector in
the integer simulator.

Small: random heads (fpn_channels 16, one tower conv) at 64x64, CPU."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import npuforge
from npuforge.detection.boxes import nms
from npuforge.detection.postprocess import detections, postprocess_graph
from npuforge.errors import NpuforgeError
from npuforge.export.onnx_export import to_onnx
from npuforge.frontend.torch_frontend import export_onnx
from npuforge.sim.integer import IntegerSimulator
from npuforge.zoo import create_model

pytestmark = pytest.mark.slow  # detector tests run once, not on each kernel set (make test-kernels)

SIZE = 64
THRESHOLDS = {"score_threshold": 0.02, "iou_threshold": 0.5, "max_detections": 30}
NAMES = ["retinanet_mobilenet_v2_fpn", "fcos_mobilenet_v2_fpn"]


def detector(name: str, tmp_path):
    torch.manual_seed(0)
    model = create_model(name, pretrained=False, num_classes=3, image_size=SIZE, fpn_channels=16, num_convs=1).eval()
    with torch.no_grad():  # the zoo's initialisation scores every prior alike: spread the outputs out
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight)
        for m in (model.head.cls_logits, model.head.box_regression):
            m.weight.mul_(0.1)
        model.head.cls_logits.bias.fill_(-3.0)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, SIZE, SIZE)).astype(np.float32))
    export_onnx(model, x[:1], tmp_path / "head.onnx", output_names=list(model.output_names))
    graph = postprocess_graph(npuforge.load(tmp_path / "head.onnx"), model, **THRESHOLDS)
    return model, graph, x


def reference(model, x) -> list[tuple]:
    """model.decode's boxes and scores, then per class every score above the threshold through
    greedy NMS (the first max_detections kept), the best max_detections of the image, clipped."""
    with torch.no_grad():
        boxes, scores = model.decode(model(x))
    results = []
    for b in range(len(x)):
        picks = []
        for c in range(scores.shape[2]):
            index = torch.nonzero(scores[b, :, c] > THRESHOLDS["score_threshold"]).flatten()
            keep = nms(boxes[b, index], scores[b, index, c], THRESHOLDS["iou_threshold"])
            picks += [(float(scores[b, i, c]), c, int(i)) for i in index[keep[:THRESHOLDS["max_detections"]]]]
        picks = sorted(picks, key=lambda p: -p[0])[:THRESHOLDS["max_detections"]]
        kept = boxes[b, [p[2] for p in picks]].reshape(-1, 4).numpy()
        results.append((np.clip(kept, 0, SIZE), np.array([p[0] for p in picks]), np.array([p[1] for p in picks])))
    return results


@pytest.mark.parametrize("name", NAMES)
def test_float_graph_equals_decode_plus_greedy_nms(name, tmp_path):
    model, graph, x = detector(name, tmp_path)
    kind = graph.metadata["detector"]["kind"]
    got = detections(graph.run({graph.inputs[0]: x.numpy()}), kind, (SIZE, SIZE), THRESHOLDS["max_detections"])
    want = reference(model, x)
    for (boxes, scores, labels), (rb, rs, rl) in zip(got, want):
        assert 5 <= len(boxes) == len(rb) <= THRESHOLDS["max_detections"]
        assert len(np.unique(scores)) == len(scores)  # no ties: one order
        np.testing.assert_array_equal(labels, rl)
        # the graph runs on npuforge's float kernels, the model on torch's: on the portable kernels
        # (ATEN_CPU_CAPABILITY=default) a score differs by 1.8e-5 relative, so 1e-4, as for the boxes
        np.testing.assert_allclose(scores, rs, rtol=1e-4)
        np.testing.assert_allclose(boxes, rb, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_onnx_runtime_runs_the_graph_and_selects_the_same(name, tmp_path):
    _, graph, x = detector(name, tmp_path)
    ours = graph.run({graph.inputs[0]: x.numpy()})
    sess = ort.InferenceSession(to_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = dict(zip(graph.outputs, sess.run(graph.outputs, {graph.inputs[0]: x.numpy()})))
    for name in ("decoded", "scores"):  # float kernels differ: a bound relative to the largest value
        assert np.abs(theirs[name] - ours[name]).max() <= 1e-4 * np.abs(ours[name]).max(), name
    as_set = lambda s: {tuple(r) for r in np.asarray(s).reshape(-1, 3).tolist()}  # noqa: E731
    assert len(as_set(ours["selected"])) > 10 and as_set(theirs["selected"]) == as_set(ours["selected"])


@pytest.mark.parametrize("name", NAMES)
def test_quantized_end_to_end_in_integers(name, tmp_path):
    """The box path (regressor convolutions to the decoded boxes, anchors / points included) in
    int16 as the graph records, scores in uint8; the integer simulator runs decode and NMS on
    codes and finds the float graph's best box of each image."""
    model, graph, x = detector(name, tmp_path)
    calib = [np.random.default_rng(k).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32) for k in range(4)]
    q = npuforge.quantize(graph, calib + [x.numpy()[k:k + 1] for k in range(2)],
                          {"int16": graph.metadata["detector"]["int16"]})
    assert q.values["decoded"].quant.dtype == "int16" and q.values["scores"].quant.dtype == "uint8"
    # the anchors / points, their copies included (one constant read by two nodes gets one per node)
    box_nodes = [n for n in q.nodes if n.name.startswith("postprocess/") and q.values[n.outputs[0]].quant is not None
                 and q.values[n.outputs[0]].quant.dtype == "int16"]
    anchors = [i for n in box_nodes for i in n.inputs if i and q.values[i].is_const and q.values[i].quant is not None]
    assert len(anchors) >= 2 and all(q.values[i].quant.dtype == "int16" for i in anchors)
    assert not q.metadata["quantization"]["float_nodes"]
    # decoding and scores in integers against the model's float decode of the same (dequantized) head rows
    model_rows = list(graph.metadata["detector"]["head_rows"])
    out = IntegerSimulator(q).run({q.inputs[0]: x.numpy()}, outputs=model_rows + ["decoded", "scores"])
    with torch.no_grad():
        boxes, scores = model.decode(tuple(torch.from_numpy(out[r]) for r in model_rows))
    decoded = out["decoded"]
    if graph.metadata["detector"]["kind"] == "retinanet":  # centre, size -> corners
        decoded = np.concatenate([decoded[..., :2] - decoded[..., 2:] / 2, decoded[..., :2] + decoded[..., 2:] / 2], -1)
    else:
        scores = scores ** 2  # the graph's scores: the product, not its square root
    box_step, score_step = float(q.values["decoded"].quant.scale), float(q.values["scores"].quant.scale)
    box_err = np.abs(decoded - boxes.numpy()).max()
    score_err = np.abs(out["scores"] - scores.numpy().transpose(0, 2, 1)).max()
    # measured: RetinaNet 6.2 box steps (its sizes pass the exp table and the anchor product), scores
    # 0.49 steps (one table); FCOS 0.9 box steps (exact sums), scores 1.6 steps (two tables, a product)
    retina = graph.metadata["detector"]["kind"] == "retinanet"
    assert box_err <= (10 if retina else 1.5) * box_step
    assert score_err <= (0.51 if retina else 2.0) * score_step
    selected = IntegerSimulator(q).run({q.inputs[0]: x.numpy()})["selected"]
    assert 0 < len(selected) <= 2 * THRESHOLDS["max_detections"] * scores.shape[2]


def test_refuses_a_graph_that_is_not_the_head(tmp_path):
    model, graph, _ = detector(NAMES[0], tmp_path)
    with pytest.raises(NpuforgeError, match="head rows"):
        postprocess_graph(graph, model)
