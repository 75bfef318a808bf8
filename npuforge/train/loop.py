"""The one training loop (``npuforge zoo train``; QAT reuses it): a zoo model on a folder
of images, on one process or many, with exact evaluation and exact resume.

Determinism. Data order, crops, flips and mixup are functions of (seed, epoch, index)
(see :mod:`npuforge.train.data`); dropout and stochastic depth draw from torch's RNG,
whose state a checkpoint keeps; the loader's workers get their seeds from a generator of
their own, not from torch's global one. So a run stopped after step k and resumed from
its checkpoint takes the same steps as one that never stopped, and ends with the same
weights bit for bit (CPU, the same thread count).
"""

from __future__ import annotations

import copy
import gc
import json
import math
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import NpuforgeError
from . import checkpoint as ckpt
from .data import BatchPlan, SampleSet, TrainTransform, collate, eval_batches, rng_for, split_samples
from ..distributed import Distributed
from .freezing import freeze_batchnorm, train_last_layers

OPTIMIZERS = ("sgd", "adamw")


@dataclass
class TrainConfig:
    model: str
    data: str
    output: str
    val: str | None = None
    val_split: float = 0.2
    pretrained: bool = True
    num_classes: int | None = None  # default: the folder's
    epochs: int = 10
    steps: int = 0  # optimizer steps in all; 0: --epochs whole epochs (else the epochs they need, the last cut short)
    batch_size: int = 32  # per process
    lr: float | None = None  # default: lr_base x global batch / 256
    lr_base: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-5
    warmup_epochs: float = 0.0
    label_smoothing: float = 0.1
    crop_scale: float = 0.08  # smallest area fraction of the random resized crop
    ema: float = 0.0  # decay per step; 0: no EMA
    amp: bool = False
    clip_grad: float = 0.0
    mixup: float = 0.0  # Beta(alpha, alpha); 0: off
    cutmix: float = 0.0
    seed: int = 0
    workers: int = 2
    max_bad_steps: int = 10
    keep: int = 3  # top-k epoch checkpoints
    probe_init: bool = False  # start from a linear probe of the pretrained features
    freeze_bn: bool = False  # BatchNorm keeps its (pretrained) statistics; its scale and shift still learn
    trainable_layers: int = 0  # only the last K convolution / linear layers learn; 0: all of them
    sync_bn: bool = False
    save_every: int = 0  # steps between mid-epoch checkpoints; 0: at epoch ends only
    resume: bool = False
    image_size: int | None = None  # crop size of the transforms (default: the model's); lite models get it too
    model_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise NpuforgeError(f"--optimizer {self.optimizer}: one of {', '.join(OPTIMIZERS)}")
        for name in ("epochs", "batch_size", "max_bad_steps", "keep"):
            if getattr(self, name) < 1:
                raise NpuforgeError(f"--{name.replace('_', '-')} {getattr(self, name)}: give a positive number")
        for name in ("weight_decay", "warmup_epochs", "ema", "clip_grad", "mixup", "cutmix", "label_smoothing",
                     "workers", "save_every", "trainable_layers", "steps"):
            if getattr(self, name) < 0:
                raise NpuforgeError(f"--{name.replace('_', '-')} {getattr(self, name)}: give a value >= 0")
        if self.ema >= 1:
            raise NpuforgeError(f"--ema {self.ema}: a decay below 1 (e.g. 0.999)")
        if not 0 < self.crop_scale <= 1:
            raise NpuforgeError(f"--crop-scale {self.crop_scale}: an area fraction in (0, 1]")


def _folder_samples(root: str, what: str):
    from ..zoo.data import ImageDataset, _is_image

    ds = ImageDataset(root)
    if ds.layout == "imagefolder":
        empty = [d.name for d in sorted(Path(root).iterdir())
                 if d.is_dir() and not d.name.startswith(".") and not any(_is_image(p) for p in d.iterdir())]
        if empty:
            raise NpuforgeError(f"{root}: class folder(s) {', '.join(empty[:5])} hold no images; add images or "
                                f"remove the folder ({what})")
    return ds


