"""Run an exported int8 ``.tflite`` in LiteRT and compare its codes with the integer simulator's.

LiteRT (``pip install ai-edge-litert``) is TFLite's runtime; ``reference=True`` selects
its reference kernels (``OpResolverType.BUILTIN_REF``: the plain integer arithmetic the
TFLite spec defines), ``False`` its default optimized kernels (XNNPACK / ruy), which
are allowed to round differently.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpuforgeError


def interpreter(model: bytes, reference: bool = True):
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        raise NpuforgeError("LiteRT is not installed: pip install ai-edge-litert") from None
    kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
    it = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    it.allocate_tensors()
    return it


TRANSPOSE_CONV_BIAS = b"Convolution2DTransposeBias"  # MediaPipe's custom op (frontend/tflite_custom.py)


def with_builtin_transpose_conv(model: bytes) -> bytes | None:
    """A copy of a .tflite file with MediaPipe's custom op ``Convolution2DTransposeBias`` (which LiteRT
    has no kernel for) rewritten as the builtin TRANSPOSE_CONV, so LiteRT can be the float reference of
    such a model: inputs (output shape, weights, input, bias), the shape a constant of the op's output
    tensor's shape, the custom options (TfLitePadding 1 SAME / 2 VALID, stride_w, stride_h: three
    int32) as its TransposeConvOptions. None when the file has no such op."""
    import struct

    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(model, 0)
    custom = {i for i, c in enumerate(m.operatorCodes) if c.customCode == TRANSPOSE_CONV_BIAS}
    if not custom:
        return None
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.TRANSPOSE_CONV
    code.version = 3
    m.operatorCodes.append(code)
    padding_of = {1: schema.Padding.SAME, 2: schema.Padding.VALID}
    for sg in m.subgraphs:
        for op in sg.operators:
            if op.opcodeIndex not in custom:
                continue
            padding, stride_w, stride_h = struct.unpack("<3i", bytes(op.customOptions)[:12])
            buffer = schema.BufferT()
            buffer.data = np.array(sg.tensors[op.outputs[0]].shape, np.int32).view(np.uint8)
            m.buffers.append(buffer)
            sizes = schema.TensorT()
            sizes.shape, sizes.type, sizes.buffer = [4], schema.TensorType.INT32, len(m.buffers) - 1
            sizes.name = b"output_shape"
            sg.tensors.append(sizes)
            opt = schema.TransposeConvOptionsT()
            opt.padding, opt.strideW, opt.strideH = padding_of[padding], stride_w, stride_h
            op.opcodeIndex = len(m.operatorCodes) - 1
            op.inputs = [len(sg.tensors) - 1, op.inputs[1], op.inputs[0], op.inputs[2]]
            op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.TransposeConvOptions, opt
            op.customOptions = None
    b = flatbuffers.Builder(len(model) + 4096)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def run_litert(it, codes: list) -> list:
    """Feed int8 codes in the IR's layout (NCHW where 4-D); the output codes in the IR's layout. Each
    run starts from zero states (an LSTM's variable tensors), as the IR's graph does."""
    it.reset_all_variables()
    for d, c in zip(it.get_input_details(), codes):
        it.set_tensor(d["index"], np.ascontiguousarray(c.transpose(0, 2, 3, 1) if c.ndim == 4 else c))
    it.invoke()
    outs = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    return [o.transpose(0, 3, 1, 2) if o.ndim == 4 else o for o in outs]


def tflite_codes(graph, name: str, codes: np.ndarray) -> np.ndarray:
    """A value's simulator codes as the TFLite export stores them (uint8 - 128; int16 as they are)."""
    p = graph.values[name].quant
    if p.dtype == "int16":  # TFLite's 16x8 mode: the codes themselves
        return codes.astype(np.int16)
    shift = 128 if p.dtype == "uint8" else 0
    return (codes.astype(np.int16) - shift).astype(np.int8)


# LiteRT's reference int8 SOFTMAX divides by a sum of exponentials held with 12 integer bits through
# gemmlowp's RoundingDivideByPOT, whose exponent assert fires (abort(): the whole process ends) once a
# row's exponentials sum to 512 or more; the optimized kernel has no such limit. Rows whose sum comes
# within SOFTMAX_MARGIN of it (the fixed-point exponentials' own error) are refused too.
REFERENCE_SOFTMAX_SUM = 512
SOFTMAX_MARGIN = 8


def refuse_aborting_softmax(graph, sim, feeds: list[dict]) -> None:
    """A Softmax whose rows, on these inputs, sum their exponentials to about 512 (LiteRT's reference
    kernel would end the process) is refused before LiteRT runs; rows shorter than that never do."""
    long_rows = [n for n in graph.nodes if n.op == "Softmax" and _may_reach(graph, n)]
    if not long_rows:
        return
    for q in feeds:
        xs = sim.run(q, outputs=[n.inputs[0] for n in long_rows])  # the Softmax inputs, dequantized
        for node in long_rows:
            x = np.asarray(xs[node.inputs[0]], np.float64)
            axis = node.attrs["axis"] % x.ndim
            total = float(np.exp(x - x.max(axis=axis, keepdims=True)).sum(axis=axis).max())
            if total >= REFERENCE_SOFTMAX_SUM - SOFTMAX_MARGIN:
                raise NpuforgeError(f"node '{node.name}' (Softmax): rows of {_row_length(graph, node)} entries whose "
                                    f"exponentials sum to {total:.0f} on this input; LiteRT's reference SOFTMAX aborts "
                                    f"the process at {REFERENCE_SOFTMAX_SUM}, so it cannot check this model (the "
                                    f"export itself is valid and runs on LiteRT's default kernels)")


def _row_length(graph, node):
    shape = graph.values[node.inputs[0]].shape
    return shape[node.attrs["axis"] % len(shape)]


def _may_reach(graph, node) -> bool:
    """Whether the Softmax's rows are long enough (or of unknown length) to sum to the limit."""
    length = _row_length(graph, node)
    return not isinstance(length, int) or length >= REFERENCE_SOFTMAX_SUM - SOFTMAX_MARGIN


def compare(graph, model: bytes, batches, reference: bool = True, simulator=None) -> dict:
    """Run ``batches`` (dicts input name -> float array, or integer ids, batch 1 each) through the integer
    simulator and LiteRT; counts of output codes and of samples that differ."""
    from ..sim.integer import IntegerSimulator, quantize_input

    sim = simulator or IntegerSimulator(graph)
    coded = [{n: quantize_input(np.asarray(feeds[n], np.float32), graph.values[n].quant)
              if graph.values[n].quant is not None else np.asarray(feeds[n]) for n in graph.inputs}
             for feeds in batches]
    if reference:
        refuse_aborting_softmax(graph, sim, coded)
    it = interpreter(model, reference)
    samples = equal = codes = differ = 0
    worst = 0
    for q in coded:
        ours = sim.run(q, dequantize=False)
        theirs = run_litert(it, [tflite_codes(graph, n, q[n]) if graph.values[n].quant is not None
                                 else q[n].astype(np.int32) for n in graph.inputs])  # token ids: int32
        same = True
        for name, t in zip(graph.outputs, theirs):
            o = tflite_codes(graph, name, ours[name]).astype(np.int64)
            d = np.abs(o - t.astype(np.int64))
            codes += d.size
            differ += int(np.count_nonzero(d))
            worst = max(worst, int(d.max(initial=0)))
            same &= not d.any()
        samples += 1
        equal += int(same)
    return {"samples": samples, "bit_exact_samples": equal, "codes": codes, "codes_differing": differ,
            "max_code_difference": worst, "kernels": "reference" if reference else "default"}
