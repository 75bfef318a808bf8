"""``npuforge qat``: quantization-aware training of any float model on a folder of images."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..quant.config import ACTIVATION_DTYPES, GRANULARITIES
from ..argtypes import non_negative, positive_float, positive_int
from ..outputs import Planned, ir_set
from ..train.cli import add_length_options


def add_qat_parser(sub) -> None:
    p = sub.add_parser(
        "qat", help="quantization-aware training: train the integer program itself, write a quantized IR",
        description="Quantize MODEL as `npuforge quantize` does (calibrated on the first --num-calib training "
                    "images), then train its weights with the integer program as the forward: every step decides "
                    "the integers from the current weights as the quantizer does, runs the integer simulator's "
                    "arithmetic, and passes gradients straight through the rounding. By default the target is "
                    "the float model's output (distillation), so any folder of images will do; --labels trains "
                    "on the folder's labels instead. Progress, checkpoints (--run-dir), --resume and torchrun "
                    "work as in `npuforge zoo train`. OUT is an ordinary quantized IR: eval, run --mode int, "
                    "analyze and export take it.")
    p.add_argument("model", help="a zoo name, a training checkpoint (RUN_DIR/best.pt), an ONNX file or a saved "
                                 "float IR")
    p.add_argument("--data", required=True, metavar="DIR", help="training images (labels optional)")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="the quantized IR to write (e.g. q.nfir)")
    p.add_argument("--run-dir", metavar="DIR", help="checkpoints and records (default: OUT with suffix .qat)")
    p.add_argument("--granularity", default="per-channel", choices=GRANULARITIES,
                   help="weight scales per output channel (default) or per tensor")
    p.add_argument("--activation-dtype", default="uint8", choices=ACTIVATION_DTYPES,
                   help="activation type (default uint8, asymmetric)")
    p.add_argument("--symmetric", action="store_true", help="symmetric activations")
    p.add_argument("--tflite-multipliers", action="store_true", help="TFLite's integer arithmetic (as quantize)")
    p.add_argument("--equalize", action="store_true",
                   help="start from cross-layer equalized weights (as quantize --equalize; helps per-tensor most)")
    p.add_argument("--bias-correction", action="store_true",
                   help="start from bias-corrected biases (as quantize --bias-correction)")
    p.add_argument("--adaround", action="store_true",
                   help="start from AdaRound's rounding (as quantize --adaround, minutes; cached in "
                        "RUN_DIR/adaround, so --resume does not learn it again)")
    p.add_argument("--best-start", action="store_true",
                   help="quantize both ways (plain, and with --equalize --bias-correction; each with --adaround "
                        "if given) and start from the program that scores better on the validation images (by "
                        "the ranking below)")
    p.add_argument("--num-calib", type=positive_int, default=100, metavar="N",
                   help="calibration images: the first N training images (default 100)")
    p.add_argument("--labels", action="store_true",
                   help="train on the folder's labels (class subfolders or <wnid>_name files) instead of "
                        "distilling the float model")
    p.add_argument("--learn-scales", action="store_true",
                   help="learn the activation scales too (LSQ), starting from the calibration's")
    p.add_argument("--temperature", type=positive_float, default=1.0, metavar="T",
                   help="distillation temperature (default 1)")
    p.add_argument("--val", metavar="DIR", help="validation images (default: a seeded --val-split of --data)")
    p.add_argument("--val-split", type=non_negative, default=0.2, metavar="F",
                   help="fraction held out for validation (default 0.2; 0: none, the last epoch is written). "
                        "Epochs, and the PTQ program QAT starts from, rank by the integer program's KL divergence "
                        "from the float model on them (by top-1 with --labels); the best is written")
    add_length_options(p, default_epochs=3)
    p.add_argument("--batch-size", type=positive_int, default=16, metavar="N", help="images per step (default 16)")
    p.add_argument("--lr", type=positive_float, default=1e-4, metavar="LR", help="learning rate (default 1e-4)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="default sgd (Nesterov, momentum 0.9)")
    p.add_argument("--weight-decay", type=non_negative, default=0.0, metavar="WD", help="default 0")
    p.add_argument("--crop-scale", type=positive_float, default=0.5, metavar="F",
                   help="smallest area fraction of the random resized crop (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="every random choice follows from it (default 0)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="image decoding processes (default 2)")
    p.add_argument("--save-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS steps (default: at epoch ends)")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's last.pt")
    p.add_argument("--json", action="store_true", help="print the final record as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_qat, outputs=lambda a: ir_set(a.output) + [
        Planned(Path(a.run_dir or Path(a.output).with_suffix(".qat")), "dir", "--run-dir")])


def cmd_qat(args) -> int:
    from .trainer import QATConfig, prepare_graph, qat

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    quant = {"granularity": args.granularity, "activation_dtype": args.activation_dtype,
             "symmetric": args.symmetric, "tflite_multipliers": args.tflite_multipliers, "equalize": args.equalize,
             "bias_correction": args.bias_correction, "adaround": args.adaround}
    run_dir = args.run_dir or str(Path(args.output).with_suffix(".qat"))
    cfg = QATConfig(model=args.model, data=args.data, output=run_dir, result=args.output, quant=quant,
                    labels=args.labels, learn_scales=args.learn_scales, best_start=args.best_start,
                    temperature=args.temperature, num_calib=args.num_calib, val=args.val, val_split=args.val_split,
                    epochs=args.epochs, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                    optimizer=args.optimizer, weight_decay=args.weight_decay,
                    crop_scale=args.crop_scale, label_smoothing=0.0, seed=args.seed, workers=args.workers,
                    save_every=args.save_every, resume=args.resume)
    from ..cli import parse_input_shapes

    graph = prepare_graph(args.model, log, input_shapes=parse_input_shapes(args.input_shape))
    result = qat(cfg, graph, log=log, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if args.json:
        print(json.dumps({**result, "result": args.output}, indent=2, default=str))
    elif not result.get("stopped"):
        best = result.get("best_kl", result.get("best_top1"))
        metric = "" if best is None else (f"validation KL to the float model {best:.4g} " if "best_kl" in result
                                          else f"validation top-1 {best:.2f} % ")
        n = len(result["history"])
        which = (f"epoch {result['best_epoch']} of {n}" if result["best_epoch"]
                 else f"the PTQ start; {n} epoch{'s' if n != 1 else ''} trained")
        print(f"{metric}({which}); wrote {args.output}, checkpoints in {run_dir}")
    return 0
