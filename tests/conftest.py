import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """The allocator setting the command line uses (npuforge/memory.py), for the whole run: the
    in-process tests then run the torch paths as the CLI does, without a page fault per element
    of every large activation."""
    from npuforge.memory import keep_freed_memory

    keep_freed_memory()


def shared_data_dir() -> Path:
    env = os.environ.get("NPUFORGE_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def imagenet_sample() -> Path:
    folder = shared_data_dir() / "imagenet-sample-even"
    if not folder.is_dir():
        pytest.skip(f"shared ImageNet sample not found at {folder} (set NPUFORGE_SHARED_DATA)")
    return folder


def pytest_terminal_summary(terminalreporter):
    """Name the kernels this run's verdicts were reached on, also under -q
    (README, "Testing on other CPUs")."""
    import platform

    import torch

    from npuforge.workflow import cpu_lacks_vnni

    if platform.machine().lower() not in ("x86_64", "amd64"):
        ort = "not x86: ONNX Runtime's int8 kernels not characterised here"
    elif cpu_lacks_vnni():
        ort = "x86 without VNNI: ONNX Runtime's u8s8 kernels saturate int16 pair sums"
    else:
        ort = "x86 with VNNI: ONNX Runtime's u8s8 kernels exact"
    terminalreporter.write_line(
        f"cpu: {platform.machine()}; torch {torch.__version__} on {torch.backends.cpu.get_cpu_capability()} kernels "
        f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')}), {torch.get_num_threads()} threads; "
        f"{ort}")
