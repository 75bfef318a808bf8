"""A trained zoo detector (RetinaNet or FCOS) in int8: COCO mAP of FP32, fake-quant and the
integer simulator, per tensor and per channel, in one run; with float post-processing, or
(``--end-to-end``) with decoding, scores and NMS in the graph, quantized and simulated too.

    .venv/bin/python benchmarks/detector_int8.py RUN_DIR/best.pt --data DIR --annotations COCO.json \\
        [--num-calib 64] [--eval 100] [--end-to-end]

The run checkpoint (``npuforge zoo train DETECTOR --annotations ...``) is exported to ONNX
(its raw head rows, at the run's input size) and imported; ``npuforge.quantize`` quantizes
it on the first --num-calib images of the set, uint8 activations. The next --eval images
are the evaluation images (give a set the run did not train on, e.g. one written with
another ``--seed``). Each engine's head rows go through the model's own decode and
class-wise NMS (``model.detect``, the run's thresholds): the int8 network with float
post-processing. Reported: mAP@[.5:.95] and mAP@0.5 (pycocotools), and the share of images
on which the integer simulator keeps fake-quant's boxes scoring --agree-threshold or more
(same count and labels, IoU >= 0.99 each). ``--end-to-end`` appends the post-processing
(:mod:`npuforge.detection.postprocess`) and quantizes its box path in int16, as the graph
records; the integer simulator then runs NMS on codes too. Two more agreements tell where
the images that differ part, end to end:

* the fake-quant executor in float32 against itself in float64: two float simulations of
  the one program, the noise floor of any comparison with fake-quant;
* the post-processing alone (decode, scores, NMS), integer against fake-quant, both fed the
  integer simulator's head codes of each image: what the integer post-processing adds.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import npuforge  # noqa: E402
from npuforge.detection.boxes import box_iou  # noqa: E402
from npuforge.detection.coco import load_coco  # noqa: E402
from npuforge.detection.metric import coco_map  # noqa: E402
from npuforge.detection.postprocess import detections, postprocess_graph  # noqa: E402
from npuforge.detection.train import DetectionSampleSet  # noqa: E402
from npuforge.frontend.torch_frontend import export_onnx  # noqa: E402
from npuforge.sim.fake_quant import run_fake_quant  # noqa: E402
from npuforge.sim.integer import IntegerSimulator  # noqa: E402
from npuforge.train.checkpoint import load_run, model_from  # noqa: E402


def same_boxes(a, b, threshold: float) -> bool:
    """The detections scoring at least ``threshold`` of both: the same count, labels and boxes (IoU >= 0.99)."""
    a, b = ([t[s >= threshold] for t in d] for d, s in ((a, a[1]), (b, b[1])))
    if len(a[0]) != len(b[0]):
        return False
    return len(a[0]) == 0 or bool((box_iou(a[0], b[0]).diagonal() >= 0.99).all() and torch.equal(a[2], b[2]))


def postprocess_only(q, heads: list):
    """The quantized detector from its head rows on: ``heads`` its inputs, the network gone."""
    post = copy.deepcopy(q)
    needed, nodes = set(post.outputs), []
    for node in reversed(post.nodes):
        if any(o in needed for o in node.outputs if o) and not any(o in heads for o in node.outputs):
            nodes.append(node)
            needed.update(i for i in node.inputs if i)
    post.nodes, post.inputs = nodes[::-1], list(heads)
    return post


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--data", required=True, type=Path, help="the images of --annotations")
    ap.add_argument("--annotations", required=True, type=Path)
    ap.add_argument("--num-calib", type=int, default=64)
    ap.add_argument("--eval", type=int, default=100, help="images after the calibration ones to evaluate")
    ap.add_argument("--granularity", default="per-tensor,per-channel")
    ap.add_argument("--agree-threshold", type=float, default=0.3,
                    help="compare the integer simulator's and fake-quant's detections above this score (default 0.3)")
    ap.add_argument("--fake-precision", choices=("float32", "float64"), default="float32",
                    help="the fake-quant executor's kernels (float64: no float32 rounding noise)")
    ap.add_argument("--end-to-end", action="store_true",
                    help="decoding, scores and NMS in the graph (int16 box path) instead of float post-processing")
    args = ap.parse_args()

    state = load_run(args.checkpoint)
    model, classes, pp = model_from(state)
    size = tuple(state["image_size"])
    thresholds = state["detect"]
    ds = load_coco(args.annotations, args.data)
    ids = list(state["category_ids"])
    if sorted(ids) != sorted(ds.category_names):
        raise SystemExit(f"{args.annotations}: categories {sorted(ds.category_names)} are not the run's {ids}")
    samples = [(str(ds.image_path(im)), [], [], im["id"], im["width"], im["height"]) for im in ds.images]
    images = DetectionSampleSet(samples, size, pp["mean"], pp["std"], pp["interpolation"], 0, train=False)
    calib = [images[(0, k)][0][None] for k in range(args.num_calib)]
    evaluated = range(args.num_calib, min(len(samples), args.num_calib + args.eval))
    wanted = {ds.images[k]["id"] for k in evaluated}
    subset = replace(ds, raw={**ds.raw, "images": [im for im in ds.raw["images"] if im["id"] in wanted],
                              "annotations": [a for a in ds.raw["annotations"] if a["image_id"] in wanted]})
    work = Path(tempfile.mkdtemp(prefix="npuforge-det-int8-"))
    export_onnx(model, torch.from_numpy(calib[0]), work / "det.onnx", output_names=list(model.output_names))
    graph = npuforge.load(work / "det.onnx")
    int16 = []
    if args.end_to_end:
        postprocess_graph(graph, model, **thresholds)
        int16 = graph.metadata["detector"]["int16"]

    def kept_of(out) -> tuple:
        return tuple(torch.from_numpy(np.asarray(t)) for t in detections(
            out, graph.metadata["detector"]["kind"], size, thresholds["max_detections"])[0])

    def evaluate(run) -> tuple[dict, dict]:
        found, kept = {}, {}
        for k in evaluated:
            x, target, _ = images[(0, k)]
            out = run({graph.inputs[0]: x[None]})
            if args.end_to_end:
                boxes, scores, labels = kept_of(out)
            else:
                rows = tuple(torch.from_numpy(np.asarray(out[n], np.float32)) for n in graph.outputs)
                boxes, scores, labels = model.detect(rows, image_size=size, **thresholds)[0]
            kept[k] = (boxes, scores, labels)
            sx, sy = target["scale"]
            found[samples[k][3]] = ((boxes * torch.tensor([sx, sy, sx, sy])).numpy(), scores.numpy(),
                                    np.asarray([ids[int(c)] for c in labels]))
        return coco_map(subset, found), kept

    floors = []

    heads = list(model.output_names) if args.end_to_end else []

    def where_they_part(q, head_codes: list, fake_kept) -> tuple[int, int]:
        """(images on which fake-quant in the other precision keeps fake-quant's detections,
        images on which the post-processing alone agrees on the integer simulator's head codes,
        ``head_codes`` in the order of the evaluation images)."""
        other = "float64" if args.fake_precision == "float32" else "float32"
        _, other_kept = evaluate(lambda feeds: run_fake_quant(q, feeds, precision=other))
        post = postprocess_only(q, heads)
        post_sim = IntegerSimulator(post)
        alone = 0
        for codes in head_codes:
            as_int = post_sim.run(codes)
            as_fake = run_fake_quant(post, {h: q.values[h].quant.dequantize(codes[h]) for h in heads},
                                     precision=args.fake_precision)
            alone += same_boxes(kept_of(as_fake), kept_of(as_int), args.agree_threshold)
        return sum(same_boxes(fake_kept[k], other_kept[k], args.agree_threshold) for k in evaluated), alone

    rows = []
    t = time.perf_counter()
    fp32, _ = evaluate(graph.run)
    rows.append(("FP32 (npuforge float)", fp32, None, time.perf_counter() - t))
    for granularity in args.granularity.split(","):
        t = time.perf_counter()
        q = npuforge.quantize(graph, calib, {"granularity": granularity, "int16": int16})
        qs = time.perf_counter() - t
        fake, fake_kept = evaluate(lambda feeds: run_fake_quant(q, feeds, precision=args.fake_precision))
        sim, head_codes = IntegerSimulator(q), []

        def integer_run(feeds):  # keeps each image's head codes too (exact: codes -> floats -> codes)
            out = sim.run(feeds, outputs=[*graph.outputs, *heads])
            head_codes.append({h: q.values[h].quant.quantize(out[h]) for h in heads})
            return out

        integer, int_kept = evaluate(integer_run)
        same = sum(same_boxes(fake_kept[k], int_kept[k], args.agree_threshold) for k in evaluated)
        rows.append((f"int8 {granularity}, fake-quant", fake, None, qs))
        rows.append((f"int8 {granularity}, integer simulator", integer, same, time.perf_counter() - t))
        if args.end_to_end:
            floors.append((granularity, *where_they_part(q, head_codes, fake_kept)))

    print(f"{state['model_name']}: {len(evaluated)} evaluation images, {args.num_calib} calibration, "
          f"input {size[0]}x{size[1]}, {'post-processing in the graph' if args.end_to_end else 'float post-processing'}"
          f" ({thresholds})")
    print(f"| engine | mAP@[.5:.95] | mAP@0.5 | integer = fake-quant (scores >= {args.agree_threshold:g}) | s |")
    print("|---|---:|---:|---:|---:|")
    for name, m, same, s in rows:
        agree = "" if same is None else f"{same}/{len(evaluated)}"
        print(f"| {name} | {m['map']:.4f} | {m['map50']:.4f} | {agree} | {s:.0f} |", flush=True)
    if floors:
        other = "float64" if args.fake_precision == "float32" else "float32"
        print(f"\n| granularity | fake-quant {args.fake_precision} = {other} | post-processing alone on the integer "
              f"simulator's head codes: integer = fake-quant |\n|---|---:|---:|")
        for granularity, floor, alone in floors:
            print(f"| {granularity} | {floor}/{len(evaluated)} | {alone}/{len(evaluated)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
