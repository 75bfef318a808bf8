"""What a compiled program costs, per layer and in total: the printed summary, the CSV, the
JSON rows and the self-contained HTML report (inline SVG, no script, nothing fetched)."""

from __future__ import annotations

import csv
import io
from html import escape

from ..analysis import svg
from ..analysis.report import CSS, _table
from ..fileio import write_atomic

COLUMNS = ("layer", "op", "commands", "stripe_rows", "macs", "cycles", "compute_cycles", "sram_bytes", "dram_bytes",
           "mac_utilization", "bound", "device", "why")


def layer_rows(program) -> list[dict]:
    ops = program.lowered.ops
    target = program.target
    stripe = {i: s.stripe for s in program.segments for i in range(s.start, s.stop) if s.stop - s.start > 1}
    rows = {}
    for c in program.commands:
        op = ops[c.op]
        r = rows.setdefault(c.op, {"layer": op.name, "op": op.kind, "commands": 0, "stripe_rows": stripe.get(c.op, 0),
                                   "macs": 0, "cycles": 0, "compute_cycles": 0, "sram_bytes": 0, "dram_bytes": 0,
                                   "_compute_bound": 0})
        r["device"], r["why"] = ("cpu" if op.kind == "cpu" else "npu"), op.why
        r["commands"] += 1
        for key in ("macs", "cycles", "sram_bytes", "dram_bytes"):
            r[key] += getattr(c, key)
        r["compute_cycles"] += c.compute
        r["_compute_bound"] += c.cycles if c.compute >= c.cycles - target.command_overhead_cycles else 0
    out = []
    for i in sorted(rows):
        r = rows[i]
        r["mac_utilization"] = round(r["macs"] / (r["cycles"] * target.macs_per_cycle), 4) if r["cycles"] else 0.0
        r["bound"] = "compute" if r.pop("_compute_bound") * 2 >= r["cycles"] else "transfer"
        out.append(r)
    return out


def sram_along_schedule(program) -> list[int]:
    n = len(program.commands)
    delta = [0] * (n + 1)
    for b in program.buffers:
        delta[b.first] += b.size
        delta[b.last + 1] -= b.size
    live, out = 0, []
    for k in range(n):
        live += delta[k]
        out.append(live)
    return out


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def summary_lines(program) -> list[str]:
    s = program.stats
    cascades = s["cascades"]
    ratio = s["weight_bytes_raw"] / s["weight_bytes_stored"] if s["weight_bytes_stored"] else 1.0
    cpu = s.get("cpu_ops") or {}
    on_cpu = sum(cpu.values())
    where = (f"; {on_cpu} on the host CPU ({', '.join(f'{op} {n}' for op, n in cpu.items())}), "
             f"{100 * s['npu_macs_fraction']:.1f} % of the MACs on the NPU" if on_cpu else "; all on the NPU")
    return [
        f"compiled {s['model']} for {s['target']}: {s['operations']} operations, {s['commands']} commands, "
        f"{len(cascades)} cascade{'s' if len(cascades) != 1 else ''}{where}",
        f"  SRAM: peak {_kib(s['peak_sram'])} of a {_kib(s['sram_budget'])} budget (liveness bound of this "
        f"schedule {_kib(s['liveness_bound'])}; whole tensors would need {_kib(s['untiled_liveness_bound'])}, "
        f"{_kib(s['no_reuse_bytes'])} without reuse)"
        + (f"; {len(s['spilled_tensors'])} tensors ({_kib(s['spilled_bytes'])}) spilled to DRAM"
           if s.get("spilled_tensors") else ""),
        f"  cycles: {s['cycles']:,} ({s['milliseconds']:.3f} ms at {program.target.clock_mhz:g} MHz; untiled "
        f"{s['untiled_cycles']:,}, {100 * (s['cycles'] / s['untiled_cycles'] - 1):+.1f} %), "
        f"{s['macs']:,} MACs, MAC utilization {s['macs'] / max(1, s['cycles'] * program.target.macs_per_cycle):.1%}",
        f"  DRAM traffic {_kib(s['dram_bytes'])}; weights {_kib(s['weight_bytes_stored'])} stored, "
        f"{_kib(s['weight_bytes_raw'])} raw ({ratio:.3f}x), {_kib(s['weight_bytes_padded'])} padded; "
        f"compiled in {s['compile_seconds']:.1f} s",
    ]


