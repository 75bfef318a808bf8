"""Writes tests/data/mediapipe_custom/: small .tflite files with MediaPipe's custom ops (the three
attention-mesh ops of version 2; MaxPoolingWithArgmax2D and MaxUnpooling2D) and the outputs
MediaPipe's own runtime gives for them, the reference of tests/test_tflite_geometry.py and
tests/test_tflite_unpool.py.

LiteRT has no kernel for these ops; MediaPipe's wheel has (its InferenceCalculator with the
TfLiteCustomOpResolverCalculator's resolver). Run it from the repo's venv, naming a Python that
imports mediapipe (0.10.14 was used: ``pip install --no-deps mediapipe==0.10.14`` and then
``numpy<2 'protobuf<5' absl-py attrs flatbuffers opencv-python-headless matplotlib pillow``):

    .venv/bin/python scripts/make_mediapipe_custom_fixtures.py --mediapipe-python /work/mp-venv/bin/python

The geometry models ("eye", "tilted"): a 24x24 RGB image in [0, 1] read as 576 landmarks
(x, y, z) scaled by 24 to pixels; Landmarks2TransformMatrix over a subset of them (random points
give every rotation and crop boxes that run off the image, so TransformTensorBilinear's
outside-the-image zeros are covered); TransformTensorBilinear of the image itself by that matrix
into 8x8 (6x10); TransformLandmarks of the landmarks (x, y, z) and of their (x, y) slice by it.
The images: seeded noise, a ramp, and one of a face-like layout (points near a line, small
rotation). The pooling models: the image max-pooled with window-local indices and unpooled by
them, 2x2 stride 2 SAME on 24x24, 3x3 stride 2 SAME on 23x23 (padded, overlapping windows), 3x3
stride 3 VALID on 23x23; noise images hold equal values in a window, so which of them is the
maximum is checked too.
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import flatbuffers
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from mediapipe_runtime import run_mediapipe  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "mediapipe_custom"
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


class _Model:
    """A one-subgraph .tflite built with LiteRT's schema object API."""

    def __init__(self, description: bytes):
        from ai_edge_litert import schema_py_generated as schema

        self.s = schema
        self.m, self.sg = schema.ModelT(), schema.SubGraphT()
        self.m.version, self.m.description, self.m.buffers = 3, description, [schema.BufferT()]
        self.m.subgraphs, self.m.operatorCodes, self.sg.tensors, self.sg.operators = [self.sg], [], [], []

    def tensor(self, name, shape, data=None, dtype=None) -> int:
        t = self.s.TensorT()
        t.name, t.shape, t.buffer = name.encode(), list(shape), 0
        t.type = self.s.TensorType.FLOAT32 if dtype is None else dtype
        if data is not None:
            buf = self.s.BufferT()
            buf.data = list(np.ascontiguousarray(data).tobytes())
            self.m.buffers.append(buf)
            t.buffer = len(self.m.buffers) - 1
        self.sg.tensors.append(t)
        return len(self.sg.tensors) - 1

    def ints(self, name, values) -> int:
        return self.tensor(name, (len(values),), np.array(values, np.int32), self.s.TensorType.INT32)

    def op(self, code, ins, outs, custom=None, version=1, opts=None, builtin=None) -> None:
        key = (code, custom)
        codes = [(c.builtinCode, c.customCode) for c in self.m.operatorCodes]
        if key not in codes:
            c = self.s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode = code, min(code, 127)
            c.customCode, c.version = custom, version
            self.m.operatorCodes.append(c)
            codes.append(key)
        o = self.s.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = codes.index(key), ins, outs
        if opts is not None:
            o.customOptions = opts
        if builtin is not None:
            o.builtinOptionsType, o.builtinOptions = builtin
        self.sg.operators.append(o)

    def finish(self, inputs: list, outputs: list) -> bytes:
        self.sg.inputs, self.sg.outputs = inputs, outputs
        b = flatbuffers.Builder(1 << 16)
        b.Finish(self.m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def geometry_model(subset: list, left: int, right: int, rotation: float, crop: tuple, scale: tuple) -> bytes:
    from tflite.BuiltinOperator import BuiltinOperator as B

    t = _Model(b"npuforge MediaPipe geometry fixture")
    n = SIZE * SIZE
    image = t.tensor("image", (1, SIZE, SIZE, 3))
    flat = t.tensor("flat", (1, n, 3))
    t.op(B.RESHAPE, [image, t.ints("flat_shape", [1, n, 3])], [flat])
    points = t.tensor("points", (1, n, 3))
    t.op(B.MUL, [flat, t.tensor("pixels", (1,), np.array([SIZE], np.float32))], [points])
    matrix = t.tensor("matrix", (1, 4, 4))
    t.op(B.CUSTOM, [points], [matrix], b"Landmarks2TransformMatrix", 2,
         options(subset_idxs=subset, left_rotation_idx=left, right_rotation_idx=right,
                 target_rotation_radians=rotation, output_height=crop[0], output_width=crop[1], scale_x=scale[0],
                 scale_y=scale[1]))
    cropped = t.tensor("crop", (1, *crop, 3))
    t.op(B.CUSTOM, [image, matrix], [cropped], b"TransformTensorBilinear", 2,
         options(output_height=crop[0], output_width=crop[1]))
    moved3 = t.tensor("moved_xyz", (1, n, 3))
    t.op(B.CUSTOM, [points, matrix], [moved3], b"TransformLandmarks", 2, [])
    xy = t.tensor("xy", (1, n, 2))
    t.op(B.STRIDED_SLICE, [points, t.ints("begin", [0, 0, 0]), t.ints("end", [1, n, 2]), t.ints("strides", [1, 1, 1])],
         [xy], builtin=(t.s.BuiltinOptions.StridedSliceOptions, t.s.StridedSliceOptionsT()))
    moved2 = t.tensor("moved_xy", (1, n, 2))
    t.op(B.CUSTOM, [xy, matrix], [moved2], b"TransformLandmarks", 2, [])
    return t.finish([image], [matrix, cropped, moved3, moved2])


def pool_model(size: int, kernel: int, stride: int, same: bool) -> bytes:
    """image -> MaxPoolingWithArgmax2D -> (pooled, indices) -> MaxUnpooling2D -> unpooled, with the
    options struct MediaPipe's kernels read (TfLitePoolParams: padding 1 SAME / 2 VALID, strides,
    filter sizes, activation 0, and four ints of computed padding)."""
    from tflite.BuiltinOperator import BuiltinOperator as B

    t = _Model(b"npuforge MediaPipe pooling fixture")
    image = t.tensor("image", (1, size, size, 3))
    out = (size + stride - 1) // stride if same else (size - kernel + stride) // stride
    params = list(struct.pack("<10i", 1 if same else 2, stride, stride, kernel, kernel, 0, 0, 0, 0, 0))
    pooled, indices = t.tensor("pooled", (1, out, out, 3)), t.tensor("indices", (1, out, out, 3))
    t.op(B.CUSTOM, [image], [pooled, indices], b"MaxPoolingWithArgmax2D", 1, params)
    unpooled = t.tensor("unpooled", (1, out * kernel, out * kernel, 3))
    t.op(B.CUSTOM, [pooled, indices], [unpooled], b"MaxUnpooling2D", 1, params)
    return t.finish([image], [pooled, unpooled])  # (the indices show in where unpooling puts each value)


def images(size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (3, size, size, 3))
    ramp = np.broadcast_to(np.linspace(0, 255, size * size * 3).reshape(size, size, 3), (1, size, size, 3))
    # landmark 0 and 1 (the rotation pair) near a horizontal line, the rest clustered mid-image
    face = rng.integers(90, 160, (1, size, size, 3))
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
    models = {name: (geometry_model(*config), SIZE, 4) for name, config in configs.items()}
    models.update({"pool2": (pool_model(24, 2, 2, True), 24, 2), "pool3_odd": (pool_model(23, 3, 2, True), 23, 2),
                   "pool3_valid": (pool_model(23, 3, 3, False), 23, 2)})
    for name, (data, size, outputs) in models.items():
        path = OUT / f"{name}.tflite"
        path.write_bytes(data)
        np.savez(OUT / f"{name}.npz", **run_mediapipe(args.mediapipe_python, path, outputs, images(size)))
        print(f"wrote {path} and {name}.npz")

if __name__ == "__main__":
    sys.exit(main())
