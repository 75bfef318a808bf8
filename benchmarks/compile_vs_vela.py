"""NPU compilation: npuforge's compiler against Arm's Vela (ethos-u-vela 5.2.0), side by side.

For each model: one quantized IR (`npuforge quantize --activation-dtype int8
--tflite-multipliers`, the first --num-calib images of --data), its full-integer int8 TFLite
export (`npuforge export --format tflite`), and four compilations of that same network:

  npuforge            compile_graph(target npu256, sram=--sram, tolerance=0.01)
  npuforge untiled    compile_graph(target npu256, sram=1 << 30, tolerance=0): no cascades
  Vela Performance    vela --accelerator-config ethos-u55-256 --config Arm/vela.ini
                      --system-config Ethos_U55_High_End_Embedded --memory-mode Shared_Sram
                      --optimise Performance --arena-cache-size --sram
  Vela Size           the same with --optimise Size (Vela ignores --arena-cache-size then)

Figures: SRAM peak (npuforge's memory plan; Vela's "Total SRAM used"), off-chip traffic
(npuforge: weights + parameter blocks read from DRAM; Vela: total off-chip flash bytes read,
weights and scales), SRAM traffic, cycles (npuforge: sum over commands of max(compute,
transfer) + overhead, see npuforge/compiler/cycles.py; Vela: cycles_total and cycles_npu of
its summary CSV), time at 500 MHz, weight bytes stored (npuforge: encoded weights; Vela:
total_npu_encoded_weights), compile time (npuforge: compile_graph; Vela: the subprocess's
wall clock, Python start-up included) and operators on the NPU / CPU. Both are estimates.

Both tools run at 500 MHz, but Vela's bundled Ethos_U55_High_End_Embedded system has
8 B/cycle SRAM and 1 B/cycle off-chip flash, while npu256 has 16 and 8 B/cycle;
--vela-matched gives Vela a config with npu256's clock, bandwidths, latency and burst.

    .venv/bin/pip install ethos-u-vela==5.2.0      # or in its own venv, then --vela VENV/bin/vela
    .venv/bin/python benchmarks/compile_vs_vela.py --models efficientnet_lite0,mobilenet_v2

The NPU / CPU split over exports (--exports DIR: every DIR/NAME.tflite that
`benchmarks/model_sweep.py --export-dir DIR` wrote, with the quantized IR it came from,
DIR/NAME.tflite.nfir). Per model, models one at a time:

  npuforge            compile_graph(NAME.tflite.nfir, target npu256 / npu1k, the target's SRAM):
                      the NPU's share of the MACs, IR operations on the NPU / on the host CPU
                      (stats cpu_ops, by IR op type), NPU / CPU commands, compile seconds
  Vela                vela NAME.tflite --config Arm/vela.ini, with
                      ethos-u55-256: Ethos_U55_High_End_Embedded, Shared_Sram (the U55 has no
                                     Dedicated_Sram mode)
                      ethos-u85-256: Ethos_U85_SYS_DRAM_Mid, Dedicated_Sram_384KB (the bundled
                                     vela.ini's U85 systems are Ethos_U85_SYS_Flash_Low / _High and
                                     _DRAM_Low / _Mid / _High; the system config and memory mode
                                     change Vela's schedule, not which operators it supports)

Vela's split is counted in TFLite operators, from the files: Vela's output NAME_vela.tflite keeps
every CPU operator as an ordinary TFLite operator and replaces each NPU subgraph by one `ethos-u`
custom operator, so CPU ops = the output's operators other than `ethos-u` (by type), NPU ops = the
input's operators - CPU ops, NPU subgraphs = the `ethos-u` operators. Vela's own printed
"CPU / NPU operators = N" lines count its internal operators after its graph rewrites (one TFLite
op may become several) and are kept in the JSON beside the counts from the files, with the reasons
of its "Warning (supported operators)" lines and any other message it writes before its summary.
(Vela 5.2 compiles both accelerators with its C++ core, regor. --show-cpu-operations is not used:
with it Vela rebuilds the counts from a debug database, and on the U85 that list names LUT GATHERs
as CPU operators that regor's own count and the output file run on the NPU.) A Vela or npuforge
failure is a result with its one-line message. npuforge counts IR operations, Vela TFLite operators:
the two units differ (a TFLite export spells some IR ops in several operators and the reverse).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compile_vs_vela.py --exports DIR \
        --vela VELA_VENV/bin/vela --markdown split.md --json split.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import npuforge
from npuforge.cli import main as npuforge_main
from npuforge.compiler.compile import compile_graph
from npuforge.compiler.target import load_target

REPO = Path(__file__).resolve().parents[1]
SYSTEM = "Ethos_U55_High_End_Embedded"
COLUMNS = ("npuforge", "npuforge untiled", "Vela Performance", "Vela Size")
VELA = [sys.executable, "-m", "ethosu.vela"]  # main() replaces it with --vela where given
EXPORT_TARGETS = ("npu256", "npu1k")
# accelerator, its system config and memory mode in Vela's bundled Arm/vela.ini, the label in tables
VELA_SPLITS = (("ethos-u55-256", "Ethos_U55_High_End_Embedded", "Shared_Sram", "Vela U55-256"),
               ("ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram_384KB", "Vela U85-256"))


def cli(argv: list[str]) -> str:
    """Run an npuforge command in-process; its output, or SystemExit with it on failure."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = npuforge_main(argv)
    if rc:
        sys.exit(f"npuforge {' '.join(argv)} failed ({rc}):\n{out.getvalue()}")
    return out.getvalue()


