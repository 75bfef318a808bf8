"""``npuforge zoo``: list, evaluate, export and run the zoo models.

    npuforge zoo list [PATTERN] [--json]
    npuforge zoo eval NAME --data DIR [--class-table TSV] [--batch-size N] [--limit N] [--json]
    npuforge zoo export NAME --output model.onnx
    npuforge zoo predict NAME IMAGE... [--top K]

User errors raise NpuforgeError; ``npuforge.cli.main`` prints them as
``npuforge: error: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..argtypes import int_between, positive_int
from ..errors import NpuforgeError
from ..outputs import Planned


def _run_checkpoint(args):
    """``name`` may be a training run's checkpoint (``npuforge zoo train``): its model, else None."""
    from ..train.checkpoint import class_table_of, model_from, read_run

    state = read_run(args.name)
    if state is None:
        return None
    model, _, preprocess = model_from(state)
    model.run_preprocess, model.run_classes = preprocess, class_table_of(state, args.name)
    model.run_category_ids = state.get("category_ids")  # a detector's COCO category ids
    return model


def _build(args, *, default_pretrained: bool = True):
    from .registry import create_model, get_config

    model = _run_checkpoint(args)
    if model is not None:
        return model

    config = get_config(args.name)  # unknown name -> NpuforgeError with close matches
    kwargs = {}
    if getattr(args, "image_size", None):
        if not args.name.startswith("efficientnet_lite") and not _is_detector(args.name):
            raise NpuforgeError(f"--image-size applies to the efficientnet_lite models (static TF padding) and the "
                                f"detectors (their priors); {args.name} takes any input size")
        kwargs["image_size"] = args.image_size
    pretrained = args.pretrained
    if pretrained is None:
        pretrained = default_pretrained and config.has_weights and args.checkpoint is None
        if not pretrained and args.checkpoint is None and not args.quiet:
            print(f"npuforge: note: {args.name} uses random weights (no pretrained weights ship with it; "
                  f"pass --checkpoint FILE for trained ones)", file=sys.stderr)
    return create_model(args.name, pretrained=pretrained, num_classes=args.num_classes,
                        checkpoint=args.checkpoint, **kwargs)


def _is_detector(name: str) -> bool:
    from ..detection.train import is_detector

    return is_detector(name)


def _detector_outputs(model) -> list[str] | None:
    """The output names of a zoo detector (RetinaNet: 2, FCOS: 3), None for a classifier."""
    from ..detection.fpn import DenseDetector

    return list(model.output_names) if isinstance(model, DenseDetector) else None


def cmd_list(args) -> int:
    from .registry import get_config, list_models

    names = list_models(args.pattern)
    if not names:
        raise NpuforgeError(f"no model matches '{args.pattern}'; `npuforge zoo list` shows them all")
    rows = []
    for n in names:
        c = get_config(n)
        rows.append({"name": n, "input_size": list(c.input_size), "resize": c.resize_size,
                     "interpolation": c.interpolation, "mean": list(c.mean), "std": list(c.std),
                     "num_classes": c.num_classes, "weights": c.weight_source, "top1_published": c.top1_published})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(n) for n in names)
    print(f"{'model':<{width}}  {'input':<11} {'top-1*':>6}  weights")
    for r in rows:
        size = "x".join(str(s) for s in r["input_size"][1:])
        top1 = f"{r['top1_published']:.1f}" if r["top1_published"] is not None else "-"
        print(f"{r['name']:<{width}}  {size:<11} {top1:>6}  {r['weights']}")
    print("* published ImageNet-val top-1 (percent) of the shipped weights")
    return 0


def cmd_eval(args) -> int:
    from .data import ImageDataset
    from .evaluate import evaluate
    from .registry import get_config
    from .transforms import eval_transform

    model = _run_checkpoint(args)
    if model is None:
        get_config(args.name)  # a misspelt model name fails before the folder is scanned
    table = args.class_table or (model.run_classes if model is not None else None)
    dataset = ImageDataset(args.data, class_table=table, limit=args.limit)
    if model is None:
        model = _build(args)
        transform = eval_transform(model.zoo_config, args.image_size)
    else:
        from ..workflow import transform_of

        transform = transform_of(model.run_preprocess)
    result = evaluate(model, dataset, transform, batch_size=args.batch_size, workers=args.workers,
                      progress=not args.quiet, name=args.name)
    for line in result.skipped_files:
        print(f"npuforge: warning: skipped {line}", file=sys.stderr)
    if args.json:
        out = result.to_dict()
        out["preprocessing"] = repr(transform)
        print(json.dumps(out, indent=2))
    else:
        print(f"{result.model} on {result.data}: {result.images} images"
              + (f" ({result.skipped} corrupt, skipped)" if result.skipped else ""))
        print(f"top-1 {result.top1:.2f} %   top-5 {result.top5:.2f} %   {result.images_per_s:.1f} images/s")
    return 0


