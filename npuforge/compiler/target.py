"""NPU target descriptions: what the core computes per cycle, how much SRAM it has and how
fast its memories move bytes. A target is data (a TOML file); the built-in ones live in
``npuforge/compiler/targets/`` and a user's file is read the same way, field by field,
so a misspelt field is an error rather than a silently ignored default."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NpuforgeError

BUILTIN_DIR = Path(__file__).parent / "targets"

# every NPU operation the lowering can produce (a target lists the ones it runs natively); what a
# target does not list runs on the host CPU, in the same program
NPU_OPS = ("conv", "depthwise", "fully_connected", "add", "sub", "mul", "avgpool", "global_avgpool", "maxpool",
           "lut", "concat", "resize_bilinear", "transpose", "matmul", "softmax", "normalization", "gather", "slice",
           "pad", "elementwise", "reduce")


@dataclass(frozen=True)
class Target:
    name: str
    macs_per_cycle: int
    sram_bytes: int
    sram_bytes_per_cycle: float
    dram_bytes_per_cycle: float
    clock_mhz: float
    description: str = ""
    mac_block: tuple = (16, 16)  # (output channels, input channels) the MAC array covers in one cycle
    elementwise_per_cycle: int = 16
    dram_latency_cycles: int = 100
    dram_burst_bytes: int = 64
    command_overhead_cycles: int = 32
    alignment: int = 16
    native_ops: tuple = field(default=NPU_OPS)
    # the host CPU that runs what the NPU does not, in NPU cycles: per multiply-accumulate, per element
    # read or written, and per command (the hand-over between NPU and CPU)
    cpu_cycles_per_mac: float = 2.0
    cpu_cycles_per_element: float = 4.0
    cpu_command_cycles: int = 2000

    def with_sram(self, sram_bytes: int) -> "Target":
        return dataclasses.replace(self, sram_bytes=int(sram_bytes))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["mac_block"], d["native_ops"] = list(self.mac_block), list(self.native_ops)
        return d


def builtin_targets() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def _positive(where: str, key: str, value, integer: bool) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise NpuforgeError(f"{where}: '{key}' must be {kind}, not {value!r}")


def target_from_dict(data: dict, where: str) -> Target:
    fields = {f.name: f for f in dataclasses.fields(Target)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise NpuforgeError(f"{where}: unknown target field '{unknown[0]}'; known fields: {', '.join(fields)}")
    required = [n for n, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in data]
    if missing:
        raise NpuforgeError(f"{where}: missing target field '{missing[0]}'")
    for key in ("macs_per_cycle", "sram_bytes", "elementwise_per_cycle", "dram_burst_bytes", "alignment"):
        if key in data:
            _positive(where, key, data[key], integer=True)
    for key in ("sram_bytes_per_cycle", "dram_bytes_per_cycle", "clock_mhz"):
        _positive(where, key, data[key], integer=False)
    for key in ("cpu_cycles_per_mac", "cpu_cycles_per_element"):
        if key in data:
            _positive(where, key, data[key], integer=False)
    for key in ("dram_latency_cycles", "command_overhead_cycles", "cpu_command_cycles"):
        if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] < 0):
            raise NpuforgeError(f"{where}: '{key}' must be a non-negative integer, not {data[key]!r}")
    values = dict(data)
    if "mac_block" in values:
        block = values["mac_block"]
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
                and block[0] * block[1] == values["macs_per_cycle"]):
            raise NpuforgeError(f"{where}: 'mac_block' must be two positive integers whose product is "
                                f"macs_per_cycle ({values['macs_per_cycle']}), not {block!r}")
        values["mac_block"] = tuple(block)
    if "native_ops" in values:
        ops = values["native_ops"]
        bad = [o for o in ops if o not in NPU_OPS] if isinstance(ops, list) else [ops]
        if bad:
            raise NpuforgeError(f"{where}: unknown NPU op '{bad[0]}' in native_ops; known: {', '.join(NPU_OPS)}")
        values["native_ops"] = tuple(ops)
    if values["alignment"] & (values["alignment"] - 1) if "alignment" in values else False:
        raise NpuforgeError(f"{where}: 'alignment' must be a power of two, not {values['alignment']}")
    return Target(**values)


def load_target(spec: str) -> Target:
    """A built-in target by name, or a TOML file by path."""
    path = Path(spec)
    if not path.suffix and (BUILTIN_DIR / f"{spec}.toml").is_file():
        path = BUILTIN_DIR / f"{spec}.toml"
    elif not path.is_file():
        raise NpuforgeError(f"--target {spec}: neither a built-in target ({', '.join(builtin_targets())}) "
                            f"nor a TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise NpuforgeError(f"{path}: not a readable TOML target description ({e})") from None
    return target_from_dict(data, str(path))
