"""What the quantize / eval / demo commands share: turning a MODEL argument into a
graph with its preprocessing, and running a graph with a chosen engine.

MODEL is a zoo name (its pretrained weights and preprocessing), an ONNX file or
a saved IR. A graph carries its preprocessing in ``graph.metadata["preprocess"]``
once npuforge has seen where it came from, so a quantized IR evaluates as it was
calibrated.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path


from .errors import NpuforgeError

ENGINES = ("npuforge", "ort", "int")


def preprocess_of(config) -> dict:
    """The JSON preprocessing record of a zoo PretrainedConfig."""
    return {"resize_size": config.resize_size, "crop_size": list(config.crop_size),
            "interpolation": config.interpolation, "mean": list(config.mean), "std": list(config.std),
            "source": f"zoo:{config.name}"}


def transform_of(preprocess: dict, where: str = "the model"):
    """The image transform a preprocessing record describes; a malformed record (read from a file)
    is one line naming ``where``."""
    from .zoo.transforms import ChannelsLast, EvalTransform, LetterboxTransform, ResizeTransform, preprocess_problem

    problem = preprocess_problem(preprocess)
    if problem:
        raise NpuforgeError(f"{where}: {problem} (a malformed preprocessing record; --preprocess ZOO_MODEL "
                            f"replaces it)")

    if preprocess.get("fit") == "letterbox":
        t = LetterboxTransform(preprocess["crop_size"][0], preprocess["interpolation"], preprocess["mean"],
                               preprocess["std"])
    elif preprocess.get("fit") == "resize":
        t = ResizeTransform(preprocess["crop_size"], preprocess["interpolation"], preprocess["mean"],
                            preprocess["std"])
    else:
        t = EvalTransform(preprocess["resize_size"], tuple(preprocess["crop_size"]), preprocess["interpolation"],
                          preprocess["mean"], preprocess["std"])
    return ChannelsLast(t) if preprocess.get("layout") == "nhwc" else t


def zoo_graph(name: str, log=None):
    """A zoo model (pretrained when weights exist) exported and imported, with its preprocessing."""
    import torch

    from . import export_onnx, import_onnx
    from .zoo import create_model, get_config

    config = get_config(name)
    if not config.has_weights and log:
        log(f"note: {name} has no pretrained weights; using random initialisation")
    model = create_model(name, pretrained=config.has_weights).eval()
    buffer = io.BytesIO()
    export_onnx(model, torch.zeros(1, *config.input_size), buffer, input_names=("input",), output_names=("logits",))
    import onnx

    graph = import_onnx(onnx.load_from_string(buffer.getvalue()), name=name)
    graph.metadata["preprocess"] = preprocess_of(config)
    return graph


def run_graph(state: dict, path):
    """A training run's checkpoint (``npuforge zoo train``, read from ``path``) exported and
    imported, with its preprocessing and class table; a detector's with its decoding, scores
    and NMS appended (:func:`npuforge.detection.postprocess.postprocess_graph`: one graph, its
    box path recorded for int16)."""
    import onnx
    import torch

    from . import export_onnx, import_onnx
    from .train.checkpoint import class_table_of, model_from

    model, classes, preprocess = model_from(state)
    size = preprocess["crop_size"]
    buffer = io.BytesIO()
    # a zoo detector's run exports its head rows (cls_logits, boxes[, centerness]), a classifier's its logits
    outputs = tuple(getattr(model, "output_names", ("logits",)))
    export_onnx(model, torch.zeros(1, 3, *size), buffer, input_names=("input",), output_names=outputs)
    graph = import_onnx(onnx.load_from_string(buffer.getvalue()), name=Path(path).stem)
    table = class_table_of(state, path)
    graph.metadata["preprocess"] = {**preprocess, "source": f"run:{path}"}
    graph.metadata["class_table"] = {"wnids": list(table.wnids), "names": list(table.names)}
    if state.get("task") == "detection":
        from .detection.postprocess import postprocess_graph

        postprocess_graph(graph, model, **state["detect"])
        graph.metadata["detector"].update(classes=list(classes), category_ids=list(state["category_ids"]))
    return graph


def add_preprocess_options(p) -> None:
    """--mean / --std / --input-range / --size: the preprocessing of an image model that is not a zoo
    model and records none (or replacing what it records); the quantized IR records the result."""
    from .argtypes import image_size, numbers

    p.add_argument("--mean", type=numbers(3, "three numbers R,G,B"), metavar="R,G,B",
                   help="per-channel mean subtracted from pixels in 0..255 (default ImageNet's 123.675,116.28,103.53)")
    p.add_argument("--std", type=numbers(3, "three numbers R,G,B", lambda v: all(x > 0 for x in v), "must be positive"),
                   metavar="R,G,B", help="per-channel divisor after the mean (default ImageNet's 58.395,57.12,57.375)")
    p.add_argument("--input-range", type=numbers(2, "two numbers LO,HI", lambda v: v[0] < v[1], "needs LO < HI"),
                   metavar="LO,HI", help="instead of --mean / --std: pixels 0..255 mapped linearly onto [LO, HI] "
                                         "(--input-range=-1,1 with '=' for a negative LO, or 0,1)")
    p.add_argument("--size", type=image_size, metavar="H[,W]",
                   help="the model's input size (default: its static input size): the short side resized to "
                        "size / 0.875, then the centre cropped to it")
    p.add_argument("--layout", choices=("nchw", "nhwc"),
                   help="the model's input layout: [N, 3, H, W] (nchw, the default) or [N, H, W, 3] (nhwc, as "
                        "models exported from TensorFlow take)")


def preprocess_overrides(args) -> dict:
    """The preprocessing fields --mean / --std / --input-range / --size set ({} when none is given)."""
    from .errors import NpuforgeError

    out = {}
    if getattr(args, "input_range", None) is not None:
        if args.mean is not None or args.std is not None:
            raise NpuforgeError("--input-range sets the mean and std itself; give it or --mean / --std, not both")
        lo, hi = args.input_range
        out["mean"], out["std"] = [-lo * 255 / (hi - lo)] * 3, [255 / (hi - lo)] * 3
    for key in ("mean", "std"):
        if getattr(args, key, None) is not None:
            out[key] = list(getattr(args, key))
    if getattr(args, "size", None) is not None:
        out["crop_size"] = list(args.size)
        out["resize_size"] = int(round(max(args.size) / 0.875))
    if getattr(args, "layout", None) is not None:
        out["layout"] = args.layout
    return out


def _rgb_batch(shape, layout: str | None) -> bool:
    """A 4-D batch whose channel dim (in ``layout``) is 3, or not fixed."""
    if len(shape) != 4:
        return False
    channels = shape[3] if layout == "nhwc" else shape[1]
    return channels == 3 or not isinstance(channels, int)


def image_dims(shape, layout: str | None) -> tuple:
    """(H, W) of an image batch's shape in ``layout`` (nchw unless nhwc)."""
    return tuple(shape[1:3]) if layout == "nhwc" else tuple(shape[2:4])


