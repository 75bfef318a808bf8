"""The terminal form of an analysis: the ranked table, what explains the drop, fixes, search."""

from __future__ import annotations


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


def format_table(result: dict, top: int = 15) -> str:
    lines = []
    cfg = result["config"]
    lines.append(f"{result.get('model', 'model')}: {cfg['granularity']} weights, {cfg['method']} observer, "
                 f"{result['calibration_images']} calibration / {result['evaluation_images']} evaluation images")
    lines.append(f"top-1 FP32 {result['fp32_top1']:.2f}%  int8 {result['int8_top1']:.2f}%  "
                 f"drop {result['drop']:.2f} points; network output SQNR {result['output']['sqnr_db']:.1f} dB, "
                 f"cosine {result['output']['cosine']:.4f}")
    layers = {layer["name"]: layer for layer in result["layers"]}
    width = min(44, max(len(n) for n in layers))
    lines.append("")
    lines.append(f"layers ranked by their share of the network-output error (isolated; per-layer errors on "
                 f"{result['analysis_images']} images)")
    lines.append(f"{'#':>3}  {'layer':<{width}}  {'op':<17}  {'cum dB':>6}  {'iso dB':>6}  {'cosine':>6}  "
                 f"{'out dB':>6}  {'share':>6}  weights (spread, dB per-tensor/channel)")
    for name in result["ranking"][:top]:
        layer = layers[name]
        w = layer["weights"]
        wtext = f"{w['range_spread']:.1f}x, {w['sqnr_per_tensor_db']:.1f}/{w['sqnr_per_channel_db']:.1f}" if w else ""
        lines.append(f"{layer['rank']:>3}  {_short(name, width):<{width}}  {layer['op']:<17}  "
                     f"{layer['sqnr_db']:>6.1f}  {layer['isolated_sqnr_db']:>6.1f}  {layer['cosine']:>6.3f}  "
                     f"{layer['output_sqnr_db']:>6.1f}  {100 * layer['drop_share']:>5.1f}%  {wtext}")
    for m in result.get("int16_concats", []):
        (wn, wl, wh), (nn, nl, nh) = m["wide"], m["narrow"]
        lines.append(f"Concat {m['node']}: input ranges differ {m['ratio']:.0f}x ({wn} [{wl:.4g}, {wh:.4g}], "
                     f"{nn} [{nl:.4g}, {nh:.4g}]; {m['codes']:.1f} codes of a shared 8-bit grid): quantized in int16")
    if result["explained"]:
        lines.append("")
        lines.append("the worst layers kept in float:")
        for e in result["explained"]:
            rec = f", {100 * e['recovered']:.0f}% of the drop recovered" if e["recovered"] is not None else ""
            lines.append(f"  top {e['layers']:>2}: top-1 {e['top1']:.2f}%{rec} "
                         f"({100 * e['output_noise_share']:.0f}% of the output error)")
    if result["fixes"]:
        lines.append("")
        lines.append("fixes tried (one layer at a time):")
        for f in result["fixes"]:
            lines.append(f"  {_short(f['layer'], width):<{width}}  {f['fix']:<20}  top-1 {f['top1']:.2f}% "
                         f"({f['delta']:+.2f})")
    if result.get("remedies"):
        lines.append("")
        lines.append("whole-model remedies (npuforge quantize flags):")
        for r in result["remedies"]:
            lines.append(f"  {r['remedy']:<40}  top-1 {r['top1']:.2f}% ({r['delta']:+.2f}), {r['seconds']:.0f} s")
    s = result.get("search")
    if s:
        lines.append("")
        changes = s["changes"]
        kinds = {k: sum(1 for f in changes.values() if f == k) for k in ("int16", "float")}
        state = "reached" if s["reached"] else "NOT reached"
        lines.append(f"search (target drop {s['target_drop']}: top-1 >= {s['goal_top1']:.2f}%): {state} with "
                     f"{len(changes)} layer(s) changed ({kinds['int16']} int16, {kinds['float']} float), top-1 "
                     f"{s['top1']:.2f}%" + (f" (fake-quant {s['top1_fake_quant']:.2f}%)" if "top1_fake_quant" in s
                                           else "") + f", {s['evaluations']} evaluations")
        for node, fix in changes.items():
            lines.append(f"  {node}: {fix}")
    if result.get("written"):
        lines.append(f"wrote {result['written']} (and its .safetensors and QDQ .onnx)")
    if result.get("report"):
        lines.append(f"wrote {result['report']}")
    lines.append(f"({result['seconds']:.0f} s, {result['evaluations']} top-1 evaluations)")
    return "\n".join(lines)
