"""``npuforge zoo detection-set``: write a seeded synthetic detection set (COCO format)."""

from __future__ import annotations

import json
from collections import Counter

from pathlib import Path

from ..argtypes import positive_int
from ..outputs import Planned
from ..workflow import plain_fallback_note, stderr_log


def add_detection_set_parser(sub) -> None:
    p = sub.add_parser(
        "detection-set", help="write a seeded synthetic detection set (shapes on photos, COCO json)",
        description="Paste squares, circles, triangles and crosses (the 4 categories) with random colours and "
                    "stripe textures onto photos of --photos, 1 to --max-objects per image, boxes never "
                    "overlapping, and write OUT/images/*.png and OUT/annotations.json (COCO). The same "
                    "arguments give the same bytes; the first N images of a larger set are the N-image set.")
    p.add_argument("--photos", required=True, metavar="DIR", help="background photos (any image files, recursively)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="the folder to write (must not hold a set)")
    p.add_argument("--images", type=positive_int, default=200, metavar="N", help="images to write (default 200)")
    p.add_argument("--size", type=positive_int, default=160, metavar="S", help="image side in pixels (default 160)")
    p.add_argument("--max-objects", type=positive_int, default=4, metavar="M", help="shapes per image at most "
                                                                                    "(default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_detection_set, outputs=lambda a: [Planned(Path(a.output), "dir", "--output")])


def cmd_detection_set(args) -> int:
    from tqdm import tqdm

    from .coco import load_coco
    from .synthetic import make_synthetic_set

    with tqdm(total=args.images, unit="img", desc="rendering", disable=args.json, leave=False) as bar:
        path = make_synthetic_set(args.photos, args.output, args.images, args.size, args.seed, args.max_objects,
                                  progress=lambda n: bar.update(n - bar.n))
    ds = load_coco(path)  # the reader checks what the writer wrote
    counts = Counter(ds.category_names[int(c)] for labels in ds.labels.values() for c in labels)
    summary = {"annotations": str(path), "images": len(ds), "objects": sum(counts.values()),
               "per_category": dict(sorted(counts.items())), "size": args.size, "seed": args.seed}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        per = ", ".join(f"{k} {v}" for k, v in summary["per_category"].items())
        print(f"wrote {summary['images']} images with {summary['objects']} objects ({per}) to {path}")
    return 0


def add_detect_parser(sub) -> None:
    from ..cli import SIM_ENGINE_HELP
    from .blazeface import DETECTORS

    p = sub.add_parser(
        "detect", help="run a detector (BlazeFace, or a RetinaNet / FCOS run) in float, fake-quant or integers "
                       "and draw the boxes",
        description="Run a detector graph (network, box decoding, scores and non-maximum suppression in one "
                    "IR) on images: each image is fitted to the detector's input (BlazeFace: letterboxed into "
                    "its square; a RetinaNet / FCOS run: resized as it trained), the kept boxes are mapped back "
                    "to image pixels, printed, and drawn with -o. MODEL is a BlazeFace detector "
                    f"({', '.join(DETECTORS)}), a detector run's checkpoint (npuforge zoo train "
                    "retinanet_mobilenet_v2_fpn ... -o RUN: RUN/best.pt) or a saved detector IR, float or "
                    "quantized (npuforge quantize face_detection_full_range --calib DIR -o bf.nfir).")
    p.add_argument("model", help="a BlazeFace name, a detector run's checkpoint (.pt) or a saved detector IR (.nfir)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--engine", choices=("float", "fake", "int"),
                   help="float graph, fake-quant, or the integer simulator (NMS on integer codes too); default: "
                        "int for a quantized IR, else float")
    p.add_argument("--sim-engine", choices=("auto", "ort", "plain", "fast"), default="auto",
                   help="with --engine int: " + SIM_ENGINE_HELP)
    p.add_argument("--output", "-o", metavar="OUT", help="annotated image (PNG) for one IMAGE, a folder for several")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_detect, outputs=_planned_drawings)


def _planned_drawings(args):
    """One annotated PNG at OUT for one image; for several, a folder OUT with IMAGE_STEM.png each."""
    from pathlib import Path

    from ..outputs import Planned

    if not args.output:
        return []
    if len(args.images) == 1:
        return [Planned(Path(args.output), "png", "--output")]
    out = Path(args.output)
    return [Planned(out, "dir", "--output")] + [Planned(out / f"{Path(name).stem}.png", "png", "--output",
                                                        f"the drawing of {name}") for name in args.images]


def load_detector(spec: str):
    from pathlib import Path

    from .. import load
    from ..errors import NpuforgeError
    from .blazeface import DETECTORS, detector_graph

    from ..train.checkpoint import read_run

    if spec in DETECTORS and not Path(spec).exists():
        return detector_graph(spec)
    run = read_run(Path(spec))
    if run is not None:
        if run.get("task") != "detection":
            raise NpuforgeError(f"{spec}: a {run.get('model_name', 'classifier')} run, not a detector's")
        from ..workflow import run_graph

        return run_graph(run, spec)  # with its post-processing
    graph = load(spec)
    if "detector" not in graph.metadata:
        raise NpuforgeError(f"{spec}: not a detector graph (no 'detector' record); give one of "
                            f"{', '.join(DETECTORS)}, a detector run's checkpoint, or a quantized copy of one")
    return graph


def _frontend(graph):
    """(prepare, read) for the graph's kind of detector: ``prepare(img) -> (x, back)`` fits a PIL
    image to the input (BlazeFace: letterboxed; RetinaNet / FCOS: resized as they trained);
    ``read(outputs, back) -> (boxes [D, 4] xyxy image pixels, scores [D], labels [D])``."""
    import numpy as np

    from .blazeface import detections, preprocess

    det = graph.metadata["detector"]
    if det.get("kind") in ("retinanet", "fcos"):
        from ..workflow import transform_of
        from .postprocess import detections as dense_detections

        transform, (h, w) = transform_of(graph.metadata["preprocess"]), det["input_size"]

        def prepare(img):
            return transform(img)[None], (img.width / w, img.height / h)

        def read(outputs, back):
            boxes, scores, labels = dense_detections(outputs, det["kind"], (h, w), det["max_detections"])[0]
            return boxes * np.float32([back[0], back[1], back[0], back[1]]), scores, labels

        return prepare, read
    size = det["input_size"]

    def read_faces(outputs, box):
        boxes, scores = detections(outputs, size, box)
        return boxes, scores, np.zeros(len(boxes), np.int64)

    return (lambda img: preprocess(img, size)), read_faces


def _draw(path, img, boxes, scores) -> None:
    import io
    from pathlib import Path

    from PIL import ImageDraw

    from ..fileio import write_atomic

    img = img.convert("RGB")
    d = ImageDraw.Draw(img)
    width = max(2, round(max(img.size) / 300))
    for (x0, y0, x1, y1), s in zip(boxes.tolist(), scores.tolist()):
        d.rectangle([x0, y0, x1, y1], outline=(255, 40, 40), width=width)
        d.text((x0 + width, y0 + width), f"{s:.2f}", fill=(255, 255, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    write_atomic(Path(path), buf.getvalue())


def cmd_detect(args) -> int:
    from pathlib import Path

    from ..images import read_rgb

    graph = load_detector(args.model)
    quantized = any(v.quant is not None for v in graph.values.values())
    engine = args.engine or ("int" if quantized else "float")
    run = _runner(graph, engine, args.model, args.sim_engine, None if args.json else stderr_log)
    prepare, read = _frontend(graph)
    classes = graph.metadata["detector"].get("classes", ["face"])
    out_dir = Path(args.output) if args.output and len(args.images) > 1 else None
    report = []
    for name in args.images:
        img = read_rgb(name)
        x, back = prepare(img)
        boxes, scores, labels = read(run({graph.inputs[0]: x}), back)
        report.append({"image": name, "detections": [{"box": [round(v, 1) for v in b], "score": round(float(s), 4),
                                                      "label": classes[int(c)]}
                                                     for b, s, c in zip(boxes.tolist(), scores, labels)]})
        if args.output:
            _draw(out_dir / f"{Path(name).stem}.png" if out_dir else args.output, img, boxes, scores)
    if args.json:
        print(json.dumps({"model": args.model, "engine": engine, "images": report}, indent=2))
    else:
        for r in report:
            found = "; ".join(f"{d['label']} {d['score']:.2f} at ({', '.join(f'{v:.0f}' for v in d['box'])})"
                              for d in r["detections"])
            print(f"{r['image']}: {len(r['detections'])} detection(s){': ' + found if found else ''}")
        if args.output:
            print(f"  wrote {args.output}")
    return 0


def _runner(graph, engine: str, where: str, sim_engine: str = "auto", log=None):
    """The forward of a detector graph: float, fake-quant or the integer simulator (run by
    ``sim_engine``: see :func:`npuforge.sim.lowered.make_simulator`; ``log`` is told when that
    is the plain simulator)."""
    from ..errors import NpuforgeError

    quantized = any(v.quant is not None for v in graph.values.values())
    if engine != "float" and not quantized:
        raise NpuforgeError(f"--engine {engine}: {where} is not quantized (npuforge quantize it first)")
    if engine == "int":
        from ..sim.lowered import make_simulator

        sim = make_simulator(graph, "fixedpoint", sim_engine)
        if getattr(sim, "fallback", None) and log is not None:
            log(plain_fallback_note(sim.fallback))
        return sim.run
    if engine == "fake":
        from ..sim.fake_quant import run_fake_quant

        return lambda feeds: run_fake_quant(graph, feeds)
    return graph.run


def eval_detection(args) -> int:
    """``npuforge eval MODEL --task detection --data DIR --annotations COCO.json``: COCO mAP."""
    from tqdm import tqdm

    from ..images import read_rgb

    from ..errors import NpuforgeError
    from .coco import load_coco
    from .metric import coco_map

    if not args.annotations:
        raise NpuforgeError("--task detection needs --annotations COCO.json")
    if args.engine == "ort":
        raise NpuforgeError("--engine ort: detection runs in npuforge (npuforge: float or fake-quant; int)")
    graph = load_detector(args.model)
    quantized = any(v.quant is not None for v in graph.values.values())
    engine = "int" if args.engine == "int" else ("fake" if quantized else "float")
    run = _runner(graph, engine, args.model, args.sim_engine, None if args.json else stderr_log)
    ds = load_coco(args.annotations, args.data)
    names = ds.category_names
    prepare, read = _frontend(graph)
    category_ids = graph.metadata["detector"].get("category_ids")  # a RetinaNet / FCOS run: all its categories
    if category_ids is not None:
        if args.category is not None:
            raise NpuforgeError(f"--category {args.category}: {args.model} detects all of its categories; "
                                f"leave --category out")
        if sorted(category_ids) != sorted(names):
            raise NpuforgeError(f"{args.annotations}: category ids {sorted(names)} are not the detector's "
                                f"{sorted(category_ids)}")
        wanted, ids = "all", list(category_ids)
    elif args.category is None and len(names) != 1:
        raise NpuforgeError(f"{args.annotations}: {len(names)} categories; name the detector's with --category "
                            f"({', '.join(sorted(names.values()))})")
    else:
        wanted = args.category or next(iter(names.values()))
        ids = [k for k, v in names.items() if v == wanted]
        if not ids:
            raise NpuforgeError(f"--category {wanted}: not in {args.annotations} "
                                f"({', '.join(sorted(names.values()))})")
    images = ds.images[args.skip:][:args.limit] if args.limit else ds.images[args.skip:]
    found = {}
    for im in tqdm(images, unit="img", desc="detecting", disable=args.quiet or args.json, leave=False):
        x, back = prepare(read_rgb(ds.image_path(im)))
        b, s, labels = read(run({graph.inputs[0]: x}), back)
        found[im["id"]] = (b, s, [ids[int(c)] for c in labels])
    m = coco_map(ds, found)
    result = {"model": args.model, "engine": engine, "images": len(images), "category": wanted,
              "detections": sum(len(v[0]) for v in found.values()), **{k: round(v, 4) for k, v in m.items()}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.model} ({engine}) on {len(images)} images of {args.annotations}: mAP {m['map']:.3f}, "
              f"mAP@0.5 {m['map50']:.3f}, mAP@0.75 {m['map75']:.3f} ({result['detections']} '{wanted}' detections)")
    return 0
