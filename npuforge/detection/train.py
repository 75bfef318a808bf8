"""``npuforge zoo train DETECTOR --data DIR --annotations COCO.json``: the training loop
(:class:`~npuforge.train.loop.Trainer`, with its schedule, AMP, clip-grad, EMA, NaN guard,
checkpoints, bit-exact resume and torchrun support) on a zoo detector (RetinaNet, FCOS).

Data. Each image is resized to the model's S x S (a plain resize, no letterbox: the aspect
ratio is not kept; boxes are scaled by S / width and S / height of the annotation's image
record; the synthetic set is S x S already), normalized with the model config's mean / std,
and flipped horizontally (its boxes with it) with probability 0.5, seeded per (seed, epoch,
index) as the classification transform is. Unreadable images are skipped and counted.
Labels: the COCO categories in id order are classes 0..K-1.

Validation: COCO mAP (pycocotools, :func:`~npuforge.detection.metric.coco_map`) of
``model.detect`` (score threshold 0.05, class-wise NMS at IoU 0.5, 100 per image) on the
validation images, boxes mapped back to the images' pixels; ``val_map`` ranks the epochs.
Under torchrun each process detects its shard of the images, the detections are gathered
(``all_gather_object``) and the first process scores every image exactly once, so 1 and 2
processes give the same mAP.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import NpuforgeError
from ..train.data import open_rgb, rng_for
from ..train.loop import TrainConfig, Trainer
from ..zoo.transforms import _RESAMPLE, normalize

# options of the classification command a detector does not take
CLASSIFIER_ONLY = ("mixup", "cutmix", "label_smoothing", "probe_init")


def is_detector(name: str) -> bool:
    """Whether a zoo model name is one of the dense detectors (RetinaNet, FCOS): their builders
    live in :mod:`npuforge.detection`. An unknown name raises the registry's error."""
    from ..zoo.registry import _entry

    return _entry(name).builder.__module__.startswith("npuforge.detection.")


def detectors() -> list[str]:
    from ..zoo.registry import list_models

    return [n for n in list_models() if is_detector(n)]


@dataclass
class DetectionConfig(TrainConfig):
    annotations: str = ""  # COCO json of the --data images
    val_annotations: str | None = None  # COCO json of the --val images
    label_smoothing: float = 0.0  # classification only: refused when set
    score_threshold: float = 0.05  # of the validation detections
    nms_threshold: float = 0.5
    max_detections: int = 100
    hflip: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not self.annotations:
            raise NpuforgeError(f"{self.model} is a detector: give --annotations COCO.json (the boxes of the images "
                                f"in --data)")
        for name in CLASSIFIER_ONLY:
            if getattr(self, name):
                raise NpuforgeError(f"--{name.replace('_', '-')}: a classification option; {self.model} is a "
                                    f"detector (focal loss on boxes), leave it out")
        if self.val and not self.val_annotations:
            raise NpuforgeError(f"--val {self.val}: a detector's validation images need --val-annotations COCO.json")
        if not 0 <= self.hflip <= 1:
            raise NpuforgeError(f"hflip={self.hflip}: a probability in [0, 1]")


def _image_dir(data: str | None, annotations: str):
    """The folder the file names of ``annotations`` are relative to: ``data``, or its
    ``images/`` subfolder when the names are found there (a synthetic set's root)."""
    if data is None:
        return None
    root = Path(data)
    if not root.is_dir():
        raise NpuforgeError(f"{root}: no such folder (the images of {annotations})")
    try:
        import json

        first = json.loads(Path(annotations).read_text())["images"][0]["file_name"]
    except Exception:  # load_coco names what is wrong with the file
        return root
    return root / "images" if not (root / first).exists() and (root / "images" / first).exists() else root


def _samples(ds, label_of: dict) -> list:
    """(path, boxes float32 [M, 4] xyxy image pixels, labels int64 [M] 0..K-1, image id, width, height)."""
    return [(str(ds.image_path(im)), ds.boxes[im["id"]], np.asarray([label_of[int(c)] for c in ds.labels[im["id"]]],
                                                                      np.int64), im["id"], im["width"], im["height"])
            for im in ds.images]