def resolve_model(spec: str, preprocess: str | None = None, log=None, input_shapes: dict | None = None,
                  images: bool = True, overrides: dict | None = None):
    """MODEL argument -> Graph with metadata["preprocess"] set (``images=False``: fed arrays, not
    photos; a model that records no preprocessing gets none). ``overrides``
    (:func:`preprocess_overrides`) replace fields of the record, or of ImageNet's defaults."""
    from . import load
    from .zoo import get_config, list_models

    from .train.checkpoint import read_run

    path = Path(spec)
    run = read_run(path)
    from .detection.blazeface import DETECTORS

    if run is not None:
        graph = run_graph(run, path)
    elif not path.exists() and spec in DETECTORS:
        from .detection.blazeface import detector_graph

        graph = detector_graph(spec)  # with its letterbox preprocessing record
    elif not path.exists() and spec in list_models():
        if input_shapes:
            from . import refuse_input_values

            refuse_input_values(spec, input_shapes, "a zoo model")
            raise NpuforgeError(f"{spec}: zoo models have static input shapes; --input-shape is for ONNX files")
        graph = zoo_graph(spec, log)
    elif not path.exists():
        import difflib

        close = difflib.get_close_matches(spec, list_models(), n=3)
        hint = f"; zoo models like it: {', '.join(close)}" if close else ""
        raise NpuforgeError(f"{spec}: no such file, and not a zoo model{hint}")
    else:
        graph = load(path, input_shapes=input_shapes)
    if preprocess:
        graph.metadata["preprocess"] = preprocess_of(get_config(preprocess))
    elif "preprocess" not in graph.metadata and not images:
        return graph
    elif "preprocess" not in graph.metadata:
        shape = graph.values[graph.inputs[0]].shape
        sized = "crop_size" in (overrides or {})
        layout = (overrides or {}).get("layout")
        if not _rgb_batch(shape, layout) or not (sized or all(isinstance(d, int) for d in image_dims(shape, layout))):
            raise NpuforgeError(f"{spec}: input shape {list(shape)} is not an image batch "
                                f"{'[N, H, W, 3]' if layout == 'nhwc' else '[N, 3, H, W]'} with a static size; give "
                                f"--preprocess ZOO_MODEL, or --size H,W (and --layout nhwc for [N, H, W, 3])")
        crop = tuple(overrides["crop_size"]) if sized else image_dims(shape, layout)
        graph.metadata["preprocess"] = {"resize_size": int(round(max(crop) / 0.875)), "crop_size": list(crop),
                                        "interpolation": "bilinear", "mean": [123.675, 116.28, 103.53],
                                        "std": [58.395, 57.12, 57.375], "source": "default ImageNet"}
        if log and not {"mean", "std"} <= set(overrides or {}):
            log(f"note: {spec} records no preprocessing; using ImageNet defaults (resize {crop[0] / 0.875:.0f}, "
                f"crop {crop[0]}x{crop[1]}, mean/std of ImageNet); --preprocess ZOO_MODEL, or --mean / --std "
                f"(--input-range) and --size, pick others")
    if overrides:
        graph.metadata["preprocess"] = {**graph.metadata["preprocess"], **overrides, "source": "options"}
    transform_of(graph.metadata["preprocess"], spec)  # checked before an image is resized to it
    return graph