def _datasets(cfg: TrainConfig, log):
    """(train samples, val samples, class names, class ids): names and labels from the
    folder; ids are the wnids of a class table (ImageNet-style data), else the names."""
    ds = _folder_samples(cfg.data, "--data")
    used = sorted({label for _, label in ds.samples})
    if ds.layout == "flat" or ds.class_table is not None:
        classes = [ds.classes[i] for i in used]  # only the classes the folder has
        ids = [ds.class_table.wnids[i] for i in used]
        remap = {old: new for new, old in enumerate(used)}
    else:
        classes, remap = list(ds.classes), {i: i for i in used}
        ids = list(classes)
    samples = [(str(p), remap[label]) for p, label in ds.samples]
    if cfg.val:
        vd = _folder_samples(cfg.val, "--val")
        names = [vd.classes[label] for _, label in vd.samples]
        unknown = sorted(set(names) - set(classes))
        if unknown:
            raise NpuforgeError(f"--val {cfg.val}: class(es) {unknown[:5]} are not in --data {cfg.data}")
        index = {n: i for i, n in enumerate(classes)}
        val = [(str(p), index[n]) for (p, _), n in zip(vd.samples, names)]
        train = samples
    elif cfg.val_split == 0:
        train, val = samples, []
        log(f"no validation (--val-split 0): training on all {len(train)} images; best.pt is the last epoch")
    else:
        train, val = split_samples(samples, cfg.val_split, cfg.seed)
        trained = {label for _, label in train}
        unseen = sum(1 for _, label in val if label not in trained)
        log(f"validation: a seeded {cfg.val_split:.0%} of each class ({len(val)} images), training on {len(train)}"
            + (f"; {unseen} of them the only image of their class, which is not trained on" if unseen else ""))
    return train, val, classes, ids


def _param_groups(model, weight_decay: float):
    """Weight decay on weights only: biases and normalization parameters (1-D) go without."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def _schedule(total: int, warmup: int):
    """Linear warm-up to the full rate over ``warmup`` steps, then cosine to zero."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))
    return factor


