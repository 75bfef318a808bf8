"""Fuzzing the IR text reader and checker (tests/fuzz_harness.py says what a clean end is).

A small quantized model is written with npuforge's own writer; then lines of the text graph are
mutated field by field -- a JSON attribute, quant or qnode entry set to an extreme, a wrong type,
null or removed, a dim set to 0 / -1 / 10^12, a line deleted, repeated or cut, the weights line
pointed at an endless, huge or foreign file -- and each file goes through ``npuforge check``,
``run --mode int`` and ``compile``. Named tests below pin each refusal of issue 34.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import numpy as np
import pytest
from fuzz_harness import fuzz_cases, mutations, run_case
from onnx import TensorProto, helper, numpy_helper

import npuforge
from npuforge.errors import NpuforgeError
from npuforge.frontend.onnx_importer import import_onnx
from npuforge.ir import textio

pytestmark = pytest.mark.slow  # seconds of mutated inputs; their verdicts do not depend on float kernels


def _float_model():
    rng = np.random.default_rng(5)
    n = helper.make_node
    consts = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
              numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b"),
              numpy_helper.from_array(rng.normal(0, 0.1, (5, 32)).astype(np.float32), "gw"),
              numpy_helper.from_array(np.zeros(5, np.float32), "gb")]
    nodes = [n("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Relu", ["c"], ["r"], name="relu"),
             n("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             n("Concat", ["p", "p"], ["cc"], name="concat", axis=1),
             n("AveragePool", ["cc"], ["ap"], name="avg", kernel_shape=[2, 2], strides=[2, 2]),
             n("Flatten", ["ap"], ["f"], name="flatten", axis=1),
             n("Gemm", ["f", "gw", "gb"], ["y"], name="gemm", transB=1)]
    graph = helper.make_graph(nodes, "irfuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return import_onnx(model)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    folder = tmp_path_factory.mktemp("irfuzz")
    rng = np.random.default_rng(0)
    graph = npuforge.quantize(_float_model(), [rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(2)], {})
    textio.save(graph, folder / "q.nfir")
    np.save(folder / "x.npy", rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32))
    return folder


EXTREMES = [None, 0, -1, 1, 2**31, 10**12, -2**63, 1e38, float("nan"), "x", [], [None], {}, [1.5, 2.5], "\u00e9" * 3]


def _mutate_json(obj, rng, keep_keys=False):
    """One key of a JSON object set to an extreme, a wrong type, null, or removed; or the whole
    object replaced by a list, a number or null. ``keep_keys``: no key removed, no empty object."""
    if not isinstance(obj, dict) or not obj or rng.random() < 0.1:
        return rng.choice([[], [obj], 3, None, "text"] + ([] if keep_keys else [{}]))
    key = rng.choice(sorted(obj))
    if rng.random() < 0.2 and not keep_keys:
        del obj[key]
    elif isinstance(obj[key], list) and obj[key] and rng.random() < 0.5:
        obj[key][rng.randrange(len(obj[key]))] = rng.choice(EXTREMES)
    else:
        obj[key] = rng.choice(EXTREMES)
    return obj


def mutate_text(text: str, rng: random.Random, weights_options: list) -> str:
    lines = text.splitlines()
    k = rng.randrange(1, len(lines))
    line = lines[k]
    kind = rng.randrange(6)
    brace = line.find("{")
    # Quantization entries are not emptied or cut before their JSON (a quantized node without its
    # parameters or integers is legal IR where the quantizer kept it in float); they may be deleted.
    entry = line.startswith(("quant ", "qnode "))
    if kind <= 1 and brace >= 0:  # a JSON field (attributes, quant, qnode, meta)
        obj = _mutate_json(json.loads(line[brace:]), rng, keep_keys=entry)
        lines[k] = line[:brace] + json.dumps(obj)
    elif kind == 2 and "[" in line:  # a dim
        dims = list(re.finditer(r"(?<=[\[,])[^\[\],]*(?=[\],])", line))
        if dims:
            d = rng.choice(dims)
            new = str(rng.choice([0, -1, 1, 7, 2**31, 10**12, "N"]))
            lines[k] = line[:d.start()] + new + line[d.end():]
    elif kind == 3:  # the weights line names another file
        at = next((i for i, ln in enumerate(lines) if ln.startswith("weights ")), 2)
        lines[at:at + 1] = [rng.choice(weights_options)]
    elif kind == 4:  # a line deleted, repeated or moved
        choice = rng.randrange(3)
        if choice == 0:
            del lines[k]
        elif choice == 1:
            lines.insert(rng.randrange(1, len(lines)), line)
        else:
            lines.insert(rng.randrange(1, len(lines)), lines.pop(k))
    else:  # a line cut short (an entry inside its JSON)
        lines[k] = line[:rng.randrange(brace + 1 if entry else 0, len(line) + 1)]
    return "\n".join(lines) + "\n"


def _weights_lines(work):
    """'weights' lines naming an endless device, a sparse 2^40-byte file, the graph itself, a missing
    file, and a safetensors file whose header declares more than it holds."""
    huge = work / "huge.safetensors"
    if not huge.exists():
        with open(huge, "wb") as f:
            f.truncate(1 << 40)
    blob = (work / "q.safetensors").read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"][1] += 10**12
    text = json.dumps(header).encode()
    (work / "lying.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + n:])
    digest = "0" * 64
    return [f'weights "{p}" sha256 {digest}' for p in ("/dev/zero", huge, "q.nfir", "missing.safetensors",
                                                        work / "lying.safetensors")]


def test_seed_runs_and_compiles(work, tmp_path):
    q = work / "q.nfir"
    assert run_case(["check", q])[0] == 0
    assert run_case(["run", q, "--input", work / "x.npy", "--mode", "int", "--output", tmp_path / "y.npz"])[0] == 0
    assert run_case(["compile", q, "-o", tmp_path / "p.npub"])[0] == 0


def test_fuzz_ir_text(work, tmp_path):
    rng = random.Random(34)
    text = (work / "q.nfir").read_text()
    weights = _weights_lines(work)
    shutil.copy(work / "q.safetensors", tmp_path / "q.safetensors")
    byte_cases = iter(mutations(text.encode(), rng, fuzz_cases(120)))
    protect = [tmp_path / "q.safetensors", work / "lying.safetensors"]
    for case in range(fuzz_cases(120)):
        path = tmp_path / "q.nfir"
        if case % 6 == 5:
            path.write_bytes(next(byte_cases))
        else:
            mutated = mutate_text(text, rng, weights)
            if rng.random() < 0.3:
                mutated = mutate_text(mutated, rng, weights)
            path.write_text(mutated)
        code, _ = run_case(["check", path], protect=protect)
        if code == 0 or case % 3 == 0:  # a file check passes must run and compile, or be refused in one line
            run_case(["run", path, "--input", work / "x.npy", "--mode", "int", "--output", tmp_path / "y.npz", "--force"],
                     protect=protect)
            run_case(["compile", path, "-o", tmp_path / "p.npub", "--force"], protect=protect)


# -- one named test per refusal -------------------------------------------------------------


def _edited(work, tmp_path, old, new):
    text = (work / "q.nfir").read_text()
    assert re.search(old, text, flags=re.M), old
    (tmp_path / "q.nfir").write_text(re.sub(old, new, text, count=1, flags=re.M))
    shutil.copy(work / "q.safetensors", tmp_path / "q.safetensors")
    return tmp_path / "q.nfir"


def refused(path, *fragments):
    with pytest.raises(NpuforgeError) as e:
        textio.load(path)
    for f in fragments:
        assert f in str(e.value), str(e.value)


def test_quant_entry_that_is_a_list(work, tmp_path):
    refused(_edited(work, tmp_path, r"^(quant \S+) \{.*\}$", r"\1 [1, 2]"), "q.nfir:", "dtype, scale")


def test_quant_entry_without_dtype(work, tmp_path):
    refused(_edited(work, tmp_path, r'^(quant .*)"dtype": "[a-z0-9]+", ', r"\1"), "dtype, scale")


def test_qnode_without_multiplier_is_named_by_the_simulator(work, tmp_path):
    path = _edited(work, tmp_path, r'^(qnode conv \{.*)"multiplier": "[^"]*", ', r"\1")
    code, err = run_case(["run", path, "--input", work / "x.npy", "--mode", "int", "--output", tmp_path / "y.npz"])
    assert code in (1, 2) and "multiplier" in err, err


def test_a_quantized_node_reading_a_value_without_parameters_is_refused(work, tmp_path):
    path = _edited(work, tmp_path, r"^quant x \{.*\}\n", "")
    for command in (["run", path, "--input", work / "x.npy", "--mode", "int", "--output",
                                      tmp_path / "y.npz"], ["compile", path, "-o", tmp_path / "p.npub"]):
        code, err = run_case(command)
        assert code in (1, 2) and "node 'conv' (Conv): input 'x' has no quantization parameters" in err, err


def test_a_concat_of_a_value_without_parameters_compiles_as_a_node_command(work, tmp_path):
    """A Concat moves codes (no integers of its own): a float input is legal IR, quantized by the
    integer simulator's kernel; the compiler gives it a node command instead of failing on it."""
    path = _edited(work, tmp_path, r"^quant p \{.*\}\n", "")  # the Concat(p, p) -> cc
    code, err = run_case(["compile", path, "-o", tmp_path / "p.npub"])
    assert code == 0, err


def test_dim_of_10_to_the_12(work, tmp_path):
    refused(_edited(work, tmp_path, r"^input x: float32\[1,", "input x: float32[1000000000000,"), "limit of 2^31")


def test_meta_that_is_not_an_object(work, tmp_path):
    path = _edited(work, tmp_path, r"^output y$", "output y\nmeta []")
    refused(path, "meta must be a JSON object")
    code, err = run_case(["compile", path, "-o", tmp_path / "p.npub"])
    assert code == 2 and "meta" in err, err


def test_null_attribute(work, tmp_path):
    path = _edited(work, tmp_path, r'"axis": 1', '"axis": null')
    problems = textio.load(path).problems()
    assert any("(Concat): attribute 'axis' is None" in p for p in problems), problems


@pytest.mark.parametrize("target", ["zero", "huge.safetensors", "lying.safetensors"])
def test_weights_line_naming_an_endless_huge_or_lying_file(work, tmp_path, target):
    lines = {os.path.basename(ln.split('"')[1]): ln for ln in _weights_lines(work)}
    path = _edited(work, tmp_path, r"^weights .*$", lines[target])
    refused(path, "regular file" if target == "zero" else "safetensors")
