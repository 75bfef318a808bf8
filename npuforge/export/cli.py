"""``npuforge export``: write a model as int8 TFLite or ONNX (QDQ when quantized)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..argtypes import non_negative_int
from ..errors import NpuforgeError
from ..fileio import write_atomic
from ..outputs import Planned

FORMATS = ("tflite", "onnx")


def add_export_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="write a quantized IR as int8 TFLite (or a model as ONNX / ONNX QDQ)",
        description="Write MODEL in another format. --format tflite: a full-integer int8 TFLite model (int8 "
                    "activations, int8 per-channel weights, int32 biases, NHWC) that LiteRT runs and Arm's Vela "
                    "compiles; MODEL must be a quantized IR quantized with --target tflite, so that LiteRT "
                    "computes what the integer simulator computes (docs/tflite.md). --format onnx: ONNX, QDQ "
                    "for a quantized IR.")
    p.add_argument("model", help="a quantized IR (npuforge quantize ... -o OUT), or any model file for --format onnx")
    p.add_argument("--format", required=True, choices=FORMATS, help="tflite (int8) or onnx")
    p.add_argument("--output", "-o", required=True, metavar="OUT", help="the file to write")
    p.add_argument("--io", choices=("int8", "float"), default="int8",
                   help="TFLite inputs and outputs: int8 codes (default; what NPU compilers take) or float32 "
                        "behind QUANTIZE / DEQUANTIZE")
    p.add_argument("--check-litert", type=non_negative_int, default=0, metavar="N",
                   help="after writing, run N seeded random inputs through LiteRT's reference kernels and the "
                        "integer simulator and print how many agree bit for bit (needs ai-edge-litert)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_export, outputs=lambda a: [Planned(Path(a.output), a.format, "--output")])


def _random_batches(graph, n: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(n):
        feeds = {}
        for name in graph.inputs:
            p = graph.values[name].quant
            shape = tuple(d if isinstance(d, int) else 1 for d in graph.values[name].shape)
            if p is None:  # token ids: below the size of the table they index
                feeds[name] = rng.integers(0, _index_bound(graph, name), shape)
                continue
            lo, hi = (float((q - p.zero_point) * p.scale) for q in (p.qmin, p.qmax))
            feeds[name] = rng.uniform(lo, hi, shape).astype(np.float32)
        yield feeds


def _index_bound(graph, name: str) -> int:
    """The number of rows of the smallest table an integer input indexes (a Gather's axis)."""
    sizes = [graph.values[n.inputs[0]].shape[n.attrs["axis"]] for n in graph.nodes
             if n.op == "Gather" and n.inputs[1] == name]
    sizes = [s for s in sizes if isinstance(s, int)]
    if not sizes:
        raise NpuforgeError(f"--check-litert: integer input '{name}' indexes no Gather; give inputs of your own "
                            f"(npuforge.export.litert_check.compare)")
    return min(sizes)


def cmd_export(args) -> int:
    from .. import load
    from ..cli import parse_input_shapes

    if args.check_litert and (args.format != "tflite" or args.io != "int8"):  # before anything is written
        raise NpuforgeError("--check-litert compares an int8-io TFLite export (--format tflite --io int8)")
    graph = load(args.model, input_shapes=parse_input_shapes(args.input_shape) or None)
    out = Path(args.output)
    quantized = any(v.quant is not None for v in graph.values.values())
    if args.format == "tflite":
        from .tflite_export import to_tflite

        data = to_tflite(graph, io=args.io)
        ops = Counter(_tflite_ops(data))
    else:
        from . import to_onnx, to_qdq_onnx

        model = to_qdq_onnx(graph) if quantized else to_onnx(graph)
        data = model.SerializeToString()
        ops = Counter(n.op_type for n in model.graph.node)
    write_atomic(out, data)
    report = {"output": str(out), "format": args.format, "bytes": len(data), "ops": dict(ops.most_common())}
    if args.check_litert:
        from .litert_check import compare

        report["litert_reference"] = compare(graph, data, _random_batches(graph, args.check_litert))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"wrote {out} ({args.format}, {len(data) / 1e6:.2f} MB): "
          + ", ".join(f"{op} {n}" for op, n in ops.most_common()))
    if "litert_reference" in report:
        r = report["litert_reference"]
        print(f"LiteRT reference kernels vs the integer simulator: {r['bit_exact_samples']}/{r['samples']} random "
              f"inputs bit-exact, {r['codes_differing']} of {r['codes']} output codes differ "
              f"(largest difference {r['max_code_difference']})")
    return 0


def _tflite_ops(data: bytes) -> list:
    from tflite.BuiltinOperator import BuiltinOperator
    from tflite.Model import Model

    names = {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}
    model = Model.GetRootAsModel(data, 0)
    codes = [max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode())
             for i in range(model.OperatorCodesLength())]
    sub = model.Subgraphs(0)
    return [names.get(codes[sub.Operators(i).OpcodeIndex()], "?") for i in range(sub.OperatorsLength())]