def split_images(samples: list, fraction: float, seed: int) -> tuple[list, list]:
    """A seeded split of the images (about ``fraction`` for validation, at least one of two or more)."""
    if not 0 < fraction < 1:
        raise NpuforgeError(f"--val-split {fraction}: give a fraction between 0 and 1 (e.g. 0.2)")
    order = rng_for(seed, 2).permutation(len(samples))
    n_val = max(1, int(round(len(samples) * fraction))) if len(samples) > 1 else 0
    val, train = sorted(order[:n_val]), sorted(order[n_val:])
    return [samples[j] for j in train], [samples[j] for j in val]


class DetectionSampleSet(torch.utils.data.Dataset):
    """``dataset[(epoch, i)]`` -> (CHW float32 or None for an unreadable image, target, i);
    target: boxes float32 [M, 4] xyxy in input pixels, labels int64 [M], image_id, and the
    scale (sx, sy) from input pixels back to the image's. Picklable (paths and arrays only)."""

    def __init__(self, samples: list, size: tuple[int, int], mean, std, interpolation: str, seed: int,
                 train: bool, hflip: float = 0.5):
        self.samples, self.size, self.mean, self.std = list(samples), tuple(size), tuple(mean), tuple(std)
        self.interpolation, self.seed, self.train, self.hflip = interpolation, seed, train, hflip

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        epoch, i = key
        path, boxes, labels, image_id, width, height = self.samples[i]
        h, w = self.size
        sx, sy = w / width, h / height
        target = {"image_id": image_id, "scale": (width / w, height / h)}  # input pixels -> the image's
        img = open_rgb(path)
        if img is None:
            return None, target, i
        arr = np.asarray(img.resize((w, h), _RESAMPLE[self.interpolation]))
        boxes = np.asarray(boxes, np.float32).reshape(-1, 4) * np.asarray([sx, sy, sx, sy], np.float32)
        boxes = np.clip(boxes, 0, np.asarray([w, h, w, h], np.float32))
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])  # a box of the edge slack only
        boxes, labels = boxes[keep], np.asarray(labels, np.int64)[keep]
        if self.train and rng_for(self.seed, 1, epoch, i).uniform() < self.hflip:
            arr = arr[:, ::-1]
            boxes = np.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], 1).astype(np.float32)
        target.update(boxes=boxes, labels=labels)
        return normalize(np.ascontiguousarray(arr), self.mean, self.std), target, i


def detection_collate(items):
    """(images [N, 3, S, S], [target dicts with tensors], unreadable images dropped)."""
    good = [it for it in items if it[0] is not None]
    xs = torch.from_numpy(np.stack([it[0] for it in good])) if good else torch.zeros(0)
    targets = [{**t, "boxes": torch.from_numpy(t["boxes"]), "labels": torch.from_numpy(t["labels"])}
               for _, t, _ in good]
    return xs, targets, len(items) - len(good)


