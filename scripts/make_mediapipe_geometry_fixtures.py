"""Writes tests/data/mediapipe_geometry/: a small .tflite with MediaPipe's three attention-mesh custom
ops (version 2) and the outputs MediaPipe's own runtime gives for it, the reference of
tests/test_tflite_geometry.py.

LiteRT has no kernel for these ops; MediaPipe's wheel has (its InferenceCalculator with the
TfLiteCustomOpResolverCalculator's resolver). Run it from the repo's venv, naming a Python that
imports mediapipe (0.10.14 was used: ``pip install --no-deps mediapipe==0.10.14`` and then
``numpy<2 'protobuf<5' absl-py attrs flatbuffers opencv-python-headless matplotlib pillow``):

    .venv/bin/python scripts/make_mediapipe_geometry_fixtures.py --mediapipe-python /work/mp-venv/bin/python

The model: a 24x24 RGB image in [0, 1] read as 576 landmarks (x, y, z) scaled by 24 to pixels;
Landmarks2TransformMatrix over a subset of them (random points give every rotation and crop
boxes that run off the image, so TransformTensorBilinear's outside-the-image zeros are covered);
TransformTensorBilinear of the image itself by that matrix into 8x8; TransformLandmarks of the
landmarks (x, y, z) and of their (x, y) slice by it. The images: seeded noise, a ramp, and one
of a face-like layout (points near a line, small rotation).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import flatbuffers
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from mediapipe_runtime import run_mediapipe  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "mediapipe_geometry"
SIZE = 24


def options(**values) -> list:
    """A FlexBuffers map as MediaPipe's converter writes one (index lists as typed int vectors)."""
    from flatbuffers import flexbuffers as fx

    b = fx.Builder()
    with b.Map():
        for key, v in values.items():
            if isinstance(v, list):
                b.Key(key)
                b.TypedVectorFromElements(v, element_type=fx.Type.INT)
            elif isinstance(v, float):
                b.Float(key, v)
            else:
                b.Int(key, v)
    return list(b.Finish())


def model(subset: list, left: int, right: int, rotation: float, crop: tuple, scale: tuple) -> bytes:
    from ai_edge_litert import schema_py_generated as s
    from tflite.BuiltinOperator import BuiltinOperator as B

    m, sg = s.ModelT(), s.SubGraphT()
    m.version, m.description, m.buffers = 3, b"npuforge MediaPipe geometry fixture", [s.BufferT()]
    m.subgraphs, m.operatorCodes, sg.tensors, sg.operators = [sg], [], [], []

    def tensor(name, shape, data=None, dtype=s.TensorType.FLOAT32):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), list(shape), dtype, 0
        if data is not None:
            buf = s.BufferT()
            buf.data = list(np.ascontiguousarray(data).tobytes())
            m.buffers.append(buf)
            t.buffer = len(m.buffers) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    def op(code, ins, outs, custom=None, version=1, opts=None, builtin=None):
        key = (code, custom)
        codes = [(c.builtinCode, c.customCode) for c in m.operatorCodes]
        if key not in codes:
            c = s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode = code, min(code, 127)
            c.customCode, c.version = custom, version
            m.operatorCodes.append(c)
            codes.append(key)
        o = s.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = codes.index(key), ins, outs
        if opts is not None:
            o.customOptions = opts
        if builtin is not None:
            o.builtinOptionsType, o.builtinOptions = builtin
        sg.operators.append(o)

    n = SIZE * SIZE
    image = tensor("image", (1, SIZE, SIZE, 3))
    flat = tensor("flat", (1, n, 3))
    op(B.RESHAPE, [image, tensor("flat_shape", (3,), np.array([1, n, 3], np.int32), s.TensorType.INT32)], [flat])
    points = tensor("points", (1, n, 3))
    op(B.MUL, [flat, tensor("pixels", (1,), np.array([SIZE], np.float32))], [points])
    matrix = tensor("matrix", (1, 4, 4))
    op(B.CUSTOM, [points], [matrix], b"Landmarks2TransformMatrix", 2,
       options(subset_idxs=subset, left_rotation_idx=left, right_rotation_idx=right,
               target_rotation_radians=rotation, output_height=crop[0], output_width=crop[1], scale_x=scale[0],
               scale_y=scale[1]))
    cropped = tensor("crop", (1, *crop, 3))
    op(B.CUSTOM, [image, matrix], [cropped], b"TransformTensorBilinear", 2,
       options(output_height=crop[0], output_width=crop[1]))
    moved3 = tensor("moved_xyz", (1, n, 3))
    op(B.CUSTOM, [points, matrix], [moved3], b"TransformLandmarks", 2, [])
    xy = tensor("xy", (1, n, 2))
    op(B.STRIDED_SLICE, [points] + [tensor(k, (3,), np.array(v, np.int32), s.TensorType.INT32)
                                    for k, v in (("begin", [0, 0, 0]), ("end", [1, n, 2]), ("strides", [1, 1, 1]))],
       [xy], builtin=(s.BuiltinOptions.StridedSliceOptions, s.StridedSliceOptionsT()))
    moved2 = tensor("moved_xy", (1, n, 2))
    op(B.CUSTOM, [xy, matrix], [moved2], b"TransformLandmarks", 2, [])
    sg.inputs, sg.outputs = [image], [matrix, cropped, moved3, moved2]
    b = flatbuffers.Builder(1 << 16)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def images() -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (3, SIZE, SIZE, 3))
    ramp = np.broadcast_to(np.linspace(0, 255, SIZE * SIZE * 3).reshape(SIZE, SIZE, 3), (1, SIZE, SIZE, 3))
    # landmark 0 and 1 (the rotation pair) near a horizontal line, the rest clustered mid-image
    face = rng.integers(90, 160, (1, SIZE, SIZE, 3))
    face[0, 0, 0, :2], face[0, 0, 1, :2] = (60, 120), (200, 128)
    return np.concatenate([noise, ramp, face]).astype(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mediapipe-python", required=True, help="a Python interpreter that imports mediapipe")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    configs = {  # name: (subset, left, right, target rotation, crop (h, w), scale (x, y))
        "eye": (sorted(rng.choice(SIZE * SIZE, 16, replace=False).tolist()), 0, 1, 0.0, (8, 8), (1.5, 1.5)),
        "tilted": (sorted(rng.choice(SIZE * SIZE, 11, replace=False).tolist()), 5, 40, 0.3, (6, 10), (1.2, 2.0)),
    }
    imgs = images()
    for name, config in configs.items():
        path = OUT / f"{name}.tflite"
        path.write_bytes(model(*config))
        got = run_mediapipe(args.mediapipe_python, path, 4, imgs)
        np.savez(OUT / f"{name}.npz", **got)
        print(f"wrote {path} and {name}.npz")


if __name__ == "__main__":
    sys.exit(main())
