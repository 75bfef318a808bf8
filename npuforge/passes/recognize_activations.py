"""Activation patterns recognised as one op, so each becomes one LUT later.

* Swish:     x * sigmoid(x)                               -> Swish(x)
* HardSwish: x * HardSigmoid(x; alpha=1/6, beta=0.5)      -> HardSwish(x)
             x * Clip(x + 3, 0, 6) / 6  (or * (1/6))      -> HardSwish(x)
* GELU, exact: 0.5 * x * (1 + erf(x / sqrt(2)))              -> Gelu(x)
  (how torch exports nn.GELU() before opset 20: Div, Erf, Add, Mul, Mul)
* GELU, tanh approximation:
             0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  -> Gelu(x, approximate="tanh")
  with x^3 written as x * x * x or Pow(x, 3) (Hugging Face's ``gelu_new``: GPT-2,
  ALBERT), the constants and the products in any order or association, and ``/ c``
  for ``* (1/c)``.

How: the factors of a product tree (Mul, and Div by a constant scalar) are
collected; one factor must be a "marker" (Sigmoid, HardSigmoid, Clip, or
1 + Tanh) whose argument is a polynomial in some value x that is also a
factor; the remaining factors are constant scalars. The polynomial and the
constants are compared with the pattern's (relative tolerance 1e-5). The root
node is replaced by the single op reading x; the nodes of the pattern go when
nothing else reads them.
"""

from __future__ import annotations

import math

from .manager import register_pass
from .rewrite import prune, scalar

RTOL = 1e-5
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SQRT_HALF = math.sqrt(0.5)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RTOL * max(abs(b), 1e-12)


def _factors(graph, name: str, producers: dict, stop: set, depth: int = 0) -> list | None:
    """Factors of a product: ("const", c) or ("value", name); None if too deep."""
    if depth > 12:
        return None
    c = scalar(graph, name)
    if c is not None:
        return [("const", c)]
    prod = producers.get(name)
    if name not in stop and prod is not None:
        if prod.op == "Mul":
            a = _factors(graph, prod.inputs[0], producers, stop, depth + 1)
            b = _factors(graph, prod.inputs[1], producers, stop, depth + 1)
            return None if a is None or b is None else a + b
        if prod.op == "Div":
            d = scalar(graph, prod.inputs[1])
            if d is not None and d != 0.0:
                a = _factors(graph, prod.inputs[0], producers, stop, depth + 1)
                return None if a is None else a + [("const", 1.0 / d)]
    return [("value", name)]


def _poly(graph, name: str, x: str, producers: dict, depth: int = 0) -> dict | None:
    """``name`` as a polynomial in ``x`` {degree: coefficient} of degree <= 3, or None."""
    if name == x:
        return {1: 1.0}
    c = scalar(graph, name)
    if c is not None:
        return {0: c}
    prod = producers.get(name)
    if prod is None or depth > 12 or prod.op not in ("Add", "Sub", "Mul", "Div", "Pow"):
        return None
    a = _poly(graph, prod.inputs[0], x, producers, depth + 1)
    if a is None:
        return None
    if prod.op == "Pow":  # a small whole exponent: a times itself
        e = scalar(graph, prod.inputs[1])
        if e is None or e not in (1.0, 2.0, 3.0):
            return None
        out = {0: 1.0}
        for _ in range(int(e)):
            out = _times(out, a)
            if out is None:
                return None
        return out
    if prod.op == "Div":
        d = scalar(graph, prod.inputs[1])
        return None if d is None or d == 0.0 else {k: v / d for k, v in a.items()}
    b = _poly(graph, prod.inputs[1], x, producers, depth + 1)
    if b is None:
        return None
    if prod.op in ("Add", "Sub"):
        sign = 1.0 if prod.op == "Add" else -1.0
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0.0) + sign * v
        return out
    return _times(a, b)


def _times(a: dict, b: dict) -> dict | None:
    """The product of two polynomials, or None past degree 3."""
    out: dict = {}
    for i, u in a.items():
        for j, v in b.items():
            if i + j > 3:
                return None
            out[i + j] = out.get(i + j, 0.0) + u * v
    return out


def _poly_is(p: dict, want: dict) -> bool:
    keys = set(p) | set(want)
    scale = max(abs(v) for v in want.values())
    return all(abs(p.get(k, 0.0) - want.get(k, 0.0)) <= RTOL * scale for k in keys)


def _affine(p: dict | None) -> tuple | None:
    if p is None or any(k > 1 for k, v in p.items() if v != 0.0):
        return None
    return p.get(1, 0.0), p.get(0, 0.0)


