"""``npuforge zoo train``: train or fine-tune a zoo model on a folder of images (a classifier), or on
images with COCO box annotations (a detector: :mod:`npuforge.detection.train`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..argtypes import fraction_below_one, non_negative, positive_float, positive_int
from ..errors import NpuforgeError
from ..outputs import Planned


def add_length_options(p, default_epochs: int) -> None:
    """--epochs N or --steps N (the training loop's ``epochs`` / ``steps``), one or the other."""
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=positive_int, default=default_epochs, metavar="N",
                        help=f"default {default_epochs}")
    length.add_argument("--steps", type=positive_int, default=0, metavar="N",
                        help="train N optimizer steps instead: the epochs they need, the last one cut short "
                             "(the schedule spans the N steps)")


def add_train_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train or fine-tune a zoo model on a folder of images, or a detector on COCO boxes (one "
                      "process, or many via torchrun)",
        description="Train a zoo model on DIR (one subfolder per class, or ImageNet-style <wnid>_name files): "
                    "random resized crops and flips, SGD or AdamW with warm-up and a cosine schedule, label "
                    "smoothing, optional EMA, mixup / cutmix, AMP; validation after each epoch counted exactly "
                    "over processes; last.pt, best.pt and the top-k epochs in --output, with metrics.jsonl, "
                    "summary.csv and curves.png. --resume continues from last.pt, mid-epoch, to the same "
                    "weights bit for bit as an uninterrupted run. Many processes: torchrun --nproc_per_node N "
                    "-m npuforge zoo train ... (gloo on CPU, nccl on GPU); --batch-size is per process. A detector "
                    "(retinanet_mobilenet_v2_fpn, fcos_mobilenet_v2_fpn) trains on the images of DIR with the boxes "
                    "of --annotations COCO.json: each image resized to the model's S x S (no letterbox; boxes "
                    "scaled with it) and flipped at random, its loss (focal + box terms, each logged), validation "
                    "by COCO mAP (pycocotools) of its detections (score >= 0.05, NMS 0.5, 100 per image), which "
                    "ranks best.pt and the top-k; crops, mixup, cutmix, label smoothing and --probe-init are "
                    "for classifiers.")
    p.add_argument("name", help="a zoo model name (`npuforge zoo list`)")
    p.add_argument("--data", required=True, metavar="DIR", help="training images (a detector's: the folder the "
                   "file names of --annotations are relative to, or the folder holding it as images/)")
    p.add_argument("--annotations", metavar="COCO.json",
                   help="detectors only, and required for them: the COCO boxes of the --data images; class names "
                        "are its categories in id order")
    p.add_argument("--val", metavar="DIR", help="validation images (default: a seeded --val-split of --data)")
    p.add_argument("--val-annotations", metavar="COCO.json",
                   help="detectors only: the COCO boxes of the validation images (--val DIR, default: the folder "
                        "of this file or its images/); its categories must be those of --annotations")
    p.add_argument("--val-split", type=non_negative, default=0.2, metavar="F",
                   help="fraction of each class (a detector: of the images) held out for validation when --val is "
                        "not given (classes of one image make up what they leave short; default 0.2; 0: no "
                        "validation, train on everything, best.pt is the last epoch)")
    p.add_argument("--output", "-o", required=True, metavar="RUN_DIR", help="where checkpoints and records go")
    p.add_argument("--pretrained", action=argparse.BooleanOptionalAction, default=None,
                   help="start from the published weights (default: yes when the model has them); a classifier "
                        "of another class count is re-initialised, and the log says so")
    p.add_argument("--num-classes", type=positive_int, metavar="N", help="must equal the folder's class count "
                   "(a detector's: the annotation file's category count; the default)")
    add_length_options(p, default_epochs=10)
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="images per process and step "
                   "(default 32)")
    lr = p.add_mutually_exclusive_group()
    lr.add_argument("--lr", type=positive_float, metavar="LR", help="learning rate")
    lr.add_argument("--lr-base", type=positive_float, default=0.1, metavar="LR",
                    help="learning rate per 256 images: lr = lr-base x global batch / 256 (default 0.1; logged)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="default sgd (Nesterov, momentum 0.9)")
    p.add_argument("--weight-decay", type=non_negative, default=5e-5, metavar="WD",
                   help="on weights only, not on biases and normalization parameters (default 5e-5)")
    p.add_argument("--warmup-epochs", type=non_negative, default=0.0, metavar="E", help="linear warm-up (default 0)")
    p.add_argument("--label-smoothing", type=fraction_below_one, default=None, metavar="S",
                   help="default 0.1 (classifiers only)")
    p.add_argument("--crop-scale", type=positive_float, default=None, metavar="F",
                   help="smallest area fraction of the random resized crop (default 0.08; 0.3-0.5 suits fine-tuning "
                        "on a few hundred images; classifiers only)")
    p.add_argument("--ema", type=non_negative, default=0.0, metavar="DECAY",
                   help="keep an exponential moving average of the weights with this per-step decay (e.g. 0.999); "
                        "validation and checkpoints' EMA use it (default: off)")
    p.add_argument("--amp", action="store_true", help="mixed precision: bfloat16 on CPU, float16 on CUDA")
    p.add_argument("--clip-grad", type=non_negative, default=0.0, metavar="NORM", help="clip the gradient norm "
                   "(default: off)")
    p.add_argument("--mixup", type=non_negative, default=0.0, metavar="ALPHA", help="mixup Beta(alpha, alpha)")
    p.add_argument("--cutmix", type=non_negative, default=0.0, metavar="ALPHA", help="cutmix Beta(alpha, alpha)")
    p.add_argument("--probe-init", action="store_true",
                   help="start the classifier from a linear probe (logistic regression on the frozen pretrained "
                        "features of the training images), then fine-tune everything: a random head's first "
                        "steps no longer tear up the pretrained features")
    p.add_argument("--freeze-bn", action="store_true",
                   help="BatchNorm keeps its pretrained running statistics (eval mode) while its scale and shift "
                        "train: steadier fine-tuning on a few hundred images or small batches")
    p.add_argument("--trainable-layers", type=positive_int, default=0, metavar="K",
                   help="train only the last K convolution / linear layers (with the normalizations after them); "
                        "the earlier ones keep their pretrained weights and statistics: fewer free parameters for "
                        "fine-tuning on a few hundred images, and a cheaper backward pass (default: train all)")
    p.add_argument("--sync-bn", action="store_true", help="synchronized BatchNorm across processes")
    p.add_argument("--seed", type=int, default=0, help="every random choice follows from it (default 0)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="image decoding processes (spawned; 0: in the "
                   "main process; default 2)")
    p.add_argument("--max-bad-steps", type=positive_int, default=10, metavar="N",
                   help="stop after N steps in a row with a non-finite loss or gradient (each is skipped; default 10)")
    p.add_argument("--keep", type=positive_int, default=3, metavar="K", help="keep the K best epochs' checkpoints")
    p.add_argument("--save-every", type=int, default=0, metavar="STEPS",
                   help="also checkpoint every STEPS steps within an epoch (default: at epoch ends)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/last.pt")
    p.add_argument("--image-size", type=positive_int, metavar="PX",
                   help="training and validation crop size (default: the model's; resize = size / crop_pct); a "
                        "detector's input side S, a multiple of 32 (default 160)")
    p.add_argument("--json", action="store_true", help="print the final record as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train, outputs=lambda a: [Planned(Path(a.output), "dir", "--output")])


def cmd_train(args) -> int:
    from ..detection.train import DetectionTrainer, config_from_args, detectors, is_detector
    from ..zoo import get_config
    from .loop import TrainConfig, train, train_with

    config = get_config(args.name)
    pretrained = config.has_weights if args.pretrained is None else args.pretrained
    if pretrained and not config.has_weights:
        raise NpuforgeError(f"{args.name} has no pretrained weights; train with --no-pretrained")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if is_detector(args.name):
        result = train_with(DetectionTrainer(config_from_args(args, pretrained), log, progress=not args.quiet))
        if int(os.environ.get("RANK", "0")) != 0:
            return 0
        if args.json:
            print(json.dumps(result, indent=2, default=str))
        elif not result.get("stopped") and result["best_map"] is None:
            print(f"trained {result['best_epoch']} epochs without validation; checkpoints in {result['output']} "
                  f"(best.pt = last.pt)")
        elif not result.get("stopped"):
            best = result["history"][result["best_epoch"] - 1]
            print(f"best validation mAP {best['val_map']:.4f} (mAP@0.5 {best['val_map50']:.4f}, epoch "
                  f"{result['best_epoch']}); checkpoints in {result['output']} (best.pt, last.pt)")
        return 0
    for flag, value in (("--annotations", args.annotations), ("--val-annotations", args.val_annotations)):
        if value:
            raise NpuforgeError(f"{flag}: {args.name} is a classifier (it trains on class folders); COCO "
                                f"annotations are for the detectors ({', '.join(detectors())})")
    args.label_smoothing = 0.1 if args.label_smoothing is None else args.label_smoothing
    args.crop_scale = 0.08 if args.crop_scale is None else args.crop_scale
    cfg = TrainConfig(model=args.name, data=args.data, output=args.output, val=args.val, val_split=args.val_split,
                      pretrained=pretrained, num_classes=args.num_classes, epochs=args.epochs, steps=args.steps,
                      batch_size=args.batch_size, lr=args.lr, lr_base=args.lr_base, optimizer=args.optimizer,
                      weight_decay=args.weight_decay, warmup_epochs=args.warmup_epochs,
                      label_smoothing=args.label_smoothing, crop_scale=args.crop_scale, ema=args.ema, amp=args.amp,
                      clip_grad=args.clip_grad, mixup=args.mixup, cutmix=args.cutmix, seed=args.seed,
                      workers=args.workers, max_bad_steps=args.max_bad_steps, keep=args.keep, sync_bn=args.sync_bn,
                      probe_init=args.probe_init, freeze_bn=args.freeze_bn, trainable_layers=args.trainable_layers,
                      save_every=args.save_every,
                      resume=args.resume, image_size=args.image_size)
    result = train(cfg, log=log, progress=not args.quiet)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun the first process reports
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in result.items()}, indent=2, default=str))
    elif not result.get("stopped") and result["best_top1"] is None:
        print(f"trained {result['best_epoch']} epochs without validation; checkpoints in {result['output']} "
              f"(best.pt = last.pt)")
    elif not result.get("stopped"):
        print(f"best validation top-1 {result['best_top1']:.2f} % (epoch {result['best_epoch']}); "
              f"checkpoints in {result['output']} (best.pt, last.pt)")
    return 0
