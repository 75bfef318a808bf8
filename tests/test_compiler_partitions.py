"""Every quantized model compiles: what the target has no kernel for runs as a node command (the
integer simulator's own kernel for that node, whole tensors) on the NPU where the target lists its
class, else on the host CPU, in the same program; the program simulator equals the integer
simulator bit for bit (npuforge/compiler/cpu.py, lower.py)."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import npuforge
from npuforge.cli import main
from npuforge.compiler.binfmt import read_program
from npuforge.compiler.compile import compile_graph
from npuforge.compiler.progsim import ProgramSimulator
from npuforge.compiler.target import load_target
from npuforge.sim.integer import IntegerSimulator, quantize_input


class Attention(nn.Module):
    """Conv stem, PRelu (kept in float with keep_float: a float node for the CPU), tokens, LayerNorm, one
    attention head, Split, Concat, a mean."""

    def __init__(self):
        super().__init__()
        self.stem, self.act = nn.Conv2d(3, 8, 3, stride=2), nn.PReLU(8)
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        y = self.act(self.stem(x)) * 0.5 + 0.25
        t = self.norm(y.flatten(2).transpose(1, 2))
        a = torch.softmax(t @ t.transpose(1, 2), -1) @ t
        left, right = a.split(4, dim=2)
        return self.fc(torch.cat([right, left], 2)).mean(1)


class Audio(nn.Module):
    """1-D convolutions and pools over a [N, C, L] signal; a keyword spotter's head: the pooled [N, C, 1]
    flattened to [N, C] (the same bytes under another record) into a classifier."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(4, 8, 5, stride=2), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(8, 6, 3))
        self.head = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(6, 3))

    def forward(self, x):
        y = self.body(x)
        return y.mean(2) + self.head(y).sum(1, keepdim=True)