def _candidates(graph, name: str, producers: dict) -> list:
    """Non-constant values in the arithmetic tree of ``name`` (closest first)."""
    out, queue, seen = [], [name], set()
    while queue and len(out) < 32:
        v = queue.pop(0)
        if v in seen or scalar(graph, v) is not None:
            continue
        seen.add(v)
        out.append(v)
        prod = producers.get(v)
        if prod is not None and prod.op in ("Add", "Sub", "Mul", "Div"):
            queue.extend(i for i in prod.inputs if i)
        elif prod is not None and prod.op == "Pow":
            queue.append(prod.inputs[0])
    return out


def _marker(graph, name: str, producers: dict) -> tuple | None:
    """(kind, argument) of a marker value: sigmoid / hardsigmoid / clip / 1 + tanh / 1 + erf."""
    prod = producers.get(name)
    if prod is None:
        return None
    if prod.op in ("Sigmoid", "HardSigmoid"):
        return prod.op, prod.inputs[0], prod
    if prod.op == "Clip":
        return "Clip", prod.inputs[0], prod
    if prod.op == "Add":
        for t, one in ((prod.inputs[0], prod.inputs[1]), (prod.inputs[1], prod.inputs[0])):
            tp = producers.get(t)
            c = scalar(graph, one)
            if tp is not None and tp.op in ("Tanh", "Erf") and c is not None and _close(c, 1.0):
                return tp.op, tp.inputs[0], prod
    return None


def _match(graph, kind, u, mnode, x, const_product, producers) -> tuple | None:
    """(op, attrs) when const_product * x * marker(u) is that op of x."""
    p = _poly(graph, u, x, producers)
    if kind == "Sigmoid":
        if p is not None and _poly_is(p, {1: 1.0}) and _close(const_product, 1.0):
            return "Swish", {}
        return None
    if kind == "Erf":
        if p is not None and _poly_is(p, {1: SQRT_HALF}) and _close(const_product, 0.5):
            return "Gelu", {"approximate": "none"}
        return None
    if kind == "Tanh":
        if p is not None and _poly_is(p, {1: SQRT_2_OVER_PI, 3: SQRT_2_OVER_PI * 0.044715}) \
                and _close(const_product, 0.5):
            return "Gelu", {"approximate": "tanh"}
        return None
    ab = _affine(p)
    if ab is None:
        return None
    a, b = ab
    if kind == "HardSigmoid":  # clip(alpha * (a x + b) + beta, 0, 1)
        alpha, beta = mnode.attrs["alpha"], mnode.attrs["beta"]
        slope, offset, high = alpha * a, alpha * b + beta, 1.0
    else:  # Clip(a x + b, lo, hi)
        lo = scalar(graph, mnode.inputs[1]) if len(mnode.inputs) > 1 and mnode.inputs[1] else None
        hi = scalar(graph, mnode.inputs[2]) if len(mnode.inputs) > 2 and mnode.inputs[2] else None
        if lo != 0.0 or hi is None or hi <= 0.0:
            return None
        slope, offset, high = a, b, hi
    # const_product * high * clip(slope/high x + offset/high, 0, 1) * x  ==  x * clip(x/6 + 1/2, 0, 1)
    if _close(const_product * high, 1.0) and _close(slope / high, 1.0 / 6.0) and _close(offset / high, 0.5):
        return "HardSwish", {}
    return None


def _recognize(graph, root, producers) -> tuple | None:
    factors = _factors(graph, root.outputs[0], producers, stop=set())
    if factors is None:
        return None
    for kind, name in factors:
        if kind != "value":
            continue
        marker = _marker(graph, name, producers)
        if marker is None:
            continue
        mkind, u, mnode = marker
        for x in _candidates(graph, u, producers):
            fs = _factors(graph, root.outputs[0], producers, stop={x, name})
            if fs is None:
                continue
            values = sorted(v for k, v in fs if k == "value")
            if values != sorted([x, name]) or x == name:
                continue
            c = math.prod(v for k, v in fs if k == "const")
            found = _match(graph, mkind, u, mnode, x, c, producers)
            if found is not None:
                return found[0], found[1], x
    return None


@register_pass("recognize_activations",
               "x*sigmoid(x) -> Swish, x*hardsigmoid(x) -> HardSwish, erf- and tanh-form GELU -> Gelu")
def recognize_activations(graph) -> int:
    changes = 0
    producers = graph.producers()
    for root in list(graph.nodes):
        if root.op not in ("Mul", "Div"):
            continue
        out = graph.values[root.outputs[0]]
        if out.dtype not in ("float16", "float32", "float64"):
            continue
        found = _recognize(graph, root, producers)
        if found is None:
            continue
        op, attrs, x = found
        xv = graph.values[x]
        if xv.is_const or xv.dtype != out.dtype or tuple(xv.shape) != tuple(out.shape):
            continue
        # nodes are visited in order: a root inside a bigger pattern is rewritten first only
        # when it matches on its own, and the bigger root then reads the rewritten node
        root.op, root.inputs, root.attrs = op, [x], dict(attrs)
        changes += 1
    prune(graph)
    return changes