def matched_ini(path: Path) -> str:
    """A Vela system config with npu256's clock and bandwidths (U55 AXI ports are 8 B/cycle)."""
    t = load_target("npu256")
    path.write_text(
        "[System_Config.npu256_matched]\n"
        f"core_clock={t.clock_mhz * 1e6}\naxi0_port=Sram\naxi1_port=OffChipFlash\n"
        f"Sram_clock_scale={t.sram_bytes_per_cycle / 8}\nSram_burst_length=32\n"
        "Sram_read_latency=32\nSram_write_latency=32\nSram_max_reads=4\nSram_max_writes=4\n"
        f"OffChipFlash_clock_scale={t.dram_bytes_per_cycle / 8}\n"
        f"OffChipFlash_burst_length={t.dram_burst_bytes}\nOffChipFlash_read_latency={t.dram_latency_cycles}\n"
        "OffChipFlash_write_latency=0\nOffChipFlash_max_reads=2\nOffChipFlash_max_writes=0\n\n"
        "[Memory_Mode.Shared_Sram]\nconst_mem_area=Axi1\narena_mem_area=Axi0\ncache_mem_area=Axi0\n")
    return "npu256_matched"


def run_vela(tflite: Path, out_dir: Path, optimise: str, sram: int, config: str, system: str) -> dict:
    cmd = [*VELA, str(tflite), "--accelerator-config", "ethos-u55-256",
           "--config", config, "--system-config", system, "--memory-mode", "Shared_Sram",
           "--optimise", optimise, "--arena-cache-size", str(sram), "--output-dir", str(out_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"vela failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    with open(out_dir / f"{tflite.stem}_summary_{system}.csv", newline="") as f:
        row = next(csv.DictReader(f))
    ops = {k: int(v) for k, v in re.findall(r"^(CPU|NPU) operators = (\d+)", proc.stdout, re.M)}
    return {
        "sram_peak": round(float(row["sram_memory_used"]) * 1024),
        "offchip_bytes": int(row["off_chip_flash_total_bytes"]) + int(row["dram_total_bytes"]),
        "sram_traffic": int(row["sram_total_bytes"]),
        "cycles": int(row["cycles_total"]),
        "cycles_npu": int(row["cycles_npu"]),
        "ms": float(row["inference_time"]) * 1e3,
        "weights_stored": int(row["total_npu_encoded_weights"]),
        "weights_raw": int(row["total_original_weights"]),
        "macs": int(row["nn_macs"]),
        "compile_s": seconds,
        "npu_ops": ops.get("NPU"), "cpu_ops": ops.get("CPU"),
        "notes": [line for line in proc.stdout.splitlines() if line.startswith("Warning")],
    }


def run_npuforge(nfir: Path, sram: int, tolerance: float) -> dict:
    s = compile_graph(npuforge.load(str(nfir)), load_target("npu256"), sram=sram, tolerance=tolerance).stats
    return {"sram_peak": s["peak_sram"], "offchip_bytes": s["dram_bytes"], "sram_traffic": s["sram_traffic_bytes"],
            "cycles": s["cycles"], "cycles_npu": None, "ms": s["milliseconds"],
            "weights_stored": s["weight_bytes_stored"], "weights_raw": s["weight_bytes_raw"], "macs": s["macs"],
            "compile_s": s["compile_seconds"], "npu_ops": s["operations"], "cpu_ops": 0,
            "commands": s["commands"], "cascades": len(s["cascades"])}


def bench(model: str, args, work: Path, vela_config: str, vela_system: str) -> dict:
    nfir, tflite = work / f"{model}.nfir", work / f"{model}.tflite"
    t0 = time.perf_counter()
    cli(["quantize", model, "--calib", str(args.data), "--num-calib", str(args.num_calib),
         "--activation-dtype", "int8", "--tflite-multipliers", "--quiet", "-o", str(nfir)])
    quantize_s = time.perf_counter() - t0
    exported = cli(["export", str(nfir), "--format", "tflite", "-o", str(tflite)])
    tflite_ops = exported.strip().splitlines()[-1].split("): ", 1)[-1]
    cols = {"npuforge": run_npuforge(nfir, args.sram, 0.01),
            "npuforge untiled": run_npuforge(nfir, 1 << 30, 0.0)}
    for opt in ("Performance", "Size"):
        cols[f"Vela {opt}"] = run_vela(tflite, work / f"vela_{model}_{opt}", opt, args.sram, vela_config, vela_system)
    return {"model": model, "quantize_s": round(quantize_s, 1), "tflite_ops": tflite_ops, "columns": cols}


def kib(v):
    return f"{v / 1024:,.1f}"


ROWS = (("SRAM peak, KiB", "sram_peak", kib), ("off-chip traffic (DRAM / flash), KiB", "offchip_bytes", kib),
        ("SRAM traffic, KiB", "sram_traffic", kib), ("cycles, total", "cycles", "{:,}".format),
        ("cycles, NPU compute (Vela cycles_npu)", "cycles_npu", "{:,}".format),
        ("time at 500 MHz, ms", "ms", "{:.3f}".format), ("weights stored, KiB", "weights_stored", kib),
        ("weights raw, KiB", "weights_raw", kib), ("MACs, millions", "macs", lambda v: f"{v / 1e6:.2f}"),
        ("compile time, s", "compile_s", "{:.2f}".format), ("ops on NPU", "npu_ops", str), ("ops on CPU", "cpu_ops", str))


def print_table(r: dict, sram: int, labels: tuple) -> None:
    cols = r["columns"]
    print(f"\n{r['model']}  (quantized in {r['quantize_s']} s; TFLite: {r['tflite_ops']})")
    width = max(len(name) for name, _, _ in ROWS) + 2
    print("".join([" " * width] + [f"{c:>20}" for c in labels]))
    for name, key, fmt in ROWS:
        cells = ["-" if cols[c].get(key) is None else fmt(cols[c][key]) for c in COLUMNS]
        print(f"{name:<{width}}" + "".join(f"{c:>20}" for c in cells))
    nf = cols["npuforge"]
    for key, name in (("sram_peak", "SRAM peak"), ("offchip_bytes", "off-chip traffic"), ("cycles", "cycles")):
        ratios = ", ".join(f"{nf[key] / cols[c][key]:.2f} vs {c}" for c in COLUMNS[2:])
        print(f"  npuforge / Vela, {name}: {ratios}")
    print(f"  npuforge: {nf['commands']} commands, {nf['cascades']} cascades under {sram} B")
    for c in COLUMNS[2:]:
        for note in cols[c]["notes"]:
            print(f"  {c}: {note}")


# -- the NPU / CPU split over a directory of exports (--exports) ------------------------------------

def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def tflite_ops(path: Path) -> dict:
    """Operators of a .tflite file's main subgraph, by type: builtin names, a custom operator as
    its custom code (Vela's NPU subgraphs are `ethos-u`). Checked by npuforge's flatbuffer walker first."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator

    from npuforge.frontend.tflite_verify import verify_model

    names = {code: name for name, code in vars(BuiltinOperator).items() if not name.startswith("_")}
    buf = path.read_bytes()
    verify_model(buf, str(path))
    model = tflite.Model.GetRootAsModel(buf, 0)
    sg, ops = model.Subgraphs(0), {}
    for k in range(sg.OperatorsLength()):
        code_table = model.OperatorCodes(sg.Operators(k).OpcodeIndex())
        code = max(code_table.BuiltinCode(), code_table.DeprecatedBuiltinCode())
        if code == BuiltinOperator.CUSTOM:
            custom = code_table.CustomCode()
            name = custom.decode("utf-8", "replace") if custom else "CUSTOM"
        else:
            name = names.get(code, f"builtin {code}")
        ops[name] = ops.get(name, 0) + 1
    return dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def npuforge_split(nfir: Path, target: str) -> dict:
    """compile_graph on the target with its own SRAM: where the MACs and the IR operations run."""
    try:
        s = compile_graph(npuforge.load(str(nfir)), load_target(target)).stats
    except Exception as e:  # a compile failure is a result, not a crash
        return {"error": one_line(f"{type(e).__name__}: {e}")}
    cpu = sum(s["cpu_ops"].values())
    return {"npu_macs_fraction": s["npu_macs_fraction"], "macs": s["macs"], "cpu_macs": s["cpu_macs"],
            "npu_ops": s["operations"] - cpu, "cpu_ops": cpu, "cpu_op_types": s["cpu_ops"],
            "npu_commands": s["commands"] - s["cpu_commands"], "cpu_commands": s["cpu_commands"],
            "cascades": len(s["cascades"]) if isinstance(s["cascades"], list) else s["cascades"],
            "peak_sram": s["peak_sram"], "cycles": s["cycles"], "compile_s": s["compile_seconds"]}


def vela_failure(proc) -> str:
    """Vela's one-line message: its "Error: ..." line, else the last line it wrote (a traceback's)."""
    lines = [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lstrip().startswith("Error")]
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return one_line(errors[0] if errors else err_lines[-1] if err_lines else lines[-1] if lines
                    else f"exit status {proc.returncode}, no output")


def vela_split(tflite: Path, input_ops: dict | None, out_dir: Path, accel: str, system: str, mode: str,
               timeout: float) -> dict:
    """Vela on one export; its NPU / CPU split counted from the input and output flatbuffers. (Without
    --show-cpu-operations: with it, Vela 5.2 rebuilds its CPU / NPU counts from a debug database and on
    the U85 names as CPU operators LUT GATHERs that regor's own count and the output file run on the NPU.)"""
    cmd = [*VELA, str(tflite), "--accelerator-config", accel, "--config", "Arm/vela.ini", "--system-config", system,
           "--memory-mode", mode, "--output-dir", str(out_dir)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s", "seconds": round(time.perf_counter() - t0, 2)}
    r = {"seconds": round(time.perf_counter() - t0, 2)}
    out = out_dir / f"{tflite.stem}_vela.tflite"
    if proc.returncode or not out.exists():
        r["error"] = vela_failure(proc) if proc.returncode else f"no {out.name} written"
        return r
    text = proc.stdout + "\n" + proc.stderr
    # Vela's own figures, in its internal operators (after its rewrites)
    r["vela_printed"] = {k.lower(): int(v) for k, v in re.findall(r"^(CPU|NPU) operators = (\d+)", text, re.M)}
    # why operators stay on the CPU: "Warning (supported operators) operator: OP, ofm: ...\nReason: ..." pairs,
    # and any other line Vela writes before its summary (e.g. a semantic check's message), counted
    diagnostics = proc.stdout.split("\nNetwork summary for")[0] + "\n" + proc.stderr
    reasons: dict = {}
    pair = r"^Warning \(supported operators\) operator: (\S+?),.*\n\s*Reason: (.*)$"
    for op, why in re.findall(pair, diagnostics, re.M):
        reasons.setdefault(op, {})
        reasons[op][why.strip()] = reasons[op].get(why.strip(), 0) + 1
    r["unsupported_reasons"] = reasons
    messages: dict = {}
    for line in re.sub(pair, "", diagnostics, flags=re.M).splitlines():
        if line.strip():
            messages[line.strip()] = messages.get(line.strip(), 0) + 1
    r["messages"] = messages
    try:
        output_ops = tflite_ops(out)
    except Exception as e:
        r["error"] = one_line(f"reading {out.name}: {type(e).__name__}: {e}")
        return r
    subgraphs = output_ops.pop("ethos-u", 0)
    cpu = sum(output_ops.values())
    r.update({"npu_subgraphs": subgraphs, "cpu_ops": cpu, "cpu_op_types": output_ops})
    if input_ops is not None:
        r["npu_ops"] = sum(input_ops.values()) - cpu
        # a CPU operator Vela made itself (not one of the input's, or more of a type than the input has)
        made = {k: v - input_ops.get(k, 0) for k, v in output_ops.items() if v > input_ops.get(k, 0)}
        if made:
            r["cpu_ops_not_in_input"] = made
    shutil.rmtree(out_dir, ignore_errors=True)  # the optimised model: only its operator list is kept
    return r


def split_model(name: str, exports: Path, work: Path, timeout: float) -> dict:
    tfl = exports / f"{name}.tflite"
    r: dict = {"model": name}
    try:
        r["tflite_op_types"] = tflite_ops(tfl)
        r["tflite_ops"] = sum(r["tflite_op_types"].values())
    except Exception as e:
        r["tflite_error"] = one_line(f"{type(e).__name__}: {e}")
    nfir = exports / f"{name}.tflite.nfir"
    r["npuforge"] = {t: npuforge_split(nfir, t) if nfir.exists() else {"error": f"no {nfir.name}"}
                     for t in EXPORT_TARGETS}
    r["vela"] = {accel: vela_split(tfl, r.get("tflite_op_types"), work / f"{name}_{accel}", accel, system, mode,
                                   timeout) for accel, system, mode, _ in VELA_SPLITS}
    return r


def pct(fraction: float) -> str:
    """A share in percent, rounded down: 100 % only when it is all."""
    return "100 %" if fraction >= 1 else f"{math.floor(fraction * 1000) / 10:.1f} %"


def types_cell(types: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in types.items()) if types else "-"


def failed_cell(r: dict) -> str:
    return "fails: " + one_line(r["error"], 120).replace("|", "/")


def npuforge_cell(r: dict) -> str:
    return failed_cell(r) if "error" in r else f"{pct(r['npu_macs_fraction'])}, {r['npu_ops']} / {r['cpu_ops']}"


def vela_cell(r: dict) -> str:
    if "error" in r:
        return failed_cell(r)
    npu = "?" if r.get("npu_ops") is None else r["npu_ops"]
    return f"{npu} / {r['cpu_ops']} ({r['npu_subgraphs']})"


def split_rows(results: list) -> list:
    rows = []
    for r in results:
        row = [r["model"], str(r.get("tflite_ops", "unreadable"))]
        for t in EXPORT_TARGETS:
            c = r["npuforge"][t]
            row += [npuforge_cell(c), "" if "error" in c else types_cell(c["cpu_op_types"])]
        for accel, *_ in VELA_SPLITS:
            c = r["vela"][accel]
            row += [vela_cell(c), "" if "error" in c else types_cell(c["cpu_op_types"])]
        rows.append(row)
    return rows


def add_types(total: dict, types: dict) -> dict:
    for k, v in types.items():
        total[k] = total.get(k, 0) + v
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def split_summary(results: list) -> list[str]:
    n = len(results)
    lines = [f"{n} models, {sum(r.get('tflite_ops', 0) for r in results):,} TFLite operators in the exports."]
    for t in EXPORT_TARGETS:
        ok = [r["npuforge"][t] for r in results if "error" not in r["npuforge"][t]]
        macs, cpu_macs = sum(c["macs"] for c in ok), sum(c["cpu_macs"] for c in ok)
        types: dict = {}
        for c in ok:
            types = add_types(types, c["cpu_op_types"])
        lines.append(
            f"npuforge {t}: compiled {len(ok)} of {n}; all MACs on the NPU for "
            f"{sum(c['npu_macs_fraction'] >= 1 for c in ok)}, every operation for {sum(c['cpu_ops'] == 0 for c in ok)}; "
            f"{pct((macs - cpu_macs) / macs if macs else 1)} of all MACs on the NPU; operations NPU / CPU "
            f"{sum(c['npu_ops'] for c in ok):,} / {sum(c['cpu_ops'] for c in ok):,}; CPU op types: {types_cell(types)}; "
            f"compile {sum(c['compile_s'] for c in ok):.1f} s in all.")
    for accel, _, _, label in VELA_SPLITS:
        ok = [r["vela"][accel] for r in results if "error" not in r["vela"][accel]]
        types: dict = {}
        for c in ok:
            types = add_types(types, c["cpu_op_types"])
        same = sum(c.get("vela_printed", {}).get("cpu") == c["cpu_ops"] for c in ok)
        lines.append(
            f"{label}: compiled {len(ok)} of {n}; every operator on the NPU for {sum(c['cpu_ops'] == 0 for c in ok)}; "
            f"operators NPU / CPU {sum(c.get('npu_ops') or 0 for c in ok):,} / {sum(c['cpu_ops'] for c in ok):,} in "
            f"{sum(c['npu_subgraphs'] for c in ok):,} NPU subgraphs; CPU op types: {types_cell(types)}; "
            f"Vela's printed CPU operator count equals the output file's for {same} of {len(ok)}; "
            f"{sum(c['seconds'] for c in ok):.1f} s in all.")
    failures = [(r["model"], label, c["error"]) for r in results for label, c in
                [(f"npuforge {t}", r["npuforge"][t]) for t in EXPORT_TARGETS]
                + [(lab, r["vela"][a]) for a, _, _, lab in VELA_SPLITS] if "error" in c]
    lines += [f"Failure: {m}, {label}: {msg}" for m, label, msg in failures]
    return lines


def split_markdown(results: list, meta: dict) -> str:
    head = ["model", "TFLite ops"]
    for t in EXPORT_TARGETS:
        head += [f"npuforge {t}: NPU MACs, NPU / CPU ops", f"{t} CPU op types"]
    for _, _, _, label in VELA_SPLITS:
        head += [f"{label}: NPU / CPU ops (NPU subgraphs)", f"{label.split()[-1]} CPU op types"]
    vela = ", ".join(f"{a} ({system}, {mode})" for a, system, mode, _ in VELA_SPLITS)
    lines = [f"Exports in {meta['exports']}; npuforge {meta['npuforge']} on {' and '.join(EXPORT_TARGETS)} (each with "
             f"its own SRAM); Vela {meta['vela']}, Arm/vela.ini: {vela}. Cells: NPU / CPU operators (npuforge: IR "
             f"operations; Vela: TFLite operators, with its NPU subgraphs in brackets).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in split_rows(results)]
    return "\n".join(lines + [""] + [f"* {ln}" for ln in split_summary(results)]) + "\n"


def exports_main(args) -> int:
    names = sorted(p.name[:-len(".tflite")] for p in args.exports.glob("*.tflite"))
    if args.models:
        wanted = [m for m in args.models.split(",") if m]
        for m in wanted:
            if m not in names:
                print(f"no {m}.tflite in {args.exports}", file=sys.stderr)
        names = [n for n in names if n in wanted]
    if not names:
        print(f"no NAME.tflite in {args.exports}", file=sys.stderr)
        return 2
    version = subprocess.run([*VELA, "--version"], capture_output=True, text=True).stdout.strip()
    meta = {"exports": str(args.exports), "vela": version, "npuforge": npuforge.__version__,
            "vela_configs": [list(v[:3]) for v in VELA_SPLITS], "npuforge_targets": list(EXPORT_TARGETS)}
    results: list = []
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compile_vs_vela_")))
        work.mkdir(parents=True, exist_ok=True)
        for k, name in enumerate(names, 1):
            t0 = time.perf_counter()
            r = split_model(name, args.exports, work, args.vela_timeout)
            results.append(r)
            row = split_rows([r])[0]
            print(f"[{k}/{len(names)}] {name}: {time.perf_counter() - t0:.1f} s; TFLite ops {row[1]}; "
                  + "; ".join(f"{lab} {row[i]}" for i, lab in ((2, "npu256"), (4, "npu1k"), (6, "U55"), (8, "U85"))),
                  file=sys.stderr, flush=True)
            if args.json and args.json != "-":  # after every model: a long run's results survive an interruption
                Path(args.json).write_text(json.dumps({**meta, "models": results}, indent=1) + "\n")
    text = split_markdown(results, meta)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json == "-":
        print(json.dumps({**meta, "models": results}, indent=1))
    else:
        print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=None,
                   help="comma-separated; default efficientnet_lite0,mobilenet_v2, or with --exports every export")
    p.add_argument("--data", type=Path, default=REPO / "../shared/data/imagenet-sample-even")
    p.add_argument("--num-calib", type=int, default=50)
    p.add_argument("--sram", type=int, default=393216, help="npuforge's budget and Vela's --arena-cache-size")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--vela-matched", action="store_true",
                   help="give Vela npu256's clock and bandwidths instead of its bundled " + SYSTEM)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="one JSON object: printed instead of the tables, or with --exports written to FILE")
    p.add_argument("--exports", type=Path, default=None, metavar="DIR",
                   help="the NPU / CPU split of every DIR/NAME.tflite (model_sweep.py --export-dir DIR) instead")
    p.add_argument("--vela", default=None, metavar="PATH",
                   help="Vela's executable, e.g. in its own venv (default: ethosu.vela in this Python, else vela on PATH)")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="with --exports: the table to FILE too")
    p.add_argument("--vela-timeout", type=float, default=900, help="seconds per Vela run with --exports")
    args = p.parse_args()
    global VELA
    if args.vela:
        VELA = [args.vela]
    elif importlib.util.find_spec("ethosu.vela") is None:
        if shutil.which("vela") is None:
            print("Vela is not installed: pip install ethos-u-vela==5.2.0 (its own venv: --vela VENV/bin/vela)",
                  file=sys.stderr)
            return 2
        VELA = [shutil.which("vela")]
    if args.exports:
        return exports_main(args)
    args.models = args.models or "efficientnet_lite0,mobilenet_v2"
    vela_version = subprocess.run([*VELA, "--version"], capture_output=True, text=True).stdout.strip()
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compile_vs_vela_")))
        work.mkdir(parents=True, exist_ok=True)
        config, system = "Arm/vela.ini", SYSTEM
        if args.vela_matched:
            config = str(work / "npu256_matched.ini")
            system = matched_ini(Path(config))
        results = [bench(m, args, work, config, system) for m in args.models.split(",") if m]
    if args.json:
        text = json.dumps({"vela_version": vela_version, "vela_system_config": system, "sram": args.sram,
                           "num_calib": args.num_calib, "models": results}, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
        return 0
    labels = (f"npuforge {args.sram // 1024} KiB", "npuforge untiled", "Vela Performance", "Vela Size")
    print(f"npuforge target npu256 (256 MACs, 16 B/cycle SRAM, 8 B/cycle DRAM, 500 MHz) vs Vela {vela_version} "
          f"ethos-u55-256, {system}, Shared_Sram, arena cache {args.sram} B; {args.num_calib} calibration images")
    for r in results:
        print_table(r, args.sram, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
