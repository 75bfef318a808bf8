"""Small inline SVG charts (no plotting library, nothing fetched): a line chart, bar
charts, per-channel weight ranges and a histogram with its clipping range."""

from __future__ import annotations

import math
from html import escape

W, H = 760, 260
L, R, T, B = 56, 16, 16, 40  # margins

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd")


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _index_ticks(n: int) -> list[int]:
    """Integer ticks over 0..n-1 for a layer or channel axis."""
    return sorted({int(round(t)) for t in _nice_ticks(0, max(n - 1, 1), 8) if t <= n - 1} | {0})


def _fmt(v: float) -> str:
    return f"{v:.3g}"


class _Frame:
    def __init__(self, x0, x1, y0, y1, width=W, height=H):
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.w, self.h = width, height

    def x(self, v):
        return L + (v - self.x0) / (self.x1 - self.x0) * (self.w - L - R)

    def y(self, v):
        return self.h - B - (v - self.y0) / (self.y1 - self.y0) * (self.h - T - B)

    def axes(self, xlabel: str, ylabel: str, xticks=None) -> list[str]:
        out = [f'<rect x="{L}" y="{T}" width="{self.w - L - R}" height="{self.h - T - B}" fill="#fafafa" '
               f'stroke="#999"/>']
        for t in _nice_ticks(self.y0, self.y1):
            y = self.y(t)
            out.append(f'<line x1="{L}" x2="{self.w - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                       f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        for t in (xticks if xticks is not None else _nice_ticks(self.x0, self.x1, 8)):
            x = self.x(t)
            out.append(f'<text x="{x:.1f}" y="{self.h - B + 14}" text-anchor="middle">{_fmt(t)}</text>')
        out.append(f'<text x="{(L + self.w - R) / 2}" y="{self.h - 6}" text-anchor="middle">{escape(xlabel)}</text>')
        out.append(f'<text x="12" y="{(T + self.h - B) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 12 {(T + self.h - B) / 2})">{escape(ylabel)}</text>')
        return out


def _svg(body: list[str], width=W, height=H, title: str = "") -> str:
    t = f"<title>{escape(title)}</title>" if title else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">{t}' + "".join(body) + "</svg>")


def _legend(names, x=L + 8, y=T + 14) -> list[str]:
    out = []
    for i, name in enumerate(names):
        yy = y + 14 * i
        out.append(f'<rect x="{x}" y="{yy - 8}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>'
                   f'<text x="{x + 14}" y="{yy + 1}">{escape(name)}</text>')
    return out


def line_chart(series: dict, xlabel: str, ylabel: str, title: str = "", labels: list | None = None) -> str:
    """series: name -> list of y (x = index). ``labels``: a tooltip per point."""
    ys = [v for s in series.values() for v in s if v is not None]
    n = max((len(s) for s in series.values()), default=1)
    f = _Frame(0, max(n - 1, 1), min(ys + [0.0]), max(ys + [1.0]) * 1.05)
    body = f.axes(xlabel, ylabel, xticks=_index_ticks(n))
    for i, (name, s) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{f.x(k):.1f},{f.y(v):.1f}" for k, v in enumerate(s) if v is not None)
        body.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        for k, v in enumerate(s):
            if v is not None:
                tip = f"{labels[k]}: " if labels else ""
                body.append(f'<circle cx="{f.x(k):.1f}" cy="{f.y(v):.1f}" r="2.2" fill="{color}">'
                            f'<title>{escape(tip)}{escape(name)} {v:.1f}</title></circle>')
    body += _legend(list(series), y=H + 8)  # below the axes, clear of the data
    return _svg(body, height=H + 14 * len(series) + 4, title=title)


def bar_chart(values: list[float], xlabel: str, ylabel: str, title: str = "", labels: list | None = None,
              highlight: set | None = None) -> str:
    f = _Frame(-0.5, len(values) - 0.5, 0.0, max(values + [1e-9]) * 1.05)
    body = f.axes(xlabel, ylabel, xticks=_index_ticks(len(values)))
    bw = max(1.0, (W - L - R) / max(len(values), 1) * 0.8)
    for k, v in enumerate(values):
        color = COLORS[1] if highlight and k in highlight else COLORS[0]
        tip = f"{labels[k]}: " if labels else ""
        body.append(f'<rect x="{f.x(k) - bw / 2:.1f}" y="{f.y(v):.1f}" width="{bw:.1f}" '
                    f'height="{max(0.0, f.y(0) - f.y(v)):.1f}" fill="{color}"><title>{escape(tip)}{v:.4g}'
                    f'</title></rect>')
    return _svg(body, title=title)


def hbar_chart(rows: list[tuple[str, float]], xlabel: str, refs: dict, title: str = "") -> str:
    """Horizontal bars (label, value) with dashed vertical reference lines {name: value}."""
    left, top = 320, T + 14 * len(refs) + 6
    height = top + 18 * len(rows) + 10 + B
    vals = [v for _, v in rows] + list(refs.values())
    lo, hi = min(vals) - 1.0, max(vals) + 0.5
    span = W - left - R
    x = lambda v: left + (v - lo) / (hi - lo) * span  # noqa: E731
    bottom = height - B
    body = [f'<rect x="{left}" y="{top}" width="{span}" height="{bottom - top}" fill="#fafafa" stroke="#999"/>']
    for t in _nice_ticks(lo, hi, 6):
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}" stroke="#e0e0e0"/>'
                    f'<text x="{x(t):.1f}" y="{bottom + 14}" text-anchor="middle">{_fmt(t)}</text>')
    for i, (label, v) in enumerate(rows):
        y = top + 6 + 18 * i
        body.append(f'<text x="{left - 6}" y="{y + 11}" text-anchor="end">{escape(label)}</text>'
                    f'<rect x="{left}" y="{y}" width="{max(0.0, x(v) - left):.1f}" height="13" '
                    f'fill="{COLORS[0]}"/><text x="{x(v) + 4:.1f}" y="{y + 11}">{v:.2f}</text>')
    for i, (name, v) in enumerate(refs.items()):
        color = COLORS[(i + 1) % len(COLORS)]
        body.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top}" y2="{bottom}" stroke="{color}" '
                    f'stroke-width="2" stroke-dasharray="5,3"/>'
                    f'<rect x="{left}" y="{T + 14 * i - 8}" width="10" height="10" fill="{color}"/>'
                    f'<text x="{left + 14}" y="{T + 14 * i + 1}">{escape(name)} {v:.2f}</text>')
    body.append(f'<text x="{left + span / 2}" y="{height - 6}" text-anchor="middle">{escape(xlabel)}</text>')
    return _svg(body, height=height, title=title)