class DetectionTrainer(Trainer):
    metric = "val_map"
    curves = (("val_map", "mAP@[.5:.95]"), ("val_map50", "mAP@0.5"))
    curves_label = "validation COCO mAP"
    collate_fn = staticmethod(detection_collate)

    def datasets(self):
        from .coco import load_coco

        cfg = self.cfg
        ds = load_coco(cfg.annotations, _image_dir(cfg.data, cfg.annotations))
        if not ds.categories:
            raise NpuforgeError(f"{cfg.annotations}: no categories")
        if not ds.images:
            raise NpuforgeError(f"{cfg.annotations}: no images")
        categories = sorted(ds.categories, key=lambda c: c["id"])
        self.category_ids = [int(c["id"]) for c in categories]
        self.classes = [str(c["name"]) for c in categories]
        self.class_ids = list(self.classes)
        n = cfg.num_classes or len(self.classes)
        if n != len(self.classes):
            raise NpuforgeError(f"--num-classes {n}: {cfg.annotations} has {len(self.classes)} categories "
                                f"({', '.join(self.classes[:8])}); leave --num-classes out")
        label_of = {c: k for k, c in enumerate(self.category_ids)}
        samples = _samples(ds, label_of)
        if cfg.val_annotations:
            vs = load_coco(cfg.val_annotations, _image_dir(cfg.val, cfg.val_annotations))
            theirs = {int(c["id"]): str(c["name"]) for c in vs.categories}
            if theirs != dict(zip(self.category_ids, self.classes)):
                raise NpuforgeError(f"--val-annotations {cfg.val_annotations}: its categories "
                                    f"{sorted(theirs.items())[:6]} differ from those of --annotations {cfg.annotations}")
            train, val, self.val_coco = samples, _samples(vs, label_of), vs
        elif cfg.val_split == 0:
            train, val, self.val_coco = samples, [], None
            self.log(f"no validation (--val-split 0): training on all {len(train)} images; best.pt is the last epoch")
        else:
            train, val = split_images(samples, cfg.val_split, cfg.seed)
            self.val_coco = ds  # scored on the held-out image ids only
            self.log(f"validation: a seeded {cfg.val_split:.0%} of the images ({len(val)}), training on {len(train)}")
        boxes = sum(len(s[1]) for s in train)
        self.log(f"{cfg.annotations}: {len(self.classes)} categories ({', '.join(self.classes[:8])}), "
                 f"{boxes} boxes in {len(train)} training images")
        return train, val

    def preprocessing(self) -> dict:
        from ..workflow import preprocess_of
        from ..zoo import get_config
        from .fpn import check_image_size

        cfg = self.cfg
        zoo_config = get_config(cfg.model)
        size = cfg.image_size or cfg.model_kwargs.get("image_size") or zoo_config.input_size[1]
        try:
            h, w = check_image_size(size)
        except NpuforgeError as e:
            raise NpuforgeError(f"--image-size {size}: {str(e).split(': ', 1)[-1]}") from None
        cfg.model_kwargs = {**cfg.model_kwargs, "image_size": size}  # the priors are built for it
        self.size = (h, w)
        pp = preprocess_of(zoo_config)
        pp.update(crop_size=[h, w], resize_size=h, fit="resize")  # a plain resize to S x S, no crop
        return pp

    def sample_sets(self, train: list, val: list):
        cfg, pp = self.cfg, self.preprocess
        args = (self.size, pp["mean"], pp["std"], pp["interpolation"], cfg.seed)
        return (DetectionSampleSet(train, *args, train=True, hflip=cfg.hflip),
                DetectionSampleSet(val, *args, train=False))

    def make_model(self, n: int, train: list):
        from ..zoo import create_model

        cfg = self.cfg
        with warnings.catch_warnings():  # the registry logs a re-initialised head already
            warnings.simplefilter("ignore", UserWarning)
            model = create_model(cfg.model, pretrained=cfg.pretrained, num_classes=n, **cfg.model_kwargs)
        if cfg.amp and self.dist.device.type == "cpu" and min(self.size) <= 64:
            self.log(f"note: --amp on CPU at {self.size[0]}x{self.size[1]}: P7's stride-2 conv then reads a 1x1 "
                     f"map, whose bfloat16 backward in PyTorch's CPU kernels now and then gives non-finite "
                     f"gradients (those steps are skipped); 96 or more avoids it")
        self.log(f"{cfg.model} at {self.size[0]}x{self.size[1]}: "
                 + ("MobileNetV2 backbone from ImageNet" if cfg.pretrained else "random weights")
                 + f"; FPN and head initialised for {n} classes")
        return model

    def prepare_batch(self, x, y, epoch: int, step: int):
        device = self.dist.device
        targets = [{**t, "boxes": t["boxes"].to(device), "labels": t["labels"].to(device)} for t in y]
        return x.to(device), targets, None

    def loss(self, outputs, x, y, target):
        parts = self.model.loss(tuple(o.float() for o in outputs), y, self.size)
        return {"loss": parts["loss"], **{k: v.detach() for k, v in parts.items() if k != "loss"}}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """COCO mAP over every validation image once, whatever the number of processes."""
        import torch.distributed as dist

        from ..train.data import eval_batches
        from .metric import coco_map

        d, cfg = self.dist, self.cfg
        if not len(self.val_set):
            return {}
        model = (self.ema.model if self.ema else self.model).eval()
        found, loss_sum, images = {}, 0.0, 0
        batches = list(eval_batches(len(self.val_set), cfg.batch_size, d.world, d.rank))
        for x, targets, _ in self._loader(batches, self.val_set):
            if not targets:
                continue
            outputs = tuple(o.float() for o in model(x.to(d.device)))
            detections = model.detect(outputs, cfg.score_threshold, cfg.nms_threshold, cfg.max_detections,
                                      image_size=self.size)
            for k, (t, (boxes, scores, labels)) in enumerate(zip(targets, detections)):
                sx, sy = t["scale"]
                found[t["image_id"]] = (boxes.cpu().double().numpy() * np.asarray([sx, sy, sx, sy]),
                                        scores.cpu().numpy(), np.asarray(self.category_ids)[labels.cpu().numpy()])
                one = {"boxes": t["boxes"].to(d.device), "labels": t["labels"].to(d.device)}
                loss_sum += float(model.loss(tuple(o[k:k + 1] for o in outputs), [one], self.size)["loss"])
            images += len(targets)
        if d.active:
            shards = [None] * d.world
            dist.all_gather_object(shards, found)
        else:
            shards = [found]
        stats = [None]
        if d.main:
            merged = {}
            for shard in shards:
                merged.update(shard)
            if len(merged) != sum(len(s) for s in shards):
                raise RuntimeError("an image was detected by two processes")
            m = coco_map(self.val_coco, merged)
            stats = [{"val_map": m["map"], "val_map50": m["map50"], "val_map75": m["map75"],
                      "val_detections": sum(len(v[1]) for v in merged.values())}]
        if d.active:
            dist.broadcast_object_list(stats, src=0)  # every process ranks the epochs
        n, ls = d.sum([images, loss_sum])
        return {**stats[0], "val_images": int(n), "val_loss": ls / max(n, 1)}

    def describe(self, record: dict) -> str:
        if "val_map" not in record:
            return ""
        return (f", val mAP {record['val_map']:.4f}, mAP@0.5 {record['val_map50']:.4f} "
                f"({record['val_images']} images, {record['val_detections']} detections)")

    def payload(self) -> dict:
        cfg = self.cfg
        return {"model_name": cfg.model, "model_kwargs": cfg.model_kwargs, "task": "detection",
                "category_ids": self.category_ids, "image_size": list(self.size),
                "detect": {"score_threshold": cfg.score_threshold, "iou_threshold": cfg.nms_threshold,
                           "max_detections": cfg.max_detections}}


