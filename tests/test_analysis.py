"""Quantization analysis: metrics, the cached-calibration builder against npuforge.quantize,
per-layer errors, ranking, fixes and the mixed-precision search on a small network with
one badly conditioned layer, the analyze command, the HTML report (and its rendering in
headless Chromium when installed), and EfficientNet-Lite0 on a few real images."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import npuforge
from npuforge.analysis import analyze
from npuforge.analysis.layers import LayerProbe
from npuforge.analysis.search import with_changes
from npuforge.analysis.metrics import ErrorStats, weight_stats
from npuforge.analysis.report import render
from npuforge.analysis.session import Calibration, Evaluator
from npuforge.cli import main
from npuforge.passes import optimize
from npuforge.quant.config import QuantConfig

REPO = Path(__file__).resolve().parents[1]


# -- metrics ------------------------------------------------------------------------------

def test_error_stats_sqnr_cosine_rel_mse():
    x = torch.tensor([[1.0, -1.0, 2.0, 0.0], [3.0, 1.0, -2.0, 1.0]])
    noise = torch.tensor([[0.1, 0.0, -0.1, 0.0], [0.0, 0.1, 0.0, -0.1]])
    s = ErrorStats()
    s.update(x[:1], x[:1] + noise[:1])  # streamed in two batches
    s.update(x[1:], x[1:] + noise[1:])
    signal, err = float((x ** 2).sum()), float((noise ** 2).sum())
    assert s.sqnr_db == pytest.approx(10 * np.log10(signal / err))
    assert s.rel_mse == pytest.approx(err / float(((x - x.mean()) ** 2).sum()))
    cos = [float(torch.nn.functional.cosine_similarity(x[i], x[i] + noise[i], dim=0)) for i in range(2)]
    assert s.cosine == pytest.approx(np.mean(cos))
    exact = ErrorStats()
    exact.update(x, x.clone())
    assert exact.sqnr_db == 200.0 and exact.rel_mse == 0.0 and exact.cosine == pytest.approx(1.0)
    assert json.dumps(exact.to_dict())  # finite, JSON-ready


def test_weight_stats_find_an_outlier_channel():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (16, 4, 3, 3)).astype(np.float32)
    w[5] *= 40
    st = weight_stats(w, axis=0)
    assert st["channels"] == 16 and st["outlier_channels"] == 1 and st["range_spread"] > 20
    assert st["sqnr_per_channel_db"] > st["sqnr_per_tensor_db"] + 10
    assert st["max"][5] == pytest.approx(w[5].max()) and st["min"][5] == pytest.approx(w[5].min())


# -- a small network with one badly conditioned layer ------------------------------------------

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = torch.nn.Conv2d(8, 12, 1)
        self.fc = torch.nn.Linear(12, 10)

    def forward(self, x):
        a = torch.nn.functional.relu6(self.c1(x))
        b = torch.relu(self.dw(a))
        c = torch.relu(self.c2(b))
        return self.fc(c.mean((2, 3)))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    m = Net().eval()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((400, 3, 12, 12)).astype(np.float32)
    with torch.no_grad():
        # one depthwise channel's weights 30x wider, its input 30x smaller: the same function,
        # but per-tensor int8 weights leave the other channels a few levels
        m.dw.weight[3] *= 30.0
        m.c1.weight[3] /= 30.0
        m.c1.bias[3] /= 30.0
        # centred, scaled features so that the classes vary from image to image
        feats = []
        hook = m.fc.register_forward_hook(lambda mod, i, o: feats.append(i[0]))
        m.fc.bias.zero_()
        m(torch.from_numpy(x))
        hook.remove()
        f = feats[0]
        m.fc.weight /= f.std(0, keepdim=True).clamp(min=float(f.std(0).median()))
        m.fc.bias -= m.fc.weight @ f.mean(0)
    graph = npuforge.from_torch(m, torch.zeros(1, 3, 12, 12))
    calib = [rng.standard_normal((16, 3, 12, 12)).astype(np.float32) for _ in range(3)]
    logits = graph.run({graph.inputs[0]: x})[graph.outputs[0]]
    top2 = np.sort(logits, axis=1)[:, -2:]
    keep = np.argsort(top2[:, 0] - top2[:, 1])[:96]  # the 96 images with the clearest float decision
    return graph, calib, x[keep], logits[keep].argmax(1)  # labels: FP32 top-1 is 100 %


DW = "/dw/Conv"


def test_build_from_cached_calibration_equals_quantize(net):
    graph, calib, _, _ = net
    opt = optimize(graph)[0]
    cal = Calibration(opt, calib)
    for options in ({}, {"granularity": "per-tensor", "method": "kl"}, {"method": "percentile"},
                    {"granularity": "per-tensor", "method": "mean", "int16": [DW]}):
        config = QuantConfig.from_dict(options)
        ref = npuforge.quantize(graph, calib, config)
        got = cal.build(config)
        for name, v in ref.values.items():
            assert (v.quant is None) == (got.values[name].quant is None), name
            if v.quant is not None:
                assert v.quant.same_as(got.values[name].quant), (options, name)


def test_per_channel_override_and_observer_override(net):
    graph, calib, _, _ = net
    cal = Calibration(optimize(graph)[0], calib)
    q = cal.build(QuantConfig(granularity="per-tensor", per_channel=[DW]))
    weights = {n.name: q.values[n.inputs[1]].quant for n in q.nodes if n.op in ("Conv", "Gemm")}
    assert weights[DW].axis == 0 and weights[DW].scale.shape == (8,)
    assert all(p.axis is None for name, p in weights.items() if name != DW)
    out = next(n.outputs[0] for n in q.nodes if n.name == "/c2/Conv")  # ReLU: a long tail to clip
    plain = cal.build(QuantConfig(granularity="per-tensor"))
    clipped = cal.build(QuantConfig(granularity="per-tensor"), {out: "percentile"})
    assert clipped.values[out].quant.scale < plain.values[out].quant.scale
    with pytest.raises(npuforge.NpuforgeError, match="per_channel names unknown"):
        cal.build(QuantConfig(per_channel=["nope"]))


def test_int_engine_scores_the_integer_program_and_each_distinct_program_once(net):
    """engine "int" (analyze's default) is the top-1 of the integer program as npuforge eval --engine
    int computes it (the plain simulator here, the reference), a layer kept in float included; two
    configurations that quantize alike are one program, scored once."""
    from npuforge.analysis.search import Scorer, program_key
    from npuforge.sim.integer import IntegerSimulator

    graph, calib, x, labels = net
    cal = Calibration(optimize(graph)[0], calib)
    base = QuantConfig(granularity="per-tensor")
    ev = Evaluator(x, labels, "int", batch_size=32)
    for changes in ({}, {DW: "float"}, {DW: "int16"}):
        q = cal.build(with_changes(base, changes))
        want = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
        assert ev.top1(q) == pytest.approx(100.0 * float((want.argmax(1) == labels).mean()))
    assert ev.engine == "int"
    per_channel = QuantConfig()  # asking for per-channel weights on a per-channel model changes nothing
    assert program_key(cal.build(with_changes(per_channel, {DW: "per-channel"}))) == program_key(cal.build(per_channel))
    assert program_key(cal.build(with_changes(per_channel, {DW: "float"}))) != program_key(cal.build(per_channel))
    scorer = Scorer(cal, Evaluator(x, labels, "int"), per_channel)
    scorer.top1({}), scorer.top1({DW: "per-channel"}), scorer.top1({DW: "float"})
    assert scorer.ev.runs == 2 and len(scorer.memo) == 3


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_variants_start_where_they_leave_the_first_program(net, activations):
    """The integer program of a variant that changes a later layer runs from that layer on, from
    the codes the first run there kept; its logits equal the whole program's, bit for bit (an
    early change, and a variant after a kept start, included)."""
    from npuforge.analysis.prefix import node_digests

    graph, calib, x, labels = net
    cal = Calibration(optimize(graph)[0], calib)
    base = QuantConfig(granularity="per-tensor", activation_dtype=activations)
    later = "/c2/Conv"
    variants = [{}, {later: "float"}, {later: "int16"}, {DW: "float"}, {later: "per-channel"}]
    graphs = [cal.build(with_changes(base, c)) for c in variants]
    whole, parts = Evaluator(x, labels, "int", batch_size=32), Evaluator(x, labels, "int", batch_size=32)
    whole._prefixes.budget = 0
    for q in graphs:
        np.testing.assert_array_equal(parts.logits(q), whole.logits(q))
    start = next(i for i, n in enumerate(graphs[0].nodes) if n.name == later)
    assert start in parts._prefixes.kept and not whole._prefixes.kept
    digests = [node_digests(q) for q in graphs]
    assert digests[1][:start] == digests[0][:start] and digests[1][start] != digests[0][start]


def test_kept_codes_serve_only_a_variant_that_reads_them_with_the_same_parameters(net):
    """PrefixCache.start offers kept codes only when they hold every value the variant reads from
    there on, each with the parameters the variant gives it; else the variant runs whole."""
    from npuforge.analysis.prefix import PrefixCache
    from npuforge.ir.subgraph import live_values

    graph, calib, _, _ = net
    cal = Calibration(optimize(graph)[0], calib)
    base = QuantConfig(granularity="per-tensor")
    q0, q1, q2 = (cal.build(with_changes(base, c)) for c in ({}, {"/c2/Conv": "float"}, {"/c2/Conv": "int16"}))
    cache = PrefixCache()
    assert cache.start(q0) == (0, None)
    first, feeds = cache.start(q1)
    assert first > 0 and feeds is None
    names = live_values(q1, first)
    cache.keep(q1, first, {n: np.zeros(3, np.uint8) for n in names})
    assert sorted(cache.start(q2)[1]) == sorted(names)
    cache.kept[first][names[0]] = ("other parameters", cache.kept[first][names[0]][1])
    assert cache.start(q2) == (first, None)
    del cache.kept[first][names[0]]
    assert cache.start(q2) == (first, None)


def test_int_engine_falls_back_by_name(net, monkeypatch):
    """An int8 program with no fast lowering: a note naming why, then every quantized configuration
    scored as engine "ort" (QDQ in float); one variant alone with none: the plain simulator."""
    import npuforge.sim.lowered as lowered
    from npuforge.errors import UnsupportedError
    from npuforge.sim.integer import IntegerSimulator

    graph, calib, x, labels = net
    cal = Calibration(optimize(graph)[0], calib)
    q = cal.build(QuantConfig(granularity="per-tensor"))
    real = lowered.LoweredSimulator

    def refuse(*args, **kwargs):
        raise UnsupportedError("node 'n' (Op): no lowering")

    monkeypatch.setattr(lowered, "LoweredSimulator", refuse)
    notes = []
    ev = Evaluator(x, labels, "int", log=notes.append)
    assert ev.top1(q) == Evaluator(x, labels, "ort").top1(q) and ev.engine == "ort"
    assert len(notes) == 1 and "node 'n' (Op): no lowering" in notes[0] and "--engine ort" in notes[0]
    monkeypatch.setattr(lowered, "LoweredSimulator", real)
    ev = Evaluator(x, labels, "int", log=notes.append)
    ev.top1(q)  # lowers: the engine stays "int"
    monkeypatch.setattr(lowered, "LoweredSimulator", refuse)
    want = IntegerSimulator(q, "fixedpoint").run({q.inputs[0]: x})[q.outputs[0]]
    assert ev.top1(q) == pytest.approx(100.0 * float((want.argmax(1) == labels).mean())) and ev.engine == "int"
    assert "the plain integer simulator scores it" in notes[-1]


def test_layer_errors_and_ranking_name_the_bad_layer(net):
    graph, calib, x, _ = net
    cal = Calibration(optimize(graph)[0], calib)
    q = cal.build(QuantConfig(granularity="per-tensor"))
    probe = LayerProbe(q)
    probe.run(x[:16], chunk=5)
    layers = {layer.node: layer for layer in probe.layers}
    assert [layer.op for layer in probe.layers] == ["Conv", "Conv", "Conv", "ReduceMean", "Gemm"]
    first = probe.layers[0]  # nothing quantized before it: both views agree
    assert first.cumulative.sqnr_db == pytest.approx(first.isolated.sqnr_db, abs=1e-6)
    assert layers[DW].weights["outlier_channels"] == 1
    float_logits = cal.graph.run({cal.graph.inputs[0]: x[:16]})[cal.graph.outputs[0]]
    errs = probe.output_errors(x[:16], float_logits, {layer.node: (layer.node, "same") for layer in probe.layers})
    for layer in probe.layers:
        layer.to_output = errs[layer.node]
    ranked = probe.rank()
    assert ranked[0].node == DW and ranked[0].share > 0.5
    assert sum(layer.share for layer in ranked) == pytest.approx(1.0)
    assert all(v.quant is not None for v in q.values.values() if v.name in probe.qact)  # restored


def test_isolated_runs_from_the_float_prefix_equal_whole_runs(net, monkeypatch):
    """Each isolated layer's network-output error starts from the float values one float run gave
    (the suffix of the graph from that layer); with no room for them (budget 0) every run is
    whole. The two agree up to float summation order, and the suffixes are what ran."""
    import npuforge.analysis.layers as layers_mod

    graph, calib, x, _ = net
    cal = Calibration(optimize(graph)[0], calib)
    probe = LayerProbe(cal.build(QuantConfig(granularity="per-tensor")))
    float_logits = cal.graph.run({cal.graph.inputs[0]: x[:16]})[cal.graph.outputs[0]]
    runs = {layer.node: (layer.node, "same") for layer in probe.layers}
    whole = probe.output_errors(x[:16], float_logits, runs, budget=0)
    started = []
    real_suffix = layers_mod.suffix
    monkeypatch.setattr(layers_mod, "suffix", lambda g, i: started.append(i) or real_suffix(g, i))
    parts = probe.output_errors(x[:16], float_logits, runs)
    assert started == [probe.index[n] for n in runs] and max(started) > 0
    for node in runs:
        assert parts[node].noise == pytest.approx(whole[node].noise, rel=1e-3), node


def test_suffix_from_live_values_equals_the_whole_graph():
    """live_values: what the nodes from i on read that earlier nodes made, a skip connection's
    value included; the suffix graph run on them gives the whole graph's outputs."""
    from npuforge.ir.subgraph import live_values, suffix, with_outputs

    class Skip(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return torch.relu(self.b(y)) + y

    torch.manual_seed(0)
    g = npuforge.from_torch(Skip().eval(), torch.zeros(1, 3, 6, 6))
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    whole = g.run({g.inputs[0]: x})[g.outputs[0]]
    for i in range(len(g.nodes) + 1):
        names = live_values(g, i)
        assert (names == g.inputs) if i == 0 else (g.inputs[0] not in names)
        before = with_outputs(g, names).run({g.inputs[0]: x}) if i else {g.inputs[0]: x}
        sub = suffix(g, i)
        got = sub.run({n: before[n] for n in sub.inputs})[g.outputs[0]]
        np.testing.assert_array_equal(got, whole)
    add = next(k for k, n in enumerate(g.nodes) if n.op == "Add")
    assert len(live_values(g, add)) == 2  # the skip connection's value is live across the second conv


def test_analyze_fixes_and_search(net):
    graph, calib, x, labels = net
    result, best = analyze(graph, calib, x, labels, QuantConfig(granularity="per-tensor"), analysis_images=16,
                           fix_layers=1, target_drop=3.0, max_layers=4, engine="npuforge")
    assert result["fp32_top1"] == 100.0 and result["drop"] > 20.0
    assert result["ranking"][0] == DW
    fixes = {f["fix"]: f for f in result["fixes"]}
    assert set(fixes) >= {"per-channel weights", "int16 activations", "keep in float"}
    assert fixes["per-channel weights"]["delta"] > 0 and fixes["keep in float"]["delta"] > 0
    s = result["search"]
    assert s["reached"] and s["top1"] >= 97.0 and s["changes"] and DW in s["changes"]
    # the returned model is the search's choice
    assert DW in best.metadata["quantization"]["config"]["keep_float"] + best.metadata["quantization"]["config"]["int16"]
    assert Evaluator(x, labels, "npuforge").top1(best) == pytest.approx(s["top1"], abs=1e-3)
    # whole-model remedies: equalization cures the badly scaled depthwise layer per tensor
    remedies = {r["remedy"]: r for r in result["remedies"]}
    assert set(remedies) == {"equalize", "equalize + bias correction"}
    assert remedies["equalize"]["delta"] > 10
    html = render(result)
    assert "Whole-model remedies" in html
    assert "<svg" in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html and "<script" not in html and "<img" not in html


# -- the command ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory, net):
    folder = tmp_path_factory.mktemp("analyze")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU6(),
                            torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.ReLU6(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 2)).eval()
    with torch.no_grad():
        m[2].weight[1] *= 30
    model = folder / "tiny.onnx"
    npuforge.export_onnx(m, torch.zeros(1, 3, 32, 32), str(model))
    images = folder / "images"
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (images / cls).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(images / cls / f"{i}.png")
    return model, images


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_analyze_command_json_report_and_model(capsys, tiny, tmp_path):
    model, images = tiny
    report, out = tmp_path / "r" / "report.html", tmp_path / "q" / "tiny.nfir"
    code, stdout, err = run(capsys, "analyze", model, "--calib", images, "--data", images, "--num-calib", 4,
                            "--granularity", "per-tensor", "--analysis-images", 4, "--fix-layers", 1,
                            "--target-drop", 0, "--report", report, "-o", out, "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["calibration_images"] == 4 and result["evaluation_images"] == 8 and result["skip"] == 4
    assert [x["op"] for x in result["layers"]] == ["Conv", "Conv", "GlobalAveragePool", "Gemm"]
    for layer in result["layers"]:
        assert {"name", "op", "sqnr_db", "isolated_sqnr_db", "cosine", "output_sqnr_db", "rank"} <= set(layer)
    assert result["search"]["reached"]
    for suffix in (".nfir", ".safetensors", ".onnx"):
        assert out.with_suffix(suffix).is_file()
    q = npuforge.load(out)
    assert "quantization" in q.metadata
    html = report.read_text()
    assert html.count("<svg") >= 4 and "<h2>Mixed-precision search</h2>" in html
    # the table form
    code, stdout, _ = run(capsys, "analyze", model, "--calib", images, "--data", images, "--num-calib", 4,
                          "--skip", 2, "--analysis-images", 2, "--fix-layers", 0, "-q")
    assert code == 0
    assert "layers ranked by their share" in stdout and "top-1 FP32" in stdout


@pytest.mark.parametrize("extra, fragment", [
    (["--output", "x.onnx"], "name the IR file"),
    (["--num-calib", "0"], "--num-calib 0"),
    (["--num-calib", "50"], "holds 12 images"),
    (["--target-drop", "-1"], "--target-drop -1"),
    (["--remedies", "equalise"], "'equalise' is not one of equalize, bias_correction, adaround"),
])
def test_analyze_user_errors_are_one_line(capsys, tiny, extra, fragment):
    model, images = tiny
    code, _, err = run(capsys, "analyze", model, "--calib", images, "--data", images, *extra)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("npuforge: error: ") and fragment in line, err


def test_analyze_refuses_a_quantized_model(capsys, tiny, tmp_path):
    model, images = tiny
    q = tmp_path / "q.nfir"
    assert run(capsys, "quantize", model, "--calib", images, "--num-calib", 4, "-o", q, "-q")[0] == 0
    code, _, err = run(capsys, "analyze", q, "--calib", images, "--data", images)
    assert code == 2 and "already quantized" in err


def test_analyze_and_bias_correction_on_a_model_with_a_fixed_batch(capsys, tiny, tmp_path):
    """Most exported files fix their batch at 1: analyze evaluates them one image at a time, and the
    layer-wise remedies (bias correction) run each op an image at a time too, in analyze and in
    quantize."""
    import onnx

    model, images = tiny
    proto = onnx.load(model)
    for value in list(proto.graph.input) + list(proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 1
    fixed = tmp_path / "fixed.onnx"
    onnx.save(proto, fixed)
    code, stdout, err = run(capsys, "analyze", fixed, "--calib", images, "--data", images, "--num-calib", 4,
                            "--analysis-images", 2, "--fix-layers", 1, "--target-drop", 0, "--json")
    assert code == 0, err
    assert "batch is fixed at 1" in err
    result = json.loads(stdout)
    assert result["evaluation_images"] == 8
    assert [r["remedy"] for r in result["remedies"]] == ["equalize", "equalize + bias correction"]
    code, out, err = run(capsys, "quantize", fixed, "--calib", images, "--num-calib", 4, "--bias-correction",
                         "-o", tmp_path / "q.nfir", "--json")
    assert code == 0, err
    assert json.loads(out)["bias_correction"]["corrected"] >= 1


# -- the report in a real browser ------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(net, tmp_path):
    graph, calib, x, labels = net
    result, _ = analyze(graph, calib, x[:32], labels[:32], QuantConfig(granularity="per-tensor"),
                        analysis_images=8, fix_layers=1, target_drop=3.0, max_layers=3, engine="npuforge")
    result["model"] = "test net"
    html = tmp_path / "report.html"
    html.write_text(render(result))
    png = tmp_path / "report.png"
    subprocess.run(["bash", str(REPO / "scripts" / "report_screenshot.sh"), str(html), str(png)], check=True,
                   timeout=120, capture_output=True)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[1] == 1280
    # something was drawn: not a blank page (chart colours present)
    blue = ((img[..., 2] > 150) & (img[..., 0] < 80)).sum()
    assert blue > 1000


# -- EfficientNet-Lite0 on a few real images ---------------------------------------------------

@pytest.mark.slow
def test_efficientnet_lite0_analysis_names_the_first_depthwise_conv(imagenet_sample, capsys):
    code, stdout, err = run(capsys, "analyze", "efficientnet_lite0", "--calib", imagenet_sample, "--data",
                            imagenet_sample, "--num-calib", 10, "--limit", 10, "--granularity", "per-tensor",
                            "--analysis-images", 2, "--fix-layers", 0, "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["evaluation_images"] == 10 and len(result["layers"]) == 60
    top = result["ranking"][:4]
    assert "/blocks/blocks.0/dw/conv/Conv" in top, top


class _CountingScorer:
    """A stand-in Scorer: top-1 from a formula of the changes, every new configuration counted."""

    def __init__(self, score):
        self.score, self.memo = score, {}

    def known(self, changes):
        return self.memo.get(tuple(sorted(changes.items())))

    def top1(self, changes, methods=None):
        return self.memo.setdefault(tuple(sorted(changes.items())), self.score(changes))


def _layers(n, prefer_int16=()):
    from types import SimpleNamespace

    return [SimpleNamespace(node=f"L{k}", isolated=SimpleNamespace(noise=1.0),
                            variants={"int16": SimpleNamespace(noise=0.1 if k in prefer_int16 else 0.9)})
            for k in range(n)]


def test_search_starts_from_scored_prefixes_and_falls_back_to_float():
    from npuforge.analysis.search import search

    # each float layer +2 points, each int16 one +1; goal 90 from 80: five float layers
    score = lambda ch: 80.0 + sum(2.0 if f == "float" else 1.0 for f in ch.values())  # noqa: E731
    layers = _layers(8)
    scorer = _CountingScorer(score)
    for n in (1, 3, 6):  # what explain scored: the worst n in float
        scorer.top1({f"L{k}": "float" for k in range(n)})
    s = search(scorer, layers, 91.0, 80.0, 1.0, max_layers=8)
    assert s["reached"] and s["changes"] == {f"L{k}": "float" for k in range(5)} and s["top1"] == 90.0
    assert "L7" not in {n for key in scorer.memo for n, _ in key}  # the whole list never needed scoring
    # int16 preferred everywhere but never enough: the search retries with every candidate in float
    layers = _layers(8, prefer_int16=range(8))
    scorer = _CountingScorer(score)
    s = search(scorer, layers, 91.0, 80.0, 1.0, max_layers=8)
    assert s["reached"] and s["changes"] == {f"L{k}": "float" for k in range(5)}
