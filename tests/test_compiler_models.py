"""The NPU compiler on the zoo's pretrained EfficientNet-Lite0 and MobileNetV2: memory against
the liveness bound and Vela's figures, cycles against the untiled program, and the program
simulator against the integer simulator on shared photos at three budgets. The 100-photo
figures are in docs/compiler.md with their command (benchmarks/compile_models.py)."""

from __future__ import annotations

import numpy as np
import pytest

import npuforge
from npuforge.cli import main as cli_main
from npuforge.compiler.binfmt import read_program
from npuforge.compiler.compile import compile_graph
from npuforge.compiler.progsim import ProgramSimulator
from npuforge.compiler.target import load_target
from npuforge.sim.integer import IntegerSimulator
from npuforge.workflow import transform_of
from npuforge.zoo.data import ImageDataset, iter_batches

pytestmark = pytest.mark.slow

KIB = 1024
WHOLE_TENSOR_BOUND = 1_505_280  # 112 x 112 x 96 + 56 x 56 x 96 bytes: the stride-2 depthwise of block 1
VELA_SIZE_MODE_SRAM = 353.5 * KIB  # Vela 5.2.0, U55-256, Shared_Sram, Size mode (the anchor)


@pytest.mark.parametrize("model", ["efficientnet_lite0", "mobilenet_v2"])
def test_compiled_zoo_model_fits_and_equals_the_integer_simulator(model, imagenet_sample, tmp_path):
    path = tmp_path / f"{model}.nfir"
    assert cli_main(["quantize", model, "--calib", str(imagenet_sample), "--num-calib", "8", "-o", str(path)]) == 0
    graph = npuforge.load(path)
    target = load_target("npu256")
    whole = compile_graph(graph, target, 1 << 30, tolerance=0.0)
    assert not whole.stats["cascades"]
    assert whole.peak == whole.stats["liveness_bound"] == whole.stats["untiled_liveness_bound"] == WHOLE_TENSOR_BOUND
    fitted = compile_graph(graph, target, 384 * KIB)
    assert fitted.peak <= VELA_SIZE_MODE_SRAM and fitted.peak == fitted.stats["liveness_bound"]
    assert fitted.stats["cycles"] <= 1.05 * fitted.stats["untiled_cycles"]
    tight = compile_graph(graph, target, 300 * KIB)
    assert tight.peak <= 300 * KIB < fitted.peak
    dataset = ImageDataset(imagenet_sample, None, limit=3, skip=8)
    x, _, _ = next(iter_batches(dataset, transform_of(graph.metadata["preprocess"]), 3, 1))
    want = IntegerSimulator(graph).run({graph.inputs[0]: x}, dequantize=False)[graph.outputs[0]]
    for program in (whole, fitted, tight):
        sim = ProgramSimulator(read_program(program.data))
        got = np.concatenate([sim.run({graph.inputs[0]: x[k:k + 1]})[graph.outputs[0]] for k in range(len(x))])
        assert np.array_equal(got, want), program.stats["sram_budget"]