class Rows(nn.Module):
    """A decoder's projections (GPT-2's Conv1D): the tokens flattened to rows [L, D] through a linear layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 12)

    def forward(self, x):
        return torch.relu(self.fc(x.reshape(-1, 8))).reshape(1, 6, 12)


class Tokens(nn.Module):
    """Token ids (int64) through an embedding table (Gather), then a classifier."""

    def __init__(self):
        super().__init__()
        self.embed, self.fc = nn.Embedding(50, 16), nn.Linear(16, 4)

    def forward(self, ids):
        return self.fc(self.embed(ids).mean(1))


def _example(name):
    return torch.randint(0, 50, (1, 7)) if name == "tokens" else torch.zeros(
        {"attention": (1, 3, 16, 16), "audio": (1, 4, 64), "rows": (1, 6, 8)}[name])


def _data(name, rng):
    if name == "tokens":
        return rng.integers(0, 50, (1, 7)).astype(np.int64)
    return rng.normal(size=tuple(_example(name).shape)).astype(np.float32)


@pytest.fixture(scope="module", params=["attention", "audio", "rows", "tokens"])
def quantized(request):
    torch.manual_seed(0)
    module = {"attention": Attention, "audio": Audio, "rows": Rows, "tokens": Tokens}[request.param]().eval()
    graph = npuforge.from_torch(module, _example(request.param), dynamic_batch=False)
    rng = np.random.default_rng(0)
    keep = [n.name for n in graph.nodes if n.op == "PRelu"]  # (PRelu has an integer rule since issue 37)
    q = npuforge.quantize(graph, [{graph.inputs[0]: _data(request.param, rng)} for _ in range(4)],
                          {"keep_float": keep}, log=lambda m: None)
    return request.param, q


def _feeds(name, q, rng):
    x = _data(name, rng)
    p = q.values[q.inputs[0]].quant
    return {q.inputs[0]: quantize_input(x, p) if p is not None else x}


@pytest.mark.parametrize("target", ["npu256", "npu1k"])
def test_the_program_computes_what_the_integer_simulator_computes(quantized, target):
    name, q = quantized
    program = compile_graph(q, load_target(target))
    sim, ref = ProgramSimulator(read_program(program.data, name)), IntegerSimulator(q)
    rng = np.random.default_rng(1)
    for _ in range(3):
        feeds = _feeds(name, q, rng)
        got, want = sim.run(feeds), ref.run(feeds, dequantize=False)
        for out in q.outputs:
            assert got[out].dtype == want[out].dtype and np.array_equal(got[out], want[out]), (target, out)
    s = program.stats
    assert program.peak <= s["sram_budget"] and 0 <= s["npu_macs_fraction"] <= 1


def test_the_transformer_class_target_keeps_only_float_nodes_on_the_cpu(quantized):
    name, q = quantized
    small, big = (compile_graph(q, load_target(t)) for t in ("npu256", "npu1k"))
    floats = {n.op for n in q.nodes if not n.quant and get_kind(q, n) not in ("passthrough", "concat", "shape")}
    assert set(big.stats["cpu_ops"]) <= floats, big.stats["cpu_ops"]
    assert big.stats["npu_macs_fraction"] >= small.stats["npu_macs_fraction"]
    if name == "attention":  # the float PRelu stays on the CPU; on npu256 the transformer ops join it
        assert set(big.stats["cpu_ops"]) == {"PRelu"}
        assert {"Softmax", "LayerNormalization", "MatMul"} <= set(small.stats["cpu_ops"])


def test_one_d_convolutions_and_pools_run_on_the_npu_as_2d_kernels(quantized):
    """npu256 has 2-D kernels only: the 1-D ones run there with H = 1, every MAC on the NPU; what is left on
    the CPU moves codes (the signal into the channel-last record and the pooled result out of it)."""
    name, q = quantized
    if name != "audio":
        pytest.skip("the audio model has the 1-D ops")
    s = compile_graph(q, load_target("npu256")).stats
    assert s["npu_macs_fraction"] == 1.0, s["cpu_ops"]
    assert not {"Conv", "MaxPool", "GlobalAveragePool"} & set(s["cpu_ops"]), s["cpu_ops"]


def test_a_linear_layer_on_rows_of_tokens_runs_on_the_npu(quantized):
    name, q = quantized
    if name != "rows":
        pytest.skip("the rows model has the [L, D] linear layer")
    s = compile_graph(q, load_target("npu256")).stats
    assert s["npu_macs_fraction"] == 1.0 and not s["cpu_ops"], s["cpu_ops"]


def get_kind(q, node):
    from npuforge.ops.registry import get_op

    return get_op(node.op).quant_kind(node, q)


def test_the_report_marks_each_command_and_says_why(quantized, tmp_path, capsys):
    name, q = quantized
    npuforge.save(q, tmp_path / "q.nfir")
    assert main(["compile", str(tmp_path / "q.nfir"), "-o", str(tmp_path / "q.npub"), "--json",
                 "--csv", str(tmp_path / "layers.csv")]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert {"npu_macs_fraction", "cpu_ops", "cpu_commands"} <= set(stats)
    for row in stats["layers"]:
        assert row["device"] in ("npu", "cpu")
        assert row["device"] == ("cpu" if row["op"] == "cpu" else "npu")
        assert row["why"] or row["device"] == "npu"  # every CPU command says why it left the NPU
    assert "device,why" in (tmp_path / "layers.csv").read_text().splitlines()[0]
    x = tmp_path / "x.npy"
    np.save(x, _data(name, np.random.default_rng(2)))
    assert main(["run", str(tmp_path / "q.npub"), "--input", str(x)]) == 0


def test_a_graph_output_behind_a_view_keeps_its_name():
    """SqueezeNet's logits are a Flatten of a global pool: the program's output is named as the graph's."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    graph = npuforge.from_torch(module, torch.zeros(1, 3, 8, 8), dynamic_batch=False)
    rng = np.random.default_rng(0)
    q = npuforge.quantize(graph, [rng.normal(size=(1, 3, 8, 8)).astype(np.float32) for _ in range(2)],
                          log=lambda m: None)
    assert q.nodes[-1].op == "Flatten"
    program = compile_graph(q, load_target("npu256"))
    feeds = {q.inputs[0]: quantize_input(rng.normal(size=(1, 3, 8, 8)).astype(np.float32),
                                         q.values[q.inputs[0]].quant)}
    got = ProgramSimulator(read_program(program.data, "p")).run(feeds)
    want = IntegerSimulator(q).run(feeds, dequantize=False)
    assert list(got) == q.outputs and np.array_equal(got[q.outputs[0]], want[q.outputs[0]])
