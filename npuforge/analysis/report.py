"""The self-contained HTML report: charts are inline SVG, styles inline, no script,
no link or image that leaves the file."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from ..fileio import write_atomic
from . import svg

CSS = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ccc}h3{font-size:14px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
td.l,th.l{text-align:left}tr.worst td{background:#fde8e8}.kpi{display:inline-block;margin-right:28px}
.kpi b{font-size:20px;display:block}.note{color:#555;font-size:12px}.grid{display:flex;flex-wrap:wrap;gap:12px}
"""


def _table(header: list[str], rows: list[list], left: int = 1, classes: list[str] | None = None) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{escape(h)}</th>' for i, h in enumerate(header))
    body = []
    for k, row in enumerate(rows):
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        cells = "".join(f'<td class="{"l" if i < left else ""}">{escape(str(c))}</td>' for i, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _short(name: str, by_name: dict) -> str:
    """A layer name for a chart label: its op suffix and leading parts dropped (/a/b/c/d/Conv -> b/c/d)."""
    parts = [p for p in name.split("/") if p]
    if len(parts) > 1 and name in by_name and parts[-1] == by_name[name]["op"]:
        parts = parts[:-1]
    return "/".join(parts[-3:]) or name


def render(result: dict) -> str:
    cfg = result["config"]
    layers = result["layers"]
    by_name = {layer["name"]: layer for layer in layers}
    worst = set(result["ranking"][:5])
    parts = [f"<h1>Quantization analysis: {escape(str(result.get('model', 'model')))}</h1>",
             f'<p class="note">{escape(cfg["granularity"])} weights, {escape(cfg["method"])} observer, '
             f'{escape(cfg["activation_dtype"])} activations; {result["calibration_images"]} calibration images, '
             f'{result["evaluation_images"]} evaluation images (top-1 by {escape(result["engine"])}), per-layer '
             f'errors on {result["analysis_images"]} images.</p>']
    kpis = [("FP32 top-1", f"{result['fp32_top1']:.2f}%"), ("int8 top-1", f"{result['int8_top1']:.2f}%"),
            ("drop", f"{result['drop']:.2f} points"), ("output SQNR", f"{result['output']['sqnr_db']:.1f} dB")]
    s = result.get("search")
    if s:
        kpis.append(("after search", f"{s['top1']:.2f}% ({len(s['changes'])} layers changed)"))
    parts.append("".join(f'<div class="kpi">{escape(k)}<b>{escape(v)}</b></div>' for k, v in kpis))

    names = [layer["name"] for layer in layers]
    parts.append("<h2>SQNR along depth</h2>")
    parts.append(svg.line_chart({"cumulative (quantized network)": [x["sqnr_db"] for x in layers],
                                 "isolated (only this layer quantized)": [x["isolated_sqnr_db"] for x in layers],
                                 "network output, only this layer quantized": [x["output_sqnr_db"] for x in layers]},
                                "layer (graph order)", "SQNR (dB)", "SQNR along depth", labels=names))
    parts.append("<h3>Share of the network-output error (isolated)</h3>")
    parts.append(svg.bar_chart([x["drop_share"] * 100 for x in layers], "layer (graph order)", "share (%)",
                               "share of the output error", labels=names,
                               highlight={by_name[n]["depth"] for n in worst}))

    parts.append("<h2>Layers ranked</h2>")
    rows, classes = [], []
    for name in result["ranking"]:
        x = by_name[name]
        w = x["weights"] or {}
        rows.append([x["rank"], name, x["op"], f"{x['sqnr_db']:.1f}", f"{x['isolated_sqnr_db']:.1f}",
                     f"{x['cosine']:.4f}", f"{x['isolated_cosine']:.4f}",
                     "" if x["rel_mse"] is None else f"{x['rel_mse']:.4f}", f"{x['output_sqnr_db']:.1f}",
                     f"{100 * x['drop_share']:.1f}%",
                     f"{w['range_spread']:.1f}x" if w.get("range_spread") is not None else "",
                     f"{w['sqnr_per_tensor_db']:.1f} / {w['sqnr_per_channel_db']:.1f}" if w else ""])
        classes.append("worst" if name in worst else "")
    parts.append(_table(["#", "layer", "op", "SQNR cum. dB", "SQNR iso. dB", "cosine cum.", "cosine iso.",
                         "rel. MSE cum.", "output SQNR dB", "share", "weight range spread",
                         "weight SQNR dB per-tensor / per-channel"], rows, left=3, classes=classes))

    if result["explained"]:
        parts.append("<h2>How much of the drop the worst layers explain</h2>")
        parts.append(_table(["worst layers kept in float", "top-1", "drop recovered", "share of output error"],
                            [[e["layers"], f"{e['top1']:.2f}%",
                              "" if e["recovered"] is None else f"{100 * e['recovered']:.0f}%",
                              f"{100 * e['output_noise_share']:.0f}%"] for e in result["explained"]]))

    if result["fixes"]:
        parts.append("<h2>Fixes tried (one layer at a time)</h2>")
        parts.append(svg.hbar_chart([(f"{_short(f['layer'], by_name)}: {f['fix']}", f["top1"])
                                     for f in result["fixes"]], "top-1 (%)",
                                    {"FP32": result["fp32_top1"], "int8": result["int8_top1"]}, "fixes"))
        parts.append(_table(["layer", "fix", "top-1", "change"],
                            [[f["layer"], f["fix"], f"{f['top1']:.2f}%", f"{f['delta']:+.2f}"]
                             for f in result["fixes"]], left=2))

    if result.get("remedies"):
        parts.append("<h2>Whole-model remedies (equalization, bias correction, AdaRound)</h2>")
        parts.append(_table(["remedy", "top-1", "change", "seconds"],
                            [[r["remedy"], f"{r['top1']:.2f}%", f"{r['delta']:+.2f}", f"{r['seconds']:.1f}"]
                             for r in result["remedies"]], left=1))

    if s:
        parts.append("<h2>Mixed-precision search</h2>")
        state = "reached" if s["reached"] else "not reached"
        fq = f" (npuforge fake-quant: {s['top1_fake_quant']:.2f}%)" if "top1_fake_quant" in s else ""
        parts.append(f"<p>Target: top-1 within {s['target_drop']} points of FP32 (&ge; {s['goal_top1']:.2f}%): "
                     f"<b>{state}</b>, top-1 {s['top1']:.2f}%{fq}, {len(s['changes'])} layer(s) changed, "
                     f"{s['evaluations']} configurations evaluated.</p>")
        if s["changes"]:
            parts.append(_table(["layer", "now"], [[n, f] for n, f in s["changes"].items()]))

    parts.append("<h2>Worst layers in detail</h2>")
    for name, d in result["details"].items():
        x = by_name[name]
        parts.append(f"<h3>#{x['rank']} {escape(name)} ({escape(x['op'])})</h3><div class=\"grid\">")
        w = d.get("weights")
        if w:
            parts.append(svg.weight_ranges(w["min"], w["max"], d.get("weight_clip"),
                                           f"weights per output channel: {name}"))
        if d.get("histogram"):
            parts.append(svg.histogram(d["histogram"], f"output activation: {name}"))
        parts.append("</div>")
        if w:
            parts.append(f'<p class="note">{w["channels"]} output channels; largest channel range '
                         f'{w["range_spread"]}x the median; {w["outlier_channels"]} outlier channel(s) (&gt; 4x the '
                         f'median), {w["outlier_weights"]} weight(s) beyond 6 standard deviations; weight SQNR '
                         f'{w["sqnr_per_tensor_db"]:.1f} dB per tensor, {w["sqnr_per_channel_db"]:.1f} dB per '
                         f'channel.</p>')

    parts.append("<h2>Timings</h2>")
    parts.append(_table(["step", "seconds"], [[k, v] for k, v in result["timings"].items()] +
                        [["total", result["seconds"]]]))
    data = escape(json.dumps({k: v for k, v in result.items() if k != "details"}))
    parts.append(f'<details><summary>result JSON</summary><pre style="font-size:11px">{data}</pre></details>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>npuforge analysis: '
            f'{escape(str(result.get("model", "")))}</title><style>{CSS}</style></head><body>'
            + "\n".join(parts) + "</body></html>\n")


def write_report(result: dict, path: Path) -> None:
    write_atomic(Path(path), render(result).encode("utf-8"))