def cmd_export(args) -> int:
    import numpy as np
    import onnxruntime as ort
    import torch

    from ..frontend.torch_frontend import export_onnx

    out = Path(args.output)
    if out.is_dir():
        raise NpuforgeError(f"--output {out}: is a folder; give a file name such as model.onnx")
    if not out.parent.exists():
        raise NpuforgeError(f"--output {out}: folder {out.parent} does not exist; create it first")
    model = _build(args).eval()
    _, h, w = model.zoo_config.input_size
    if args.image_size:
        h = w = args.image_size
    outputs = _detector_outputs(model)
    if outputs is not None:  # its raw head rows, at the size its priors are built for
        if args.image_size and (args.image_size, args.image_size) != tuple(model.image_size):
            raise NpuforgeError(f"--image-size {args.image_size}: {args.name} is a detector trained at "
                                f"{model.image_size[0]}x{model.image_size[1]} (its priors); leave --image-size out")
        h, w = model.image_size
    gen = torch.Generator().manual_seed(0)
    example = torch.randn(1, 3, h, w, generator=gen)
    check = torch.randn(2, 3, h, w, generator=gen)  # batch 2: also exercises the dynamic batch axis
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if outputs is None:
            export_onnx(model, example, tmp, opset=args.opset)
            record = {"preprocess": getattr(model, "run_preprocess", None) or _classifier_preprocess(model, h, w)}
            table = getattr(model, "run_classes", None)  # a training run's classes
            if table is not None:
                record["class_table"] = {"wnids": list(table.wnids), "names": list(table.names)}
            _record(tmp, record)
        else:
            export_onnx(model, example, tmp, opset=args.opset, input_names=("images",), output_names=outputs)
            _record_detector(tmp, model, args.name)
        with torch.no_grad():
            refs = model(check)
            refs = [t.numpy() for t in refs] if outputs is not None else [refs.numpy()]
        try:
            sess = ort.InferenceSession(tmp, providers=["CPUExecutionProvider"])
            gots = sess.run(None, {sess.get_inputs()[0].name: check.numpy()})
        except Exception as e:  # ORT raises its own exception types
            raise NpuforgeError(f"{args.name}: ONNX Runtime cannot run the exported model ({str(e)[:200]}); "
                                f"nothing written to {out}") from None
        diff = max(float(np.abs(got - ref).max()) for got, ref in zip(gots, refs))
        tol = 1e-3 * max(1.0, max(float(np.abs(ref).max()) for ref in refs))
        if not np.isfinite(diff) or diff > tol:
            raise NpuforgeError(f"{args.name}: ONNX Runtime output differs from PyTorch by {diff:.3g} "
                                f"(> {tol:.3g}); nothing written to {out}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    rows = f"; outputs {', '.join(outputs)} (raw head rows)" if outputs is not None else ""
    print(f"wrote {out} ({args.name}, input [N, 3, {h}, {w}], dynamic batch, opset {args.opset}{rows}); "
          f"ONNX Runtime vs PyTorch max abs diff {diff:.3g}")
    return 0


def _classifier_preprocess(model, h: int, w: int) -> dict:
    """The zoo model's preprocessing at the exported size (the crop's margin kept in proportion)."""
    from ..workflow import preprocess_of

    pre = preprocess_of(model.zoo_config)
    crop = pre["crop_size"]
    if [h, w] != list(crop):
        pre["resize_size"] = int(round(pre["resize_size"] * max(h, w) / max(crop)))
        pre["crop_size"] = [h, w]
    return pre


def _record(path, record: dict) -> None:
    """``record`` as the ONNX file's ``npuforge`` metadata, which npuforge's importer reads into the
    graph's metadata (quantize and eval then preprocess as the zoo model does)."""
    import onnx

    proto = onnx.load(path)
    del proto.metadata_props[:]
    proto.metadata_props.add(key="npuforge", value=json.dumps(record))
    onnx.save(proto, path)


def _record_detector(path, model, name: str) -> None:
    """Write the detector's record (classes, input size, preprocessing, outputs) into the ONNX file's
    ``npuforge`` metadata, which npuforge's importer reads into the graph's metadata."""
    from ..workflow import preprocess_of

    h, w = model.image_size
    preprocess = getattr(model, "run_preprocess", None) or {**preprocess_of(model.zoo_config),
                                                             "crop_size": [h, w], "resize_size": h, "fit": "resize"}
    table = getattr(model, "run_classes", None)
    classes = list(table.names) if table is not None else [str(k) for k in range(model.num_classes)]
    _record(path, {"preprocess": preprocess,
                   "dense_detector": {"model": model.zoo_name, "source": name, "classes": classes,
                                      "category_ids": getattr(model, "run_category_ids", None),
                                      "input_size": [h, w], "outputs": list(model.output_names)}})


def cmd_predict(args) -> int:
    from .data import read_class_table
    from .evaluate import predict
    from .transforms import eval_transform

    names = read_class_table(args.class_table).names if args.class_table else None
    model = _build(args)
    results = predict(model, args.images, k=args.top, transform=eval_transform(model.zoo_config, args.image_size),
                      class_names=names)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(r["image"])
        for t in r["top"]:
            print(f"  {100 * t['probability']:6.2f} %  {t['index']:>4}  {t['name']}")
    return 0


def _model_options(p, pretrained_help: str) -> None:
    p.add_argument("name", help="a zoo model name (`npuforge zoo list`), or a training run's checkpoint "
                                "(RUN_DIR/best.pt of `npuforge zoo train`)")
    p.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=None, help=pretrained_help)
    p.add_argument("--checkpoint", metavar="FILE", help="load these weights (state dict, .pth or .safetensors) "
                   "strictly after building")
    p.add_argument("--num-classes", type=positive_int, metavar="N", help="classifier width (default: the config's)")
    p.add_argument("--image-size", type=positive_int, metavar="PX",
                   help="input size for the efficientnet_lite models (default: the config's)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes on stderr")