def weight_ranges(mins: list[float], maxs: list[float], clip: float | None, title: str = "") -> str:
    """One vertical bar per output channel from its min to its max weight; dashed: +-clip."""
    peak = max([abs(v) for v in mins + maxs] + [clip or 0.0, 1e-12]) * 1.05
    f = _Frame(-0.5, len(mins) - 0.5, -peak, peak)
    body = f.axes("output channel", "weight", xticks=_index_ticks(len(mins)))
    bw = max(1.0, (W - L - R) / max(len(mins), 1) * 0.7)
    for k, (a, b) in enumerate(zip(mins, maxs)):
        body.append(f'<rect x="{f.x(k) - bw / 2:.1f}" y="{f.y(b):.1f}" width="{bw:.1f}" '
                    f'height="{max(0.5, f.y(a) - f.y(b)):.1f}" fill="{COLORS[0]}"><title>channel {k}: '
                    f'[{a:.4g}, {b:.4g}]</title></rect>')
    if clip:
        for v in (clip, -clip):
            body.append(f'<line x1="{L}" x2="{W - R}" y1="{f.y(v):.1f}" y2="{f.y(v):.1f}" stroke="{COLORS[1]}" '
                        f'stroke-dasharray="5,3"/>')
    body += _legend(["channel min..max"] + ([f"per-tensor int8 weight range +-{clip:.3g} (as quantized)"]
                                            if clip else []))
    return _svg(body, title=title)


def histogram(h: dict, title: str = "") -> str:
    """Counts (log scale) over the observed range, with the clipping range shaded."""
    counts = h["counts"]
    start, width = h["start"], h["bin_width"]
    end = start + width * len(counts)
    lo = min(start, h["clip"][0])
    hi = max(end, h["clip"][1])
    logs = [math.log10(c + 1) for c in counts]
    f = _Frame(lo, hi, 0.0, max(logs + [1.0]) * 1.05)
    body = f.axes("activation value", "log10(count + 1)")
    c0, c1 = max(lo, h["clip"][0]), min(hi, h["clip"][1])
    body.append(f'<rect x="{f.x(c0):.1f}" y="{T}" width="{max(0.0, f.x(c1) - f.x(c0)):.1f}" height="{H - T - B}" '
                f'fill="#2ca02c" fill-opacity="0.12"/>')
    for k, v in enumerate(logs):
        x0, x1 = f.x(start + k * width), f.x(start + (k + 1) * width)
        body.append(f'<rect x="{x0:.1f}" y="{f.y(v):.1f}" width="{max(0.5, x1 - x0 - 0.3):.1f}" '
                    f'height="{max(0.0, f.y(0) - f.y(v)):.1f}" fill="{COLORS[0]}"/>')
    for v in h["clip"]:
        body.append(f'<line x1="{f.x(v):.1f}" x2="{f.x(v):.1f}" y1="{T}" y2="{H - B}" stroke="{COLORS[1]}" '
                    f'stroke-width="2"/>')
    body += _legend(["calibration histogram", f"{h['dtype']} clipping range [{h['clip'][0]:.3g}, {h['clip'][1]:.3g}]"])
    return _svg(body, title=title)
