"""The integer simulator split in two (npuforge.sim.split): ONNX Runtime's lowering up to the
first node it has no lowering for, the plain simulator from there on; codes equal to the plain
path's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npuforge
from npuforge.errors import NpuforgeError
from npuforge.ir.subgraph import prefix, suffix
from npuforge.sim.integer import IntegerSimulator
from npuforge.sim.lowered import LoweredSimulator, make_simulator
from npuforge.sim.split import SplitSimulator


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = torch.relu(self.b(y)) + y
        return self.head(z.mean((2, 3)))


def quantized(keep_float=()):
    torch.manual_seed(0)
    g = npuforge.from_torch(Net().eval(), torch.zeros(1, 3, 8, 8), dynamic_batch=True)
    rng = np.random.default_rng(5)
    calib = [rng.standard_normal((4, 3, 8, 8)).astype(np.float32) for _ in range(2)]
    return npuforge.quantize(g, calib, {"keep_float": list(keep_float)}, log=lambda m: None)


def test_prefix_and_suffix_compose_to_the_whole_graph():
    """prefix(i) gives what suffix(i) reads (a skip connection's value included), for every cut."""
    q = quantized()
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    plain = IntegerSimulator(q)
    whole = plain.run({q.inputs[0]: x}, dequantize=False)[q.outputs[0]]
    for i in range(1, len(q.nodes)):
        head, tail = prefix(q, i), suffix(q, i)
        assert head.inputs == q.inputs and set(head.outputs) == set(tail.inputs)
        codes = IntegerSimulator(head).run({q.inputs[0]: x}, head.outputs, dequantize=False)
        got = IntegerSimulator(tail).run(codes, dequantize=False)[q.outputs[0]]
        assert np.array_equal(got, whole), i


def test_auto_lowers_up_to_a_node_kept_in_float_and_runs_it_plain():
    """auto does not lower a node kept in float: the nodes before it run lowered, it and the rest on
    the plain path, with the plain path's codes; fast lowers it too. Asking for an inner value runs
    the plain simulator; an unknown or missing input is one clear error."""
    q = quantized(keep_float=["/head/Gemm"])
    sim = make_simulator(q, "fixedpoint", "auto")
    assert isinstance(sim, SplitSimulator) and getattr(sim, "fallback", None) is None
    assert "'/head/Gemm'" in sim.plain_from and "it runs in float" in sim.plain_from
    assert sim.lowering["/head/Gemm"] == "plain simulator" and sim.lowering["/a/Conv"] != "plain simulator"
    assert isinstance(make_simulator(q, "fixedpoint", "fast"), LoweredSimulator)
    plain = IntegerSimulator(q)
    rng = np.random.default_rng(2)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32) * 2
        for dequantize in (False, True):
            got, want = sim.run({q.inputs[0]: x}, dequantize=dequantize), plain.run({q.inputs[0]: x},
                                                                                   dequantize=dequantize)
            assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    inner = q.nodes[1].outputs[0]
    got = sim.run({q.inputs[0]: x}, [inner], dequantize=False)[inner]
    assert np.array_equal(got, plain.run({q.inputs[0]: x}, [inner], dequantize=False)[inner])
    with pytest.raises(NpuforgeError, match="unknown input 'y'"):
        sim.run({q.inputs[0]: x, "y": x})
    with pytest.raises(NpuforgeError, match="missing input"):
        sim.run({})


def test_a_refusal_at_the_first_node_leaves_the_plain_simulator():
    q = quantized(keep_float=["/a/Conv"])
    sim = make_simulator(q, "fixedpoint", "auto")
    assert isinstance(sim, IntegerSimulator) and "it runs in float" in sim.fallback