def config_from_args(args, pretrained: bool) -> DetectionConfig:
    """``npuforge zoo train DETECTOR ...``'s configuration; classification options refused."""
    for flag, value in (("--crop-scale", args.crop_scale), ("--label-smoothing", args.label_smoothing),
                        ("--mixup", args.mixup or None), ("--cutmix", args.cutmix or None),
                        ("--probe-init", args.probe_init or None),
                        ("--trainable-layers", args.trainable_layers or None)):
        if value is not None:
            raise NpuforgeError(f"{flag}: a classification option; {args.name} is a detector (focal loss on boxes, "
                                f"random flips), leave it out")
    return DetectionConfig(
        model=args.name, data=args.data, output=args.output, val=args.val, val_split=args.val_split,
        pretrained=pretrained, num_classes=args.num_classes, epochs=args.epochs, steps=args.steps,
        batch_size=args.batch_size, lr=args.lr, lr_base=args.lr_base, optimizer=args.optimizer, weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs, ema=args.ema, amp=args.amp, clip_grad=args.clip_grad, seed=args.seed,
        workers=args.workers, max_bad_steps=args.max_bad_steps, keep=args.keep, sync_bn=args.sync_bn,
        freeze_bn=args.freeze_bn, save_every=args.save_every, resume=args.resume, image_size=args.image_size,
        annotations=args.annotations or "", val_annotations=args.val_annotations)


__all__ = ["DetectionConfig", "DetectionSampleSet", "DetectionTrainer", "config_from_args", "detection_collate",
           "detectors", "is_detector", "split_images"]
