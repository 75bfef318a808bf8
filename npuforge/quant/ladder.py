"""``npuforge quantize --target-drop D``: recipes tried in order of cost until one meets the
drop on a held-out part of the calibration folder (images spread evenly over it).

The rungs: the defaults; equalization and bias correction; those and AdaRound; QAT
(``npuforge qat --best-start``, distilling the float model on the calibration part: it
holds out a fifth of that part, starts from the better there of the first two rungs'
programs, and ranks that start with its epochs, so it writes the start when every epoch
drifts from the float model). Each rung is
quantized from the calibration part only and scored by the integer simulator on the
held-out part: the drop is the float model's top-1 there minus the quantized model's
when the folder has labels, else 100 minus their top-1 agreement. The first rung whose
drop is at most D wins; when none does, the best one is kept and said so.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import NpuforgeError
from .config import QuantConfig

RUNGS = (
    ("defaults", {}),
    ("equalize + bias correction", {"equalize": True, "bias_correction": True}),
    ("equalize + bias correction + AdaRound", {"equalize": True, "bias_correction": True, "adaround": True}),
    ("QAT", None),
)


def _top1_or_agreement(logits: np.ndarray, labels: np.ndarray | None, reference: np.ndarray) -> float:
    if labels is not None:
        return 100.0 * float((logits.argmax(1) == labels).mean())
    return 100.0 * float((logits.argmax(1) == reference.argmax(1)).mean())


def climb(graph, dataset, config: QuantConfig, target_drop: float, *, held_out: int, num_calib: int = 100,
          batch_size: int = 25, qat_epochs: int = 2, qat_lr: float = 1e-4, log=print, work_dir: Path | None = None):
    """(the winning quantized graph, [{rung, drop, top1, seconds, met}]). ``graph``: the
    optimized float graph; ``dataset``: the calibration folder's ImageDataset. Its last
    ``held_out`` images score; PTQ calibrates on the first ``num_calib`` of the others, QAT
    trains on all of them."""
    from ..sim.lowered import make_simulator
    from ..workflow import transform_of
    from ..zoo.data import iter_batches
    from .quantize import quantize

    if held_out < 1 or held_out >= len(dataset):
        raise NpuforgeError(f"--held-out {held_out}: the calibration folder holds {len(dataset)} images; hold out "
                            f"between 1 and {len(dataset) - 1}")
    transform = transform_of(graph.metadata["preprocess"])
    samples = list(dataset.samples)
    picked = set(np.linspace(0, len(samples) - 1, held_out).round().astype(int).tolist())  # spread over the folder
    calib = [s for k, s in enumerate(samples) if k not in picked]
    scored = [s for k, s in enumerate(samples) if k in picked]
    width = graph.values[graph.outputs[0]].shape[-1]
    labelled = dataset.class_table is not None and len(dataset.classes) == width  # labels of the model's classes

    def batches(part):
        dataset.samples = part
        return [(x, y) for x, y, _ in iter_batches(dataset, transform, batch_size)]

    calib_batches, scored_batches = batches(calib[:num_calib]), batches(scored)
    dataset.samples = samples
    labels = np.concatenate([y for _, y in scored_batches]) if labelled else None
    float_logits = np.concatenate([graph.run({graph.inputs[0]: x})[graph.outputs[0]] for x, _ in scored_batches])
    reference = _top1_or_agreement(float_logits, labels, float_logits)
    what = f"the float model's top-1 ({reference:.2f} %)" if labels is not None else \
        "100 % top-1 agreement with the float model (no labels of its classes)"
    log(f"target: at most {target_drop:g} points below {what}, on {len(scored)} held-out images spread over the "
        f"calibration folder; PTQ calibrates on {min(num_calib, len(calib))} of the "
        f"other {len(calib)}, QAT trains on all of them")
    rows, best = [], None
    for rung, extra in RUNGS:
        start = time.perf_counter()
        if extra is None:
            q = _qat_rung(graph, calib, config, qat_epochs, qat_lr, log, work_dir)
        else:
            q = quantize(graph, (x for x, _ in calib_batches), replace(config, **extra), optimize=False,
                         log=lambda m: None, layer_progress=_every_tenth_layer(log))
        sim = make_simulator(q)
        logits = np.concatenate([sim.run({q.inputs[0]: x})[q.outputs[0]] for x, _ in scored_batches])
        score = _top1_or_agreement(logits, labels, float_logits)
        row = {"rung": rung, "top1": round(score, 2), "drop": round(reference - score, 2),
               "seconds": round(time.perf_counter() - start, 1)}
        row["met"] = row["drop"] <= target_drop
        rows.append(row)
        log(f"  {rung}: {score:.2f} % (drop {row['drop']:.2f}), {row['seconds']:.0f} s"
            + (" -- meets the target" if row["met"] else ""))
        if best is None or score > best[0]:
            best = (score, q, rung)
        if row["met"]:
            q.metadata["quantization"]["target_drop"] = {"target": target_drop, "rungs": rows}
            return q, rows
    score, q, rung = best
    log(f"no recipe met a drop of {target_drop:g}; keeping the best, {rung} (drop {reference - score:.2f})")
    q.metadata["quantization"]["target_drop"] = {"target": target_drop, "rungs": rows}
    return q, rows


def _every_tenth_layer(log):
    """Progress of AdaRound and bias correction (minutes on a large model), every tenth layer."""
    def report(step: str, done: int, total: int) -> None:
        if done == total or done % 10 == 0:
            log(f"    {step}: {done}/{total} layers")
    return report


def _qat_rung(graph, calib: list, config: QuantConfig, epochs: int, lr: float, log, work_dir: Path | None):
    """QAT on the calibration part (a folder of links to it), distilling the float model."""
    import npuforge
    from ..qat.trainer import QATConfig, qat

    with tempfile.TemporaryDirectory(prefix="npuforge-ladder-", dir=work_dir) as tmp:
        folder = Path(tmp) / "images"
        folder.mkdir()
        for k, (path, _) in enumerate(calib):
            (folder / f"{k:06d}{Path(path).suffix}").symlink_to(Path(path).resolve())
        quant = {k: v for k, v in config.to_dict().items() if k in ("granularity", "activation_dtype", "symmetric",
                                                                     "tflite_multipliers", "method", "reduce_range")}
        # the start: the better of the first two rungs' programs on QAT's own validation fifth (which
        # start is closer differs by model and granularity: docs/benchmarks.md)
        train = max(len(calib) - max(round(0.2 * len(calib)), 1), 1)  # as QAT's seeded split counts
        cfg = QATConfig(model=graph.name, data=str(folder), output=str(Path(tmp) / "run"),
                        result=str(Path(tmp) / "qat.nfir"), quant=quant, epochs=epochs, lr=lr,
                        batch_size=min(16, train), val_split=0.2, best_start=True, num_calib=min(100, train),
                        label_smoothing=0.0, crop_scale=0.5, workers=2)
        qat(cfg, graph, log=lambda m: log(f"    {m}"), progress=False)
        return npuforge.load(Path(tmp) / "qat.nfir")
