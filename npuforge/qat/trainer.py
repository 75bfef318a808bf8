"""``npuforge qat``'s training: the training command's loop (:class:`~npuforge.train.loop.Trainer`,
with its progress bar, checkpoints, exact resume, NaN guard and torchrun support) on a
:class:`~npuforge.qat.program.QATProgram` instead of a zoo module.

The target is the float model's output (distillation: KL divergence of the softened
distributions, so a folder of unlabelled images is enough) or, with ``labels``, the
folder's labels. Validation counts top-1 against the labels where the folder has them,
else agreement with the float model's top-1, and reports the integer program's KL
divergence from the float model (``val_kl``). Epochs rank by what the training fits: the
validation KL when distilling (a continuous figure: top-1 on a few dozen images moves by
whole images), top-1 with ``labels``. The PTQ program QAT starts from ranks too, as epoch
0, so a run whose epochs all drift from the float model writes its start. The result, the
quantized IR of the best epoch's weights, is written at ``result`` with the float model's
preprocessing and class table and a ``qat`` record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch.nn.functional as F

from ..errors import NpuforgeError
from ..train import checkpoint as ckpt
from ..train.loop import TrainConfig, Trainer
from .program import QATProgram

FORMAT = "npuforge-qat-1"


@dataclass
class QATConfig(TrainConfig):
    result: str = ""  # where the quantized IR goes (OUT.nfir)
    quant: dict = field(default_factory=dict)  # QuantConfig fields: granularity, symmetric, ...
    labels: bool = False  # train on the folder's labels instead of distilling the float model
    temperature: float = 1.0  # of the distillation
    num_calib: int = 100  # calibration images (the first training images, in file order)
    rounding: str = "fixedpoint"
    learn_scales: bool = False  # LSQ: activation scales learnt too (npuforge.qat.program)
    best_start: bool = False  # start from the better on validation of plain PTQ and equalize + bias correction
    # (quant["adaround"]: each from AdaRound's rounding)

    def __post_init__(self):
        super().__post_init__()
        if self.temperature <= 0:
            raise NpuforgeError(f"--temperature {self.temperature}: give a positive number")
        if self.num_calib < 1:
            raise NpuforgeError(f"--num-calib {self.num_calib}: give a positive number of images")
        if self.best_start and (self.quant.get("equalize") or self.quant.get("bias_correction")):
            raise NpuforgeError("--best-start tries the start with and without equalization and bias correction; "
                                "drop --equalize / --bias-correction")
        if self.best_start and not self.val and self.val_split == 0:
            raise NpuforgeError("--best-start picks the start on the validation images: give --val DIR or a "
                                "--val-split above 0")


def _images(root: Path) -> list[Path]:
    from ..zoo.data import _is_image

    if not root.is_dir():
        raise NpuforgeError(f"{root}: no such folder (--data)")
    files = sorted(p for p in root.rglob("*") if _is_image(p) and not any(
        part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise NpuforgeError(f"{root}: no images found; point --data at a folder of images (labels optional)")
    return files


class QATTrainer(Trainer):
    rank_start = True  # the PTQ start is a candidate: QAT never writes a program worse on validation

    def __init__(self, cfg: QATConfig, graph, log=print, progress: bool = True):
        super().__init__(cfg, log, progress)
        self.graph = graph  # the optimized float graph
        self.labelled = False
        self._teacher_of = None  # (validation batch, the float model's output on it)
        self.start_candidates = {}  # --best-start: each PTQ start tried -> its validation metric
        if not cfg.labels:
            self.metric, self.higher_is_better = "val_kl", False

    def _samples(self, folder: str, table, width) -> tuple[list, list | None]:
        """(the folder's images as (path, label) samples, its class names), labels 0 and names
        None where it has no labels of this model's width."""
        from ..zoo.data import ImageDataset

        files = _images(Path(folder))
        try:
            ds = ImageDataset(folder, table)
            labels = {str(p): label for p, label in ds.samples}
            names = list(ds.classes)
        except NpuforgeError:  # no labels this model knows: distillation only
            labels, names = {}, None
        if not (labels and len(labels) == len(files) and (width is None or len(names) == width)):
            labels, names = {}, None
        return [(str(p), labels.get(str(p), 0)) for p in files], names

    def datasets(self):
        from ..train.data import split_samples
        from ..zoo.data import ClassTable

        cfg, graph = self.cfg, self.graph
        outputs = graph.values[graph.outputs[0]].shape
        width = outputs[-1] if outputs and isinstance(outputs[-1], int) else None
        table = graph.metadata.get("class_table")
        table = ClassTable(tuple(table["wnids"]), tuple(table["names"]), source="the model") if table else None
        # without labels every image is class 0: distillation never reads it, validation asks the float model
        samples, names = self._samples(cfg.data, table, width)
        val, val_names = self._samples(cfg.val, table, width) if cfg.val else ([], names)
        self.labelled = names is not None and val_names == names
        for folder, folder_names in ((cfg.data, names), (cfg.val, val_names)):
            if cfg.labels and folder and folder_names is None:
                raise NpuforgeError(f"--labels: {folder} has no labels for this model's {width} classes (class "
                                    f"subfolders or <wnid>_name files of its class table); drop --labels to "
                                    f"distil the float model")
        if cfg.labels and not self.labelled:
            raise NpuforgeError(f"--labels: {cfg.val} (--val) has other classes than {cfg.data}; give both the "
                                f"same class subfolders")
        self.classes = names if self.labelled else [str(k) for k in range(width or 1)]
        self.class_ids = list(self.classes)
        if not self.labelled:
            samples, val = [(p, 0) for p, _ in samples], [(p, 0) for p, _ in val]
        if cfg.val or cfg.val_split == 0:
            train = samples
        elif cfg.labels:  # a split per class
            train, val = split_samples(samples, cfg.val_split, cfg.seed)
        else:  # the labels are not trained on: one seeded split over all images, whatever their classes
            label = dict(samples)
            train, val = ([(p, label[p]) for p, _ in part]
                          for part in split_samples([(p, 0) for p, _ in samples], cfg.val_split, cfg.seed))
        self.log(f"{len(train)} training and {len(val)} validation images; "
                 + ("labels from the folder" if self.labelled else "no labels: validation counts agreement "
                    "with the float model's top-1")
                 + ("" if cfg.labels else "; target: the float model's output (distillation)"))
        return train, val

    def preprocessing(self) -> dict:
        return dict(self.graph.metadata["preprocess"])

    def make_model(self, n: int, train: list):
        from ..train.data import SampleSet, collate, eval_batches
        from ..workflow import transform_of

        cfg = self.cfg
        calib = SampleSet(train[:cfg.num_calib], transform_of(self.preprocess), cfg.seed, train=False)

        def batches():
            for batch in eval_batches(len(calib), 25, 1, 0):
                x, _, _ = collate([calib[k] for k in batch])
                if len(x):
                    yield x.numpy()

        quant = dict(cfg.quant)
        if quant.get("adaround") and not quant.get("adaround_cache"):  # a resumed run does not learn it again
            quant["adaround_cache"] = str(self.out / "adaround")

        def program(extra):
            return QATProgram(self.graph, batches(), {**quant, **extra}, rounding=cfg.rounding, log=self.log,
                              learn_scales=cfg.learn_scales)

        if cfg.best_start:
            self.program = self._best_start([program({}), program({"equalize": True, "bias_correction": True})])
        else:
            self.program = program({})
        self.log(f"calibrated on {self.program.images} images; starting from {self.program.start}; training "
                 f"{len(self.program.names)} weight and bias tensors of "
                 f"{sum(w.numel() for w in self.program.weights)} values "
                 f"({self.program.config.granularity} weights)"
                 + (f"; learning the scales of {len(self.program.groups)} activation groups" if cfg.learn_scales
                    else ""))
        return self.program

    def _best_start(self, programs: list) -> QATProgram:
        """The PTQ program of ``programs`` that validates best (by the ranking metric): QAT's
        start. Every process evaluates every one, so all pick the same."""
        sign = 1.0 if self.higher_is_better else -1.0
        scored = []
        for candidate in programs:
            self.model = self.program = candidate  # what evaluate() runs (and its teacher), before build() sets it
            self.ema = None
            record = self.evaluate()
            scored.append((sign * record[self.metric], -len(scored), candidate))
            self.start_candidates[candidate.start] = record[self.metric]
            self.log(f"start candidate {candidate.start}:" + self.describe(record).removeprefix(","))
        best = max(scored, key=lambda t: t[:2])[2]
        self.log(f"starting from {best.start}, the better of the {len(programs)} on validation")
        return best

    def loss(self, logits, x, y, target):
        if self.cfg.labels:
            return F.cross_entropy(logits.float(), target, label_smoothing=self.cfg.label_smoothing)
        t = self.cfg.temperature
        teacher = F.softmax(self.program.teacher(x) / t, dim=1)
        return F.kl_div(F.log_softmax(logits.float() / t, dim=1), teacher, reduction="batchmean") * t * t

    def _val_teacher(self, x):
        """The float model's output on a validation batch, run once for both of its uses
        (the labels without labels, and the KL)."""
        if self._teacher_of is None or self._teacher_of[0] is not x:
            self._teacher_of = (x, self.program.teacher(x))
        return self._teacher_of[1]

    def eval_labels(self, x, y):
        return y if self.labelled else self._val_teacher(x).argmax(1)

    eval_term_names = ("kl",)

    def eval_terms(self, logits, x, y) -> dict:
        """The KL divergence of the program's output distribution from the float model's
        (temperature 1), summed over the batch."""
        teacher = F.log_softmax(self._val_teacher(x).double(), dim=1)
        kl = F.kl_div(F.log_softmax(logits.double(), dim=1), teacher, log_target=True, reduction="sum")
        return {"kl": float(kl)}

    def describe(self, record: dict) -> str:
        return super().describe(record) + (f", KL to the float model {record['val_kl']:.4g}"
                                           if "val_kl" in record else "")

    def payload(self) -> dict:
        return {"format": FORMAT, "model_name": self.cfg.model, "model_kwargs": {}}

    def finish(self) -> None:
        import npuforge

        best = self.state["ranking"][0][1]
        state = ckpt.load(self.out / f"epoch_{best:03d}.pt")
        self.program.load_state_dict(state["model"])
        graph = self.program.quantized(log=self.log)
        history = self.state["history"]
        chosen = history[best - 1] if best else self.state["start"]
        if not best:
            self.log(f"no epoch scored better on validation than the {self.program.start} program QAT started "
                     f"from: writing that")
        graph.metadata["qat"] = {
            "source": self.cfg.model, "epochs": self.cfg.epochs, "best_epoch": best,
            "training_images": len(self.train_set), "validation_images": len(self.val_set),
            "target": "labels" if self.cfg.labels else f"distillation (temperature {self.cfg.temperature:g})",
            "lr": self.lr, "rounding": self.cfg.rounding, "start": self.program.start,
            "learnt_scales": len(self.program.groups), "start_candidates": dict(self.start_candidates),
            "val_top1": chosen.get("val_top1"), "val_kl": chosen.get("val_kl"),
        }
        result = Path(self.cfg.result)
        result.parent.mkdir(parents=True, exist_ok=True)
        npuforge.save(graph, result)
        self.log(f"wrote {result} (the weights of " + (f"epoch {best})" if best else "the start)"))
        self._plot()


def prepare_graph(spec: str, log=None, input_shapes: dict | None = None):
    """MODEL (zoo name, run checkpoint, ONNX file, saved float IR) -> the optimized float graph."""
    from ..passes import optimize
    from ..workflow import resolve_model

    graph = resolve_model(spec, log=log, input_shapes=input_shapes)
    if any(v.quant is not None for v in graph.values.values()):
        raise NpuforgeError(f"{spec} is already quantized; give the float model (zoo name, checkpoint, ONNX or "
                            f"float IR)")
    return optimize(graph)[0]  # metadata (preprocessing, class table) goes with it


def qat(cfg: QATConfig, graph=None, log=print, progress: bool = True, stop_after_step: int | None = None) -> dict:
    """Train ``cfg.model`` (or the given optimized float ``graph``) with QAT; the result record."""
    from ..train.loop import train_with

    graph = graph if graph is not None else prepare_graph(cfg.model, log)
    return train_with(QATTrainer(cfg, graph, log, progress), stop_after_step)


__all__ = ["FORMAT", "QATConfig", "QATTrainer", "prepare_graph", "qat"]