def add_zoo_parser(subparsers) -> None:
    """Add ``npuforge zoo ...`` to the top-level CLI's subparsers."""
    zoo = subparsers.add_parser("zoo", help="model zoo: list, train, evaluate, export and run reference models",
                                description="Reference models (EfficientNet-Lite and MobileNetV2 with ImageNet weights, "
                                            "ResNet, ShuffleNetV2) to train, evaluate, export and quantize.")
    sub = zoo.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    sub.required = True

    p = sub.add_parser("list", help="list the zoo models with input size, weights and published top-1")
    p.add_argument("pattern", nargs="?", help="an fnmatch pattern, e.g. 'efficientnet*'")
    p.add_argument("--json", action="store_true", help="print JSON with each model's preprocessing config")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("eval", help="top-1/top-5 accuracy on a folder of labelled images",
                       description="Evaluate a zoo model in float (PyTorch) on an ImageFolder (one subfolder per "
                                   "class) or a flat folder of <wnid>_<name>.JPEG files. Corrupt images are "
                                   "skipped and counted.")
    _model_options(p, "load the published weights (default: yes when the model has them and no --checkpoint)")
    p.add_argument("--data", required=True, metavar="DIR", help="the image folder")
    p.add_argument("--class-table", metavar="TSV", help="class table with columns index, wnid, name "
                   "(default: the built-in ImageNet-1k table)")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="images per batch (default 32)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N images (sorted order)")
    p.add_argument("--workers", type=positive_int, default=2, metavar="N", help="image decoding threads (default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object (top1, top5 in percent, images, "
                   "skipped, images_per_s ...)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="export to ONNX (dynamic batch), checked against PyTorch with ONNX Runtime",
                       description="Export a zoo model to ONNX with a dynamic batch axis, run it in ONNX Runtime "
                                   "against PyTorch, and write the file only when they agree.")
    _model_options(p, "load the published weights (default: yes when the model has them and no --checkpoint)")
    p.add_argument("--output", "-o", required=True, metavar="FILE.onnx", help="where to write the model")
    p.add_argument("--opset", type=int_between(13, 20, "opsets PyTorch's exporter writes and npuforge reads"), default=17,
                   help="ONNX opset, 13 to 20 (default 17)")
    p.set_defaults(func=cmd_export, outputs=lambda a: [Planned(Path(a.output), "onnx", "--output")])

    from ..train.cli import add_train_parser

    add_train_parser(sub)

    from ..detection.cli import add_detection_set_parser

    add_detection_set_parser(sub)

    p = sub.add_parser("predict", help="top-5 classes of some images",
                       description="Classify images with a zoo model and print the top classes with names.")
    _model_options(p, "load the published weights (default: yes when the model has them and no --checkpoint)")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument("--top", type=positive_int, default=5, metavar="K", help="how many classes to show (default 5)")
    p.add_argument("--class-table", metavar="TSV", help="class names (default: the model's)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_predict)
