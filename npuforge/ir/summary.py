"""What is in a graph: inputs, outputs, op histogram, parameters, MACs."""

from __future__ import annotations

from ..ops.registry import get_op
from . import dtypes
from .graph import format_shape
from .infer import graph_infos, infer_node, input_infos


def summarize(graph) -> dict:
    infos = graph_infos(graph)
    macs_by_op: dict[str, int] = {}
    for node in graph.nodes:
        ins = input_infos(node, infos)
        outs = infer_node(node, ins)
        infos.update(zip(node.outputs, outs))
        macs_by_op[node.op] = macs_by_op.get(node.op, 0) + get_op(node.op).macs(node, ins, outs)
    weights = [v for v in graph.constants() if v.dtype in dtypes.FLOAT_DTYPES]

    def io(names):
        return [{"name": n, "dtype": graph.values[n].dtype, "shape": list(graph.values[n].shape)} for n in names]

    return {
        "name": graph.name,
        "inputs": io(graph.inputs),
        "outputs": io(graph.outputs),
        "nodes": len(graph.nodes),
        "ops": graph.op_histogram(),
        "parameters": int(sum(v.data.size for v in weights)),
        "parameter_bytes": int(sum(v.data.nbytes for v in weights)),
        "macs": int(sum(macs_by_op.values())),
        "macs_by_op": {k: v for k, v in sorted(macs_by_op.items()) if v},
    }


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def format_summary(s: dict) -> str:
    lines = [f"graph    {s['name']}"]
    for key in ("inputs", "outputs"):
        for io in s[key]:
            lines.append(f"{key[:-1]:<8} {io['name']}: {io['dtype']}{format_shape(io['shape'])}")
    lines.append(f"nodes    {s['nodes']}")
    lines.append(f"params   {s['parameters']:,} ({s['parameter_bytes'] / 2**20:.1f} MiB)")
    lines.append(f"MACs     {_si(s['macs'])} per sample (dynamic dims counted as 1)")
    lines.append("ops")
    width = max((len(op) for op in s["ops"]), default=0)
    for op, count in s["ops"].items():
        macs = s["macs_by_op"].get(op)
        lines.append(f"  {op:<{width}}  {count:>4}" + (f"   {_si(macs)} MACs" if macs else ""))
    return "\n".join(lines)