def write_csv(path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, buf.getvalue().encode())


def render_html(program, rows: list[dict]) -> str:
    s = program.stats
    in_cascade = {k for k, c in enumerate(program.commands)
                  if any(seg.start <= c.op < seg.stop and seg.stop - seg.start > 1 for seg in program.segments)}
    names = [program.lowered.ops[c.op].name for c in program.commands]
    sram = [v / 1024 for v in sram_along_schedule(program)]
    parts = [f"<h1>npuforge compile: {escape(str(s['model']))} on {escape(s['target'])}</h1>"]
    kpis = [("peak SRAM", _kib(s["peak_sram"])), ("budget", _kib(s["sram_budget"])),
            ("cycles", f"{s['cycles']:,}"), ("time", f"{s['milliseconds']:.3f} ms"),
            ("DRAM traffic", _kib(s["dram_bytes"])), ("commands", str(s["commands"]))]
    parts.append("".join(f'<div class="kpi"><b>{escape(v)}</b>{escape(k)}</div>' for k, v in kpis))
    parts.append("<h2>SRAM in use along the schedule</h2><p class='note'>One bar per command; red: commands of a "
                 f"cascade (stripes with rolling buffers). Liveness bound {_kib(s['liveness_bound'])}, plan "
                 f"{_kib(s['peak_sram'])}.</p>")
    parts.append(svg.bar_chart(sram, "command", "SRAM (KiB)", "SRAM in use", labels=names, highlight=in_cascade))
    parts.append("<h2>Cycles per layer</h2>")
    parts.append(svg.bar_chart([r["cycles"] for r in rows], "layer (schedule order)", "cycles", "cycles per layer",
                               labels=[r["layer"] for r in rows],
                               highlight={k for k, r in enumerate(rows) if r["bound"] == "transfer"}))
    compute = sum(r["cycles"] for r in rows if r["bound"] == "compute")
    parts.append(f"<p class='note'>Red: layers bound by memory transfers. Compute-bound layers take "
                 f"{compute:,} cycles ({compute / max(1, s['cycles']):.0%}), transfer-bound ones "
                 f"{s['cycles'] - compute:,}.</p>")
    parts.append("<h2>Where the time goes</h2>")
    parts.append(svg.line_chart({"compute cycles": [r["compute_cycles"] for r in rows],
                                 "total cycles": [r["cycles"] for r in rows]}, "layer (schedule order)", "cycles",
                                "compute vs total cycles", labels=[r["layer"] for r in rows]))
    cpu = {k for k, r in enumerate(rows) if r["device"] == "cpu"}
    if cpu:
        parts.append("<h2>NPU and host CPU partitions</h2>")
        parts.append(svg.bar_chart([r["cycles"] for r in rows], "layer (schedule order)", "cycles",
                                   "cycles per layer, by device", labels=[r["layer"] for r in rows], highlight=cpu))
        on_cpu = sum(rows[k]["cycles"] for k in cpu)
        parts.append(f"<p class='note'>Red: the {len(cpu)} layers the host CPU runs ({on_cpu:,} cycles, "
                     f"{on_cpu / max(1, s['cycles']):.0%} of the program's; "
                     f"{100 * s['npu_macs_fraction']:.1f} % of the MACs on the NPU). Why each left the NPU:</p>")
        why: dict = {}
        for k in sorted(cpu):
            why.setdefault(rows[k]["why"], []).append(rows[k]["layer"])
        parts.append(_table(["layers", "why", "first of them"],
                            [[len(v), w, v[0]] for w, v in sorted(why.items(), key=lambda kv: -len(kv[1]))], left=3))
    if s["cascades"]:
        parts.append("<h2>Cascades</h2>")
        parts.append(_table(["first", "last", "operations", "stripe rows"],
                            [[c["first"], c["last"], c["operations"], c["stripe_rows"]] for c in s["cascades"]],
                            left=2))
    parts.append("<h2>Layers</h2>")
    parts.append(_table(list(COLUMNS), [[r[c] for c in COLUMNS] for r in rows], left=2))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>npuforge compile: '
            f'{escape(str(s["model"]))}</title><style>{CSS}</style></head><body>' + "\n".join(parts)
            + "</body></html>\n")


def write_html(path, program, rows: list[dict]) -> None:
    write_atomic(path, render_html(program, rows).encode())
