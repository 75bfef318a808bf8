"""Seconds per integer-program evaluation in ``analyze``, whole against started from the codes
kept where a variant leaves the first program (npuforge/analysis/prefix.py), alternating.

    .venv/bin/python benchmarks/analyze_prefix.py efficientnet_lite0 ../shared/data/imagenet-sample-even \
        --layer /blocks/blocks.8/dw/conv/Conv

Calibrates on the first 100 images, evaluates on the rest; scores the per-tensor program, then
the layer per-channel, in int16, in float, twice each way. Prints seconds and top-1 per variant.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from npuforge.analysis.cli import _load_images
    from npuforge.analysis.search import with_changes
    from npuforge.analysis.session import Calibration, Evaluator
    from npuforge.passes import optimize
    from npuforge.quant.config import QuantConfig
    from npuforge.workflow import resolve_model, transform_of
    from npuforge.zoo.data import ImageDataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("data", help="labelled images; the first --num-calib calibrate")
    ap.add_argument("--layer", required=True, help="the node the variants change")
    ap.add_argument("--num-calib", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    graph = resolve_model(args.model, None, log=lambda m: None)
    transform = transform_of(graph.metadata["preprocess"])
    calib = ImageDataset(args.data, None, labelled=False)
    calib.samples = calib.samples[:args.num_calib]
    xc, _ = _load_images(calib, transform, 25)
    x, y = _load_images(ImageDataset(args.data, None, skip=args.num_calib), transform, 25)
    cal = Calibration(optimize(graph)[0], [xc[i:i + 25] for i in range(0, len(xc), 25)])
    base = QuantConfig(granularity="per-tensor")
    variants = [{}, {args.layer: "per-channel"}, {args.layer: "int16"}, {args.layer: "float"}]
    graphs = [cal.build(with_changes(base, v)) for v in variants]
    labels = ["all int8"] + [f"{fix}" for v in variants[1:] for fix in v.values()]
    print(f"{args.model}, {len(x)} images, variants of {args.layer}; seconds per evaluation")
    for _ in range(args.repeats):
        for kept in (False, True):
            ev = Evaluator(x, y, "int", 25)
            if not kept:
                ev._prefixes.budget = 0
            row = []
            for label, g in zip(labels, graphs):
                start = time.perf_counter()
                top1 = ev.top1(g)
                row.append(f"{label} {time.perf_counter() - start:.2f} s ({top1:.2f} %)")
            print(("from kept codes: " if kept else "whole:           ") + ", ".join(row))


if __name__ == "__main__":
    main()
