"""L2 and layer normalization recognised as one op, so that each quantizes as one integer rule.

``F.normalize(x, dim=d)`` exports as ReduceL2(x, [d], keepdims=1) -> Clip(min=eps) ->
Expand(to x's shape) -> Div(x, .); ``x / x.norm(dim=d, keepdim=True)`` as the same
without the Clip and the Expand. Div of two activations has no quantization rule
(its quotient's precision depends on both grids), while the whole normalization
has an exact one (npuforge/quant/layernorm_rule.py). The Div becomes
``L2Normalize(x, axes, epsilon)``; the ReduceL2, Clip and Expand go when nothing
else reads them.

Layer normalization written out (exporters that predate LayerNormalization, Paddle's):
``d = x - ReduceMean(x, axes)``, ``Div(d, Sqrt(ReduceMean(d * d or Pow(d, 2), axes) + eps))``,
over trailing axes, then maybe ``* gamma`` and ``+ beta`` by constants. The Div becomes
``LayerNormalization(x, gamma, beta, axis, epsilon)``, taking over the Mul and Add.

A LayerNormalization or InstanceNormalization followed by ``* g`` and / or ``+ b`` with constants
on its parameters' axes (torch's GroupNorm with one channel per group exports as
InstanceNormalization with unit scale, then Mul and Add by [C, 1] constants: wav2vec2's feature
extractor) takes them over too: scale ``s g``, bias ``t g + b``. Each op left standing would be
quantized and rounded on its own.
"""

from __future__ import annotations

import numpy as np

from ..ir import dtypes
from .manager import register_pass
from .rewrite import absorb_consumer, const, new_const, prune, scalar, single_consumer