class _EMA:
    def __init__(self, model, decay: float):
        self.decay, self.model = decay, copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model) -> None:
        for e, p in zip(self.model.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point:
                e.mul_(self.decay).add_(p.detach(), alpha=1 - self.decay)
            else:
                e.copy_(p)


def _mix(x, y, cfg: TrainConfig, epoch: int, step: int, num_classes: int):
    """Mixup / cutmix of one batch (seeded by epoch and step): inputs and soft targets."""
    target = F.one_hot(y, num_classes).to(x.dtype)
    if not (cfg.mixup or cfg.cutmix) or len(y) < 2:
        return x, target
    rng = rng_for(cfg.seed, 3, epoch, step)
    use_cutmix = cfg.cutmix > 0 and (cfg.mixup == 0 or rng.uniform() < 0.5)
    lam = float(rng.beta(cfg.cutmix, cfg.cutmix) if use_cutmix else rng.beta(cfg.mixup, cfg.mixup))
    perm = torch.from_numpy(rng.permutation(len(y)))
    if use_cutmix:
        h, w = x.shape[2:]
        ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
        y0, y1, x0, x1 = max(cy - ch // 2, 0), min(cy + ch // 2, h), max(cx - cw // 2, 0), min(cx + cw // 2, w)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = x[perm, :, y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        x = lam * x + (1 - lam) * x[perm]
    return x, lam * target + (1 - lam) * target[perm]


class Trainer:
    def __init__(self, cfg: TrainConfig, log=print, progress: bool = True):
        self.cfg, self.progress = cfg, progress
        self.dist = Distributed.from_env()
        self.log = log if self.dist.main else (lambda msg: None)
        self.out = Path(cfg.output)
        self.stop_requested = False

    # -- set-up --------------------------------------------------------------------------
    def build(self):
        cfg, d = self.cfg, self.dist
        torch.manual_seed(cfg.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        train, val = self.datasets()
        n = len(self.classes)
        self.plan = BatchPlan(len(train), cfg.batch_size, d.world, cfg.seed)
        if self.plan.steps_per_epoch == 0:
            raise NpuforgeError(f"{cfg.data}: {len(train)} training images are fewer than one batch of "
                                f"{cfg.batch_size} x {d.world} process(es); lower --batch-size")
        if cfg.steps:  # the epochs the steps need; the last one stops at the step count
            cfg.epochs = -(-cfg.steps // self.plan.steps_per_epoch)
        self.preprocess = self.preprocessing()
        self.train_set, self.val_set = self.sample_sets(train, val)
        model = self.make_model(n, train)
        model = model.to(d.device)
        if cfg.freeze_bn:
            self.log(f"BatchNorm statistics frozen ({freeze_batchnorm(model)} layers keep their running "
                     f"statistics; their scale and shift still train)")
        if cfg.sync_bn and d.active:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.frozen_norms = []
        if cfg.trainable_layers:
            self.frozen_norms, trainable, n_weight = train_last_layers(model, cfg.trainable_layers, cfg.model)
            total_params = sum(p.numel() for p in model.parameters())
            self.log(f"training the last {cfg.trainable_layers} of {n_weight} convolution / linear layers: "
                     f"{trainable:,} of {total_params:,} parameters learn")
        self.model = model
        self.net = torch.nn.parallel.DistributedDataParallel(model) if d.active else model
        global_batch = cfg.batch_size * d.world
        self.lr = cfg.lr if cfg.lr is not None else cfg.lr_base * global_batch / 256
        self.log(f"{cfg.model}: {n} classes, {len(train)} training images, {len(val)} validation, "
                 f"{d.world} process(es) x batch {cfg.batch_size} = {global_batch}; lr {self.lr:g}"
                 + ("" if cfg.lr is not None else f" (= lr-base {cfg.lr_base:g} x {global_batch} / 256)"))
        groups = _param_groups(model, cfg.weight_decay)
        self.opt = torch.optim.SGD(groups, lr=self.lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0) \
            if cfg.optimizer == "sgd" else torch.optim.AdamW(groups, lr=self.lr)
        total = cfg.steps or cfg.epochs * self.plan.steps_per_epoch
        warmup = int(round(cfg.warmup_epochs * self.plan.steps_per_epoch))
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, _schedule(total, warmup))
        self.ema = _EMA(model, cfg.ema) if cfg.ema else None
        self.state = {"epoch": 0, "step": 0, "global_step": 0, "history": [], "ranking": [], "bad_steps": 0,
                      "skipped_images": 0}
        if cfg.resume:
            self._resume()

    # -- what a trainer of another kind of model replaces (QAT: npuforge.qat.trainer; detectors:
    # npuforge.detection.train) ------------------------------------------------------------------
    metric = "val_top1"  # the record's key that ranks epochs (best.pt, the top-k)
    higher_is_better = True  # of that metric
    rank_start = False  # the model before the first step is a candidate too, as epoch 0 (QAT: its PTQ start)
    curves = (("val_top1", "top-1"), ("val_top5", "top-5"))  # curves.png's right panel: (key, label)
    curves_label = "validation accuracy (%)"
    collate_fn = staticmethod(collate)  # batches of the sample sets (a module-level function: spawn-safe)

    def datasets(self) -> tuple[list, list]:
        """(training samples, validation samples) as (path, label) lists; sets ``classes`` and
        ``class_ids``."""
        train, val, self.classes, self.class_ids = _datasets(self.cfg, self.log)
        n = self.cfg.num_classes or len(self.classes)
        if n != len(self.classes):
            raise NpuforgeError(f"--num-classes {n}: the folder {self.cfg.data} has {len(self.classes)} classes")
        return train, val

    def preprocessing(self) -> dict:
        from ..workflow import preprocess_of
        from ..zoo import get_config

        cfg = self.cfg
        zoo_config = get_config(cfg.model)
        pp = preprocess_of(zoo_config)
        if cfg.image_size:
            size = cfg.image_size
            pp.update(crop_size=[size, size], resize_size=int(round(size / zoo_config.crop_pct)))
            if cfg.model.startswith("efficientnet_lite"):  # static TF padding: built for its input size
                cfg.model_kwargs = {**cfg.model_kwargs, "image_size": size}
        return pp

    def sample_sets(self, train: list, val: list):
        """(training set, validation set) of the samples :meth:`datasets` gave; each item is
        (input or None when unreadable, label, index), picklable for spawned loader workers."""
        from ..workflow import transform_of

        cfg, pp = self.cfg, self.preprocess
        transform = TrainTransform(tuple(pp["crop_size"]), pp["mean"], pp["std"], pp["interpolation"],
                                   scale=(cfg.crop_scale, 1.0))
        return (SampleSet(train, transform, cfg.seed, train=True),
                SampleSet(val, transform_of(pp), cfg.seed, train=False))

    def make_model(self, n: int, train: list):
        """The zoo model with ``n`` classes (a probe-initialised head with ``--probe-init``)."""
        import warnings

        from ..workflow import transform_of
        from ..zoo import create_model

        cfg = self.cfg
        with warnings.catch_warnings():  # a re-initialised classifier is logged by the registry already
            warnings.simplefilter("ignore", UserWarning)
            model = create_model(cfg.model, pretrained=cfg.pretrained, num_classes=n, **cfg.model_kwargs)
        if cfg.probe_init:
            from ..zoo.registry import classifier_of
            from .probe import features, init_head, probe

            head = classifier_of(model)
            x, y = features(model, SampleSet(train, transform_of(self.preprocess), cfg.seed, train=False), head)
            probed, mean, std, l2 = probe(x, y, n, cfg.seed)
            init_head(head, probed, mean, std)
            self.log(f"classifier initialised from a linear probe of the frozen features (L2 {l2:g})")
        return model

    def prepare_batch(self, x, y, epoch: int, step: int):
        """A loaded training batch on the device: (inputs, labels, target); classes: the
        one-hot or mixup / cutmix soft target, seeded by (epoch, step)."""
        x, y = x.to(self.dist.device), y.to(self.dist.device)
        x, target = _mix(x, y, self.cfg, epoch, step, len(self.classes))
        return x, y, target

    def loss(self, logits, x, y, target):
        """The training loss of a batch (``target``: one-hot or mixed soft labels): a scalar
        tensor, or a dict of it under "loss" and named parts the epoch record averages as
        ``train_<name>``."""
        return F.cross_entropy(logits.float(), target, label_smoothing=self.cfg.label_smoothing)

    def eval_labels(self, x, y):
        """The labels validation counts against."""
        return y

    def payload(self) -> dict:
        """What a checkpoint records beside the training state, for the commands that use it."""
        return {"model_name": self.cfg.model, "model_kwargs": self.cfg.model_kwargs}

    eval_term_names: tuple = ()  # what eval_terms returns: every process sums the same list

    def eval_terms(self, logits, x, y) -> dict:
        """Sums over a validation batch (of ``eval_term_names``) that the record reports as
        ``val_<name>``, per image."""
        return {}

    def describe(self, record: dict) -> str:
        """The validation part of an epoch's log line."""
        return (f", val top-1 {record['val_top1']:.2f} % ({record['val_correct']}/{record['val_total']}), "
                f"top-5 {record['val_top5']:.2f} %") if "val_top1" in record else ""

    def finish(self) -> None:
        """After the last epoch, on the first process."""
        self._plot()

    def close(self) -> None:
        """Leave the process group. DistributedDataParallel holds the gloo group (its reducer
        keeps a reference), so ``destroy_process_group`` alone leaves the group alive until
        interpreter shutdown, where tearing its worker threads down now and then aborts the
        process ("terminate called without an active exception", SIGABRT). Dropping the
        wrapper first lets the group go while the interpreter is whole."""
        if getattr(self, "net", None) is not None and self.net is not getattr(self, "model", None):
            self.net = self.model
            gc.collect()
        self.dist.close()

    def _resume(self):
        path = self.out / "last.pt"
        if not path.is_file():
            raise NpuforgeError(f"--resume: {path} does not exist; start without --resume")
        state = ckpt.load(path)
        saved = state.get("config", {})
        for key in ("model", "batch_size", "seed", "epochs", "steps", "optimizer"):
            if key in saved and saved[key] != getattr(self.cfg, key):
                raise NpuforgeError(f"--resume: {path} was trained with {key}={saved[key]!r}, this run has "
                                    f"{getattr(self.cfg, key)!r}; resume with the same settings")
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.model.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"]["torch"])
        self.state = dict(state["progress"])
        self.log(f"resumed from {path}: epoch {self.state['epoch'] + 1}, step {self.state['step']}")

    # -- one epoch -----------------------------------------------------------------------
    def _loader(self, batches, dataset):
        workers = self.cfg.workers
        return torch.utils.data.DataLoader(
            dataset, batch_sampler=batches, num_workers=workers, collate_fn=self.collate_fn,
            multiprocessing_context="spawn" if workers else None, generator=torch.Generator().manual_seed(0))

    def _checkpoint(self, name: str, metric: float | None = None) -> None:
        if not self.dist.main:
            return
        state = {**self.payload(), "classes": self.classes, "class_ids": self.class_ids,
                 "preprocess": self.preprocess, "config": asdict(self.cfg), "model": self.model.state_dict(),
                 "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                 "ema": self.ema.model.state_dict() if self.ema else None, "rng": {"torch": torch.get_rng_state()},
                 "progress": self.state, "metric": metric}
        ckpt.save(state, self.out / name)

    def train_epoch(self, epoch: int, stop_after_step: int | None) -> dict:
        cfg, d = self.cfg, self.dist
        self.net.train()
        if cfg.freeze_bn:
            freeze_batchnorm(self.net)
        for m in self.frozen_norms:  # a frozen layer's statistics stay those of its weights
            m.eval()
        start = self.state["step"]
        steps = self.steps_in(epoch)
        batches = list(self.plan.batches(epoch, d.rank, start))[:steps - start]
        bar = None
        if self.progress and d.main:
            from tqdm import tqdm

            bar = tqdm(total=steps, initial=start, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                       unit="step", leave=False)
        t0 = time.perf_counter()
        self.state.setdefault("epoch_loss", 0.0)
        self.state.setdefault("epoch_seen", 0)
        autocast = torch.autocast(d.device.type, dtype=torch.bfloat16 if d.device.type == "cpu" else torch.float16,
                                  enabled=cfg.amp)
        for step, (x, y, skipped) in enumerate(self._loader(batches, self.train_set), start):
            self.state["skipped_images"] += skipped
            x, y, target = self.prepare_batch(x, y, epoch, step)
            with autocast:
                loss = self.loss(self.net(x), x, y, target)
            parts = {}
            if isinstance(loss, dict):
                parts = {k: v for k, v in loss.items() if k != "loss"}
                loss = loss["loss"]
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad or float("inf"))
            # the gradients are all-reduced already, so the norm is the same number on every process
            # (a non-finite loss anywhere makes it non-finite everywhere): all skip together, no extra
            # collective per step
            if not torch.isfinite(norm) or (not d.active and not torch.isfinite(loss)):
                self.state["bad_steps"] += 1
                self.state["skipped_steps"] = self.state.get("skipped_steps", 0) + 1
                self.log(f"epoch {epoch + 1} step {step + 1}: non-finite loss or gradient; step skipped "
                         f"({self.state['bad_steps']} in a row)")
                if self.state["bad_steps"] >= cfg.max_bad_steps:
                    raise NpuforgeError(f"training stopped: {cfg.max_bad_steps} steps in a row had a non-finite "
                                        f"loss or gradient (lower --lr, or add --clip-grad); the last good "
                                        f"checkpoint is {self.out / 'last.pt'}")
            else:
                self.state["bad_steps"] = 0
                self.opt.step()
                self.sched.step()  # a skipped step does not advance the schedule
                if self.ema:
                    self.ema.update(self.model)
            self.state["step"], self.state["global_step"] = step + 1, self.state["global_step"] + 1
            finite = bool(torch.isfinite(loss))
            if finite:
                self.state["epoch_loss"] += float(loss.detach()) * len(y)
                self.state["epoch_seen"] += len(y)
            if parts:  # every process sums every name (the epoch's all-reduce takes the same list everywhere)
                sums = self.state.setdefault("epoch_parts", {})
                for k, v in parts.items():
                    sums[k] = sums.get(k, 0.0) + (float(v.detach()) * len(y) if finite else 0.0)
            if bar is not None:
                rate = (step + 1 - start) * cfg.batch_size * d.world / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{float(loss):.3f}", lr=f"{self.sched.get_last_lr()[0]:.2e}", img_s=f"{rate:.1f}")
                bar.update(1)
            last = step + 1 == steps
            if not last and ((cfg.save_every and (step + 1) % cfg.save_every == 0) or self.stop_requested or
                             stop_after_step == self.state["global_step"]):
                self._checkpoint("last.pt")
                if self.stop_requested or stop_after_step == self.state["global_step"]:
                    if bar is not None:
                        bar.close()
                    raise _Stopped()
        if bar is not None:
            bar.close()
        part_sums = self.state.pop("epoch_parts", {})
        names = sorted(part_sums)  # the same names on every process (the same loss)
        totals = d.sum([self.state.pop("epoch_loss"), self.state.pop("epoch_seen"), *(part_sums[k] for k in names)])
        done = (steps - start) * cfg.batch_size * d.world
        return {"train_loss": totals[0] / max(totals[1], 1),
                **{f"train_{k}": v / max(totals[1], 1) for k, v in zip(names, totals[2:])},
                "images_per_s": done / (time.perf_counter() - t0)}

    def steps_in(self, epoch: int) -> int:
        """The steps of this epoch: all of them, but for ``--steps``' last epoch."""
        per = self.plan.steps_per_epoch
        return min(per, self.cfg.steps - epoch * per) if self.cfg.steps else per

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Exact over processes: integer counts summed, every image counted once."""
        d = self.dist
        if not len(self.val_set):
            return {}
        model = (self.ema.model if self.ema else self.model).eval()
        correct1 = correct5 = total = 0
        loss_sum = 0.0
        terms = dict.fromkeys(self.eval_term_names, 0.0)  # a process without images sums zeros
        batches = list(eval_batches(len(self.val_set), self.cfg.batch_size, d.world, d.rank))
        for x, y, _ in self._loader(batches, self.val_set):
            if not len(y):
                continue
            x = x.to(d.device)
            logits = model(x).float()
            y = self.eval_labels(x, y.to(d.device))
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            for k, v in self.eval_terms(logits, x, y).items():
                terms[k] += float(v)
            top = logits.topk(min(5, logits.shape[1]), dim=1).indices
            correct1 += int((top[:, 0] == y).sum())
            correct5 += int((top == y[:, None]).any(dim=1).sum())
            total += len(y)
        c1, c5, n, ls, *sums = d.sum([correct1, correct5, total, loss_sum, *terms.values()])
        return {"val_correct": int(c1), "val_total": int(n), "val_top1": 100.0 * c1 / max(n, 1),
                "val_top5": 100.0 * c5 / max(n, 1), "val_loss": ls / max(n, 1),
                **{f"val_{k}": v / max(n, 1) for k, v in zip(terms, sums)}}

    def _rank(self, metric, epoch: int) -> list:
        """Put ``epoch`` (its metric, None without validation) into the ranking, best first
        (without validation the latest epoch ranks first); keep its first ``--keep``, return
        it whole."""
        sign = -1.0 if self.higher_is_better else 1.0
        ranking = sorted(self.state["ranking"] + [(metric, epoch)],
                         key=lambda r: -r[1] if r[0] is None else sign * r[0])
        self.state["ranking"] = ranking[:self.cfg.keep]  # every process knows the best epoch
        return ranking

    def _rank_start(self) -> None:
        """With ``rank_start`` and a validation set: the model before any step, ranked as
        epoch 0 (``epoch_000.pt``), so a run whose epochs all score worse keeps it."""
        if not (self.rank_start and len(self.val_set)) or self.state["global_step"] or "start" in self.state:
            return
        record = self.evaluate()
        self.state["start"] = record
        self._rank(record.get(self.metric), 0)
        for name in ("epoch_000.pt", "best.pt"):
            self._checkpoint(name, record.get(self.metric))
        self.log("before training" + self.describe(record).removeprefix(","))

    # -- the run -------------------------------------------------------------------------
    def run(self, stop_after_step: int | None = None) -> dict:
        """Train, evaluate after each epoch, checkpoint; the final record. ``stop_after_step``
        stops as an interruption would (checkpoint, then return), for tests of resume."""
        self.build()
        cfg = self.cfg
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def request_stop(signum, frame):
            self.stop_requested = True
            self.log("interrupted: saving last.pt after this step (--resume continues)")

        for s in previous:
            signal.signal(s, request_stop)
        try:
            self._rank_start()
            while self.state["epoch"] < cfg.epochs:
                epoch = self.state["epoch"]
                record = {"epoch": epoch + 1, **self.train_epoch(epoch, stop_after_step), **self.evaluate(),
                          "lr": self.sched.get_last_lr()[0], "skipped_steps": self.state.get("skipped_steps", 0),
                          "skipped_images": self.state["skipped_images"]}
                self.state.update(epoch=epoch + 1, step=0)
                self.state["history"].append(record)
                ranking = self._rank(record.get(self.metric), epoch + 1)
                if self.dist.main:
                    self._checkpoint(f"epoch_{epoch + 1:03d}.pt", record.get(self.metric))
                    ckpt.keep_top_k(self.out, ranking, cfg.keep)
                    if self.state["ranking"][0][1] == epoch + 1:
                        self._checkpoint("best.pt", record.get(self.metric))
                    self._checkpoint("last.pt", record.get(self.metric))
                    self._write_records(record)
                if self.stop_requested or stop_after_step == self.state["global_step"]:
                    raise _Stopped()
                val = self.describe(record)
                self.log(f"epoch {epoch + 1}/{cfg.epochs}: train loss {record['train_loss']:.4f}{val}, "
                         f"{record['images_per_s']:.1f} images/s")
                self.dist.barrier()
        except _Stopped:
            return {"stopped": True, **self.state}
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        if self.dist.main:
            self.finish()
        best = self.state["ranking"][0]
        # best_top1 for classifiers, best_map for detectors: the ranking metric without its val_
        return {"stopped": False, f"best_{self.metric.removeprefix('val_')}": best[0], "best_epoch": best[1],
                "history": self.state["history"], "start": self.state.get("start"), "output": str(self.out)}

    def _write_records(self, record: dict) -> None:
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        keys = list(record)
        with open(self.out / "summary.csv", "w") as f:
            f.write(",".join(keys) + "\n")
            for r in self.state["history"]:
                f.write(",".join(f"{r.get(k, '')}" for k in keys) + "\n")

    def _plot(self) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.log("note: matplotlib is not installed; no curves.png (pip install matplotlib)")
            return
        h = self.state["history"]
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
        a.plot([r["epoch"] for r in h], [r["train_loss"] for r in h], label="train")
        validated = "val_loss" in h[-1]
        if validated:
            a.plot([r["epoch"] for r in h], [r["val_loss"] for r in h], label="validation")
            for key, label in self.curves:
                b.plot([r["epoch"] for r in h], [r[key] for r in h], label=label)
            b.legend()
        a.set_xlabel("epoch"), a.set_ylabel("loss"), a.legend()
        b.set_xlabel("epoch"), b.set_ylabel(self.curves_label if validated else "no validation (--val-split 0)")
        fig.tight_layout()
        fig.savefig(self.out / "curves.png", dpi=100)
        plt.close(fig)


class _Stopped(Exception):
    """Raised inside the epoch loop when the run stops early (an interruption or a test)."""


def train_with(trainer: Trainer, stop_after_step: int | None = None) -> dict:
    """Run a trainer (a zoo model's, or QAT's), leaving torch's determinism settings as they were."""
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        return trainer.run(stop_after_step)
    finally:
        trainer.close()
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])  # as the caller had it


def train(cfg: TrainConfig, log=print, progress: bool = True, stop_after_step: int | None = None) -> dict:
    return train_with(Trainer(cfg, log, progress), stop_after_step)


__all__ = ["TrainConfig", "Trainer", "train", "train_with"]