def check_input_size(graph, where: str) -> None:
    """The preprocessing's image size must be the graph's static input size: a mismatch is the
    user's choice of --preprocess, said in one line (not a runtime's shape error mid-run)."""
    shape = graph.values[graph.inputs[0]].shape
    pre = graph.metadata.get("preprocess") or {}
    crop = tuple(pre.get("crop_size", ()))
    dims = image_dims(shape, pre.get("layout"))
    if len(shape) == 4 and len(crop) == 2 and all(isinstance(d, int) for d in dims) and dims != crop:
        raise NpuforgeError(f"{where}: input '{graph.inputs[0]}' is {list(shape)} but the preprocessing "
                            f"({pre.get('source', 'recorded')}) makes {crop[0]}x{crop[1]} images; give --preprocess a "
                            f"zoo model of input size {dims[0]}x{dims[1]}, or --size {dims[0]},{dims[1]}")


def batch_size_for(graph, requested: int, where: str, log=None) -> int:
    """The batch size to evaluate ``graph`` with: ``requested`` unless the model fixes its batch dim.
    A batch fixed at 1 (most TFLite files and many exports) evaluates one image at a time; another
    fixed size must be asked for; a batch dim of 0 is the model's fault, not --batch-size's."""
    if requested < 1:
        raise NpuforgeError(f"--batch-size {requested}: give a positive number")
    shape = graph.values[graph.inputs[0]].shape
    fixed = shape[0] if shape and isinstance(shape[0], int) else None
    if fixed is None or fixed == requested:
        return requested
    if fixed < 1:
        raise NpuforgeError(f"{where}: input '{graph.inputs[0]}' has batch dim {fixed} in the model; re-export it "
                            f"with a dynamic batch or a batch of 1")
    if fixed == 1:
        if log is not None:
            log(f"{where}: the model's batch is fixed at 1; evaluating one image at a time")
        return 1
    raise NpuforgeError(f"{where}: input '{graph.inputs[0]}' has a fixed batch of {fixed}; give --batch-size {fixed}")


def plain_fallback_note(why: str) -> str:
    """The one line saying the integer program runs on the plain simulator, and why."""
    hint = "; --sim-engine fast runs nodes kept in float in ONNX Runtime's float kernels" \
        if "it runs in float" in why else ""
    return f"note: the integer program runs on the plain simulator, tens of times slower ({why}){hint}"


def forward_of(graph, engine: str = "npuforge", onnx_path: Path | None = None, sim_engine: str = "auto"):
    """A batch -> logits function for the engine: npuforge (float, or fake-quant for a
    quantized graph), ort (ONNX Runtime on the ONNX / QDQ form) or int (the integer
    simulator, run by ``sim_engine``: see :func:`npuforge.sim.lowered.make_simulator`)."""
    from .sim.fake_quant import is_quantized, run_fake_quant

    if engine not in ENGINES:
        raise NpuforgeError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if engine == "int":  # the integer simulator (fixed-point rounding): float in, quantized, dequantized out
        from .sim.lowered import make_simulator

        sim = make_simulator(graph, "fixedpoint", sim_engine)
        forward = lambda x: sim.run({graph.inputs[0]: x})[graph.outputs[0]]  # noqa: E731
        forward.fallback = getattr(sim, "fallback", None)  # why auto / fast run the plain simulator
        return forward
    if engine == "npuforge":
        name = graph.inputs[0]
        run = run_fake_quant if is_quantized(graph) else (lambda g, feeds: g.run(feeds))
        return lambda x: run(graph, {name: x})[graph.outputs[0]]
    import onnxruntime as ort

    from .export import to_onnx, to_qdq_onnx

    if onnx_path is not None:
        source = str(onnx_path)
    else:
        source = (to_qdq_onnx(graph) if is_quantized(graph) else to_onnx(graph)).SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    out = session.get_outputs()[0].name
    in_name = session.get_inputs()[0].name
    return lambda x: session.run([out], {in_name: x})[0]


def cpu_lacks_vnni() -> bool:
    """True on an x86 CPU without VNNI, where ONNX Runtime's u8s8 int8 kernels add
    products in int16 pairs (vpmaddubsw) that saturate for full-range int8 weights."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "vnni" not in flags


ORT_VNNI_NOTE = ("note: this CPU has no VNNI, so ONNX Runtime's int8 kernels saturate 16-bit pair sums with "
                 "full-range int8 weights and drift from the QDQ model's exact numbers; quantize with "
                 "--reduce-range (7-bit weights) for ONNX Runtime on such CPUs")


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr)
