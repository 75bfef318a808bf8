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

    .venv/bin/pip install ethos-u-vela==5.2.0
    .venv/bin/python benchmarks/compile_vs_vela.py --models efficientnet_lite0,mobilenet_v2
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.metadata
import importlib.util
import io
import json
import re
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
    cmd = [sys.executable, "-m", "ethosu.vela", str(tflite), "--accelerator-config", "ethos-u55-256",
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="efficientnet_lite0,mobilenet_v2")
    p.add_argument("--data", type=Path, default=REPO / "../shared/data/imagenet-sample-even")
    p.add_argument("--num-calib", type=int, default=50)
    p.add_argument("--sram", type=int, default=393216, help="npuforge's budget and Vela's --arena-cache-size")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    p.add_argument("--vela-matched", action="store_true",
                   help="give Vela npu256's clock and bandwidths instead of its bundled " + SYSTEM)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = p.parse_args()
    if importlib.util.find_spec("ethosu.vela") is None:
        print("Vela is not installed: .venv/bin/pip install ethos-u-vela==5.2.0", file=sys.stderr)
        return 2
    vela_version = importlib.metadata.version("ethos-u-vela")
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compile_vs_vela_")))
        work.mkdir(parents=True, exist_ok=True)
        config, system = "Arm/vela.ini", SYSTEM
        if args.vela_matched:
            config = str(work / "npu256_matched.ini")
            system = matched_ini(Path(config))
        results = [bench(m, args, work, config, system) for m in args.models.split(",") if m]
    if args.json:
        print(json.dumps({"vela_version": vela_version, "vela_system_config": system, "sram": args.sram,
                          "num_calib": args.num_calib, "models": results}, indent=1))
        return 0
    labels = (f"npuforge {args.sram // 1024} KiB", "npuforge untiled", "Vela Performance", "Vela Size")
    print(f"npuforge target npu256 (256 MACs, 16 B/cycle SRAM, 8 B/cycle DRAM, 500 MHz) vs Vela {vela_version} "
          f"ethos-u55-256, {system}, Shared_Sram, arena cache {args.sram} B; {args.num_calib} calibration images")
    for r in results:
        print_table(r, args.sram, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
