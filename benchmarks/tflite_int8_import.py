"""Int8 .tflite files as TensorFlow's converter writes them (scripts/make_converter_models.py, in a
TensorFlow venv of its own) imported into npuforge's quantized IR, beside LiteRT.

Per file, one row: the import (or the one line it fails with), the ops the IR has, and the
integer simulator's output codes against LiteRT's reference kernels, and against its default ones,
on --runs seeded int8 inputs (uniform over all 256 codes; integer ids from 0 to 7): how many codes
differ and by how much at most (LiteRT's reference int8 SUM does not compute a sum: a model with one
agrees with the default kernels only). An int8 file's
import is exact by design (each node gets LiteRT's integers), so every differing code is a
defect of npuforge's or a LiteRT behaviour it does not model.

    .venv/bin/python benchmarks/tflite_int8_import.py DIR [--runs 3] [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from npuforge.export.litert_check import interpreter, run_litert
from npuforge.frontend.tflite_importer import import_tflite
from npuforge.sim.integer import IntegerSimulator


def check(path: Path, runs: int) -> dict:
    row = {"model": path.stem}
    t = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph = import_tflite(path)
    except Exception as e:  # the benchmark reports any failure as its row
        row["import"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    row["import"] = f"ok ({time.perf_counter() - t:.1f} s)" + "".join(f"; warning: {w.message}" for w in caught)
    row["ops"] = ", ".join(f"{op} {n}" for op, n in Counter(n.op for n in graph.nodes).most_common())
    model = path.read_bytes()
    sim = IntegerSimulator(graph)
    for key, reference in (("codes", True), ("codes_default", False)):
        row[key] = compare(graph, sim, interpreter(model, reference), runs)
    return row


def compare(graph, sim, it, runs: int) -> str:
    """How many output codes of the integer simulator differ from LiteRT's (interpreter ``it``)."""
    differ, total, worst = 0, 0, 0
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        codes = [rng.integers(-128, 128, d["shape"]).astype(d["dtype"]) if d["dtype"] == np.int8 else
                 rng.integers(0, 8, d["shape"]).astype(d["dtype"])  # token ids: the first rows of a table
                 for d in it.get_input_details()]
        feeds = {name: c.transpose(0, 3, 1, 2) if c.ndim == 4 else c for name, c in zip(graph.inputs, codes)}
        try:
            ours = sim.run(feeds, dequantize=False)
            theirs = run_litert(it, list(feeds.values()))
        except Exception as e:  # the benchmark reports any failure as its row
            return f"{type(e).__name__}: {str(e).splitlines()[0]}"
        for name, ref in zip(graph.outputs, theirs):
            d = np.abs(ours[name].astype(np.int64) - ref.astype(np.int64))
            differ, total, worst = differ + int((d > 0).sum()), total + d.size, max(worst, int(d.max()))
    return f"{differ} of {total} differ" + (f" (at most {worst})" if differ else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args()
    rows = []
    for path in sorted(args.dir.glob("*.tflite")):
        rows.append(check(path, args.runs))
        print(" | ".join(str(rows[-1].get(k, "-")) for k in ("model", "import", "codes", "codes_default", "ops")),
              flush=True)
    if args.markdown:
        lines = ["| model | import | integer simulator vs LiteRT (reference kernels) | vs LiteRT (default kernels) "
                 "| IR ops |", "|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['import']} | {r.get('codes', '-')} | {r.get('codes_default', '-')} | "
                  f"{r.get('ops', '-')} |" for r in rows]
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