def _norm_of(graph, name: str, producers: dict) -> tuple | None:
    """(x, axes, epsilon) when ``name`` is max(||x|| over axes, epsilon), kept dims, possibly expanded."""
    node = producers.get(name)
    if node is not None and node.op == "Expand":
        node = producers.get(node.inputs[0])
    eps = 0.0
    if node is not None and node.op == "Clip":
        low = scalar(graph, node.inputs[1]) if len(node.inputs) > 1 else None
        if low is None or low < 0 or (len(node.inputs) > 2 and node.inputs[2]):
            return None
        eps, node = low, producers.get(node.inputs[0])
    if node is None or node.op != "ReduceL2" or not node.attrs.get("keepdims", 1):
        return None
    x = graph.values[node.inputs[0]]
    axes = const(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if axes is None or axes.size == 0:
        if len(node.inputs) > 1 and node.inputs[1] or node.attrs.get("noop_with_empty_axes", 0):
            return None  # axes computed at run time, or the reduction skipped
        axes = range(len(x.shape))
    return x.name, sorted(int(a) % len(x.shape) for a in axes), eps


def _trailing_mean(graph, name: str, producers: dict) -> tuple | None:
    """(x, first axis) when ``name`` is ReduceMean(x) over x's trailing axes, dims kept."""
    node = producers.get(name)
    if node is None or node.op != "ReduceMean" or not node.attrs.get("keepdims", 1):
        return None
    rank = len(graph.values[node.inputs[0]].shape)
    axes = const(graph, node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("axes")
    if axes is None or np.asarray(axes).size == 0:
        return None
    axes = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    if axes != list(range(axes[0], rank)):
        return None
    return node.inputs[0], axes[0]


def _centred(graph, name: str, producers: dict) -> tuple | None:
    """(x, axis) when ``name`` is x - ReduceMean(x) over trailing axes from ``axis``."""
    node = producers.get(name)
    if node is None or node.op != "Sub":
        return None
    mean = _trailing_mean(graph, node.inputs[1], producers)
    return mean if mean is not None and mean[0] == node.inputs[0] else None


def _layer_norm_of(graph, node, producers: dict) -> tuple | None:
    """(x, axis, epsilon) when Div ``node`` is a layer normalization written out."""
    centred = _centred(graph, node.inputs[0], producers)
    root = producers.get(node.inputs[1])
    if centred is None or root is None or root.op != "Sqrt":
        return None
    shifted = producers.get(root.inputs[0])
    if shifted is None or shifted.op != "Add":
        return None
    eps = [scalar(graph, i) for i in shifted.inputs]
    k = 1 if eps[1] is not None else 0
    if eps[k] is None or eps[k] < 0 or eps[1 - k] is not None:
        return None
    var = _trailing_mean(graph, shifted.inputs[1 - k], producers)
    square = producers.get(var[0]) if var is not None else None
    if square is None or var[1] != centred[1]:
        return None
    if square.op == "Pow" and scalar(graph, square.inputs[1]) == 2.0:
        d = square.inputs[0]
    elif square.op == "Mul" and square.inputs[0] == square.inputs[1]:
        d = square.inputs[0]
    else:
        return None
    if d != node.inputs[0] and _centred(graph, d, producers) != centred:
        return None
    return centred[0], centred[1], eps[k]


def _fits_layer_norm(graph, node, found: tuple) -> bool:
    """A float32 input, static normalized dims, and the Div's output of the input's shape."""
    x = graph.values[found[0]]
    return x.dtype == "float32" and all(isinstance(d, int) for d in x.shape[found[1]:]) and \
        tuple(x.shape) == tuple(graph.values[node.outputs[0]].shape)


def _affine_consumer(graph, name: str, op: str, normalized: tuple, users: dict):
    """(the only consumer of ``name``, its constant) if it is ``op`` by a constant that broadcasts to
    the normalized shape (leading dims of 1 aside, up to ``name``'s rank); else (None, None)."""
    user = single_consumer(graph, name, users)
    if user is None or user.op != op:
        return None, None
    other = user.inputs[1] if user.inputs[0] == name else user.inputs[0]
    data = const(graph, other)
    if data is None or data.ndim > len(graph.values[name].shape) or \
            graph.values[user.outputs[0]].dtype != graph.values[name].dtype:
        return None, None
    while data.ndim > len(normalized) and data.shape[0] == 1:
        data = data[0]
    if data.ndim > len(normalized) or np.broadcast_shapes(data.shape, normalized) != tuple(normalized):
        return None, None
    return user, np.broadcast_to(data, normalized).astype(np.float32)


def _parameter_shape(graph, node) -> tuple | None:
    """The shape a normalization's scale and bias take against its input: a LayerNormalization's
    normalized dims, an InstanceNormalization's [C, 1, ...]; None where not static."""
    shape = graph.values[node.inputs[0]].shape
    if node.op == "LayerNormalization":
        dims = tuple(shape[node.attrs.get("axis", -1) % len(shape):])
    else:
        dims = (shape[1],) + (1,) * (len(shape) - 2) if len(shape) >= 2 else ()
    return dims if dims and all(isinstance(d, int) for d in dims) else None


def _take_affine(graph, node, dims: tuple, scale: np.ndarray, bias: np.ndarray | None) -> tuple:
    """``node`` (a normalization with parameters ``scale`` and ``bias`` of shape ``dims``, bias None if
    it has none) takes over a following Mul and then Add by constants that broadcast to ``dims``;
    -> (scale, bias, how many it took)."""
    taken = 0
    for op in ("Mul", "Add"):
        user, data = _affine_consumer(graph, node.outputs[0], op, dims, graph.consumers())
        if user is None:
            continue
        absorb_consumer(graph, node, user)
        if op == "Mul":
            scale, bias = scale * data, None if bias is None else bias * data
        else:
            bias = data if bias is None else bias + data
        taken += 1
    return scale, bias, taken


def _absorb_affine(graph, node) -> bool:
    """A LayerNormalization / InstanceNormalization takes over a following Mul and / or Add by
    constants on its parameters' axes (see the module docstring)."""
    dims = _parameter_shape(graph, node)
    if dims is None:
        return False
    params = []
    for k in (1, 2):  # scale, bias: constants, or absent (scale 1, no bias)
        name = node.inputs[k] if len(node.inputs) > k else ""
        data = const(graph, name) if name else None
        if name and data is None:
            return False
        if data is not None and node.op == "InstanceNormalization":
            if data.size != dims[0]:
                return False  # (not one per channel: left for the checker to name)
            data = data.reshape(dims)  # [C] -> [C, 1, ...]
        params.append(None if data is None else np.broadcast_to(data, dims).astype(np.float32))
    scale = np.ones(dims, np.float32) if params[0] is None else params[0]
    scale, bias, taken = _take_affine(graph, node, dims, scale, params[1])
    if taken:
        shape = (-1,) if node.op == "InstanceNormalization" else dims
        node.inputs = [node.inputs[0], new_const(graph, f"{node.name}_scale", scale.reshape(shape))] + \
            ([] if bias is None else [new_const(graph, f"{node.name}_bias", bias.reshape(shape))])
    return bool(taken)


def _layer_norm(graph, node, found: tuple) -> None:
    x, axis, eps = found
    normalized = tuple(graph.values[x].shape[axis:])
    gamma, beta, _ = _take_affine(graph, node, normalized, np.ones(normalized, np.float32), None)
    inputs = [x, new_const(graph, f"{node.name}_gamma", gamma)]
    if beta is not None:
        inputs.append(new_const(graph, f"{node.name}_beta", beta))
    node.op, node.inputs = "LayerNormalization", inputs
    node.attrs = {"axis": axis, "epsilon": eps, "stash_type": 1}


@register_pass("recognize_normalizations",
               "x / max(ReduceL2(x), eps) (F.normalize) -> L2Normalize; layer norm written out -> "
               "LayerNormalization; a Mul / Add by constants after a normalization taken into its scale and bias")
def recognize_normalizations(graph) -> int:
    changes = 0
    producers = graph.producers()
    for node in list(graph.nodes):
        if node.op in ("LayerNormalization", "InstanceNormalization"):
            if _absorb_affine(graph, node):
                producers = graph.producers()
                changes += 1
            continue
        if node.op != "Div" or graph.values[node.outputs[0]].dtype not in dtypes.FLOAT_DTYPES:
            continue
        layer = _layer_norm_of(graph, node, producers)
        if layer is not None and _fits_layer_norm(graph, node, layer):
            _layer_norm(graph, node, layer)
            producers = graph.producers()  # (a Mul and an Add taken over: their outputs are the node's now)
            changes += 1
            continue
        found = _norm_of(graph, node.inputs[1], producers)
        if found is None or found[0] != node.inputs[0]:
            continue
        x = graph.values[node.inputs[0]]
        if x.is_const or tuple(x.shape) != tuple(graph.values[node.outputs[0]].shape):
            continue
        node.op, node.inputs, node.attrs = "L2Normalize", [found[0]], {"axes": found[1], "epsilon": found[2]}
        changes += 1
    prune(graph)
    return changes
