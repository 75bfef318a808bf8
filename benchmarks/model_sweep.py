"""Coverage sweep: 40+ public architectures through npuforge, one at a time.

Each architecture is built with random weights (``pretrained=False`` /
``weights=None``: this measures coverage and numerics, not accuracy), exported
with ``torch.onnx.export(model.eval(), x, path, opset_version=17, dynamo=False)``
(x: batch 1, seeded, as an NPU program runs) and taken through npuforge's Python API:

  1. import      ``npuforge.load``; float max |npuforge - ONNX Runtime| over
                 max |ONNX Runtime| on a seeded random input (max over outputs)
  2. quantize    ``npuforge.quantize(graph, calib, {}, log=...)`` on 4 seeded
                 random batches of 1 (standard-normal images, or token ids for
                 the encoder), default config (minmax, per-channel int8 weights,
                 uint8 activations): the nodes kept in float with the
                 quantizer's reason (its warnings), and the Concats it put in
                 int16 (``metadata["quantization"]["int16_concats"]``)
  3. numerics    cosine (flattened, float64) per output of the integer
                 simulator (``IntegerSimulator(q, "fixedpoint")``) vs fake-quant
                 (``run_fake_quant``), and of fake-quant vs the float graph
                 (npuforge's float executor on the imported graph), same
                 seeded input as step 1
  4. lowering    ``make_simulator(q, "fixedpoint", "ort")``: accepted, or the
                 reason it gives; when accepted, it is run and its output codes
                 are compared with the plain integer simulator's
  5. QDQ         ``to_qdq_onnx(q)`` in an ONNX Runtime session with its default
                 optimizations (ORT_ENABLE_ALL): ok or the error, cosine vs
                 fake-quant per output
  6. compile     ``compile_graph`` for npu256 and npu1k: NPU share of MACs, CPU ops, and the program
                 simulator's output codes against the integer simulator's (first sample)
  7. TFLite      quantized again with ``QuantConfig(target="tflite")`` (same calibration), exported
                 by ``to_tflite``, and LiteRT's reference kernels against the integer simulator on
                 2 seeded inputs (``npuforge.export.litert_check.compare``; needs ``ai-edge-litert``
                 in the sweep venv); ``--export-dir`` keeps each export for
                 ``benchmarks/compile_vs_vela.py``
  8. seconds     per stage and for the whole model (build + export included)

Each model runs in its own subprocess (``--worker``) under a timeout, so a crash,
a hang or an exception in one never stops the sweep; every failure is recorded
with its message and the stage it happened in. The worker writes its record
after every stage, so a crash keeps what was measured before it.

Set-up (torchvision, which timm needs, does not import beside torch 2.13.0 in
npuforge's own .venv, so the sweep has a venv of its own, outside the repo)::

    python3 -m venv /work/sweep-venv
    /work/sweep-venv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /work/sweep-venv/bin/pip install timm            # 1.0.31
    /work/sweep-venv/bin/pip install ultralytics     # optional: YOLOv8n built from its yaml, no weights
    /work/sweep-venv/bin/pip install -e /work/main onnxscript
    /work/sweep-venv/bin/pip install ai-edge-litert==2.3.0   # the TFLite stage's LiteRT check

Run (one model at a time, one thread)::

    OMP_NUM_THREADS=1 /work/sweep-venv/bin/python benchmarks/model_sweep.py --out results.json
    # npuforge as committed at a revision (git archive), not the working tree (docs/coverage.md):
    OMP_NUM_THREADS=1 /work/sweep-venv/bin/python benchmarks/model_sweep.py --rev HEAD --out r.json --markdown t.md
    OMP_NUM_THREADS=1 /work/sweep-venv/bin/python benchmarks/model_sweep.py --models resnet18,bert_tiny
    /work/sweep-venv/bin/python benchmarks/model_sweep.py --report results.json --markdown table.md   # no run

``--list`` prints the models and their families. The table (markdown) is printed
at the end; ``--markdown FILE`` also writes it with the summary (counts per
criterion, failures grouped by cause with each exact message).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

BATCH = 1  # what an NPU program runs (the compile stage needs it); the calibration still sees 8 images
CALIB_BATCHES = 8
SPEED_RUNS = 5  # timed runs of the lowered simulator and of ONNX Runtime's QDQ session, each
EVAL_SEED = 1234
VOCAB, SEQ = 1000, 32

# ---------------------------------------------------------------------------------------------
# the models: name -> (family, builder); a builder returns (module, example input of batch BATCH)
# ---------------------------------------------------------------------------------------------


def _image(size: int):
    import torch

    return torch.from_numpy(np.random.default_rng(EVAL_SEED).standard_normal((BATCH, 3, size, size))
                            .astype(np.float32))


def _timm(name: str, size: int, **kwargs):
    def build():
        import timm

        return timm.create_model(name, pretrained=False, **kwargs), _image(size)

    return build


def _torchvision(name: str, size: int, **kwargs):
    def build():
        import torchvision

        return torchvision.models.get_model(name, weights=None, **kwargs), _image(size)

    return build


def _unet():
    import torch
    from torch import nn

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        """A small UNet (3 levels): MaxPool down, ConvTranspose up twice and a bilinear
        upsample (align_corners=True, as milesial/Pytorch-UNet) once, skip Concats."""

        def __init__(self, c=16, classes=2):
            super().__init__()
            self.inc = block(3, c)
            self.down1, self.down2, self.down3 = block(c, 2 * c), block(2 * c, 4 * c), block(4 * c, 8 * c)
            self.pool = nn.MaxPool2d(2)
            self.up3 = nn.ConvTranspose2d(8 * c, 4 * c, 2, stride=2)
            self.dec3 = block(8 * c, 4 * c)
            self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
            self.dec2 = block(4 * c, 2 * c)
            self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.dec1 = block(3 * c, c)
            self.head = nn.Conv2d(c, classes, 1)

        def forward(self, x):
            x1 = self.inc(x)
            x2 = self.down1(self.pool(x1))
            x3 = self.down2(self.pool(x2))
            x4 = self.down3(self.pool(x3))
            y = self.dec3(torch.cat([self.up3(x4), x3], 1))
            y = self.dec2(torch.cat([self.up2(y), x2], 1))
            y = self.dec1(torch.cat([self.up1(y), x1], 1))
            return self.head(y)

    return UNet(), _image(128)


def _yolo_head():
    import torch
    from torch import nn

    def cbs(cin, cout, s):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

    class TinyYolo(nn.Module):
        """A YOLOv5-style detector: 3 levels (strides 8, 16, 32), boxes decoded to pixels
        (xy from the grid, wh from anchors) concatenated with sigmoid objectness and class
        scores, all levels concatenated: output [N, 4 + 1 + classes, anchors]."""

        def __init__(self, classes=3, size=160):
            super().__init__()
            self.stem = nn.Sequential(cbs(3, 16, 2), cbs(16, 32, 2), cbs(32, 32, 2))
            self.s16, self.s32 = cbs(32, 64, 2), cbs(64, 64, 2)
            self.heads = nn.ModuleList(nn.Conv2d(c, 5 + classes, 1) for c in (32, 64, 64))
            self.strides = (8, 16, 32)
            self.anchor = (10.0, 30.0, 90.0)
            for i, s in enumerate(self.strides):
                n = size // s
                gy, gx = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
                self.register_buffer(f"grid{i}", torch.stack([gx, gy]).float().view(1, 2, n, n))

        def forward(self, x):
            f8 = self.stem(x)
            f16 = self.s16(f8)
            f32 = self.s32(f16)
            outs = []
            for i, (f, head) in enumerate(zip((f8, f16, f32), self.heads)):
                t = head(f).sigmoid()
                xy = (t[:, :2] * 2 - 0.5 + getattr(self, f"grid{i}")) * self.strides[i]
                wh = (t[:, 2:4] * 2) ** 2 * self.anchor[i]
                outs.append(torch.cat([xy, wh, t[:, 4:]], 1).flatten(2))
            return torch.cat(outs, 2)

    return TinyYolo(), _image(160)


def _yolov8n():
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)  # the architecture only: no weights
    for m in model.modules():
        if hasattr(m, "export"):
            m.export = True  # Detect returns the decoded [N, 84, anchors] tensor (boxes in pixels, sigmoid scores)
        if hasattr(m, "format"):
            m.format = "onnx"
    return model, _image(160)


def _bert_tiny():
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, d, heads, ff):
            super().__init__()
            self.h, self.dh = heads, d // heads
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            n, t, d = x.shape

            def split(y):
                return y.view(n, t, self.h, self.dh).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(n, t, d)
            x = self.ln1(x + self.o(y))
            return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))

    class Encoder(nn.Module):
        """BERT-style: token embedding (Gather) + position embedding, LayerNorm, 2 layers of
        4-head self-attention and a GELU (erf) MLP, post-LN; outputs the hidden states and
        the tanh pooler of the first token."""

        def __init__(self, vocab=VOCAB, d=128, layers=2, heads=4, ff=512, seq=SEQ):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(Layer(d, heads, ff) for _ in range(layers))
            self.pool = nn.Linear(d, d)

        def forward(self, ids):
            x = self.ln(self.tok(ids) + self.pos)
            for layer in self.layers:
                x = layer(x)
            return x, torch.tanh(self.pool(x[:, 0]))

    ids = torch.from_numpy(np.random.default_rng(EVAL_SEED).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64))
    return Encoder(), ids


def _torchvision_segmentation(name: str, size: int):
    """A torchvision segmentation model, its dict output reduced to the 'out' map."""
    def build():
        import torch
        import torchvision

        class Out(torch.nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(x)["out"]

        net = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=21)
        return Out(net), _image(size)

    return build


def _kws_dscnn1d():
    """Keyword spotting on 40 MFCCs x 98 frames, the 1-D depthwise-separable CNN of the "Hello Edge"
    DS-CNN class: Conv1d stem, 4 depthwise + pointwise blocks, average pool over time, a classifier."""
    import torch
    from torch import nn

    def ds(c):
        return nn.Sequential(nn.Conv1d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm1d(c), nn.ReLU(),
                             nn.Conv1d(c, c, 1, bias=False), nn.BatchNorm1d(c), nn.ReLU())

    net = nn.Sequential(nn.Conv1d(40, 64, 10, stride=2, padding=4, bias=False), nn.BatchNorm1d(64), nn.ReLU(),
                        *(ds(64) for _ in range(4)), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, 12))
    x = torch.from_numpy(np.random.default_rng(EVAL_SEED).standard_normal((BATCH, 40, 98)).astype(np.float32))
    return net, x


class _FirstOutput:
    """Wraps a Hugging Face model so the export sees one input and one tensor output."""

    @staticmethod
    def wrap(model, key: str):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                return getattr(self.model(x), key)

        return Wrapped()


def _hf_text(kind: str):
    """A Hugging Face `transformers` encoder or decoder built from a small config (no weights):
    token ids [1, SEQ] in, the last hidden states out."""
    def build():
        import torch
        import transformers as tr

        small = dict(vocab_size=VOCAB, max_position_embeddings=64)
        if kind == "distilbert":
            model = tr.DistilBertModel(tr.DistilBertConfig(dim=128, n_layers=2, n_heads=4, hidden_dim=512, **small))
        elif kind == "gpt2":
            model = tr.GPT2Model(tr.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64))
        elif kind == "albert":
            model = tr.AlbertModel(tr.AlbertConfig(embedding_size=64, hidden_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=512, **small))
        else:
            raise ValueError(kind)
        model.config.return_dict = True
        ids = torch.from_numpy(np.random.default_rng(EVAL_SEED).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64))
        return _FirstOutput.wrap(model.eval(), "last_hidden_state"), ids

    return build


def _hf_wav2vec2():
    """Hugging Face Wav2Vec2 from a small config (no weights): raw audio [1, 8000] in, through its 1-D
    convolutional feature extractor (GroupNorm), the grouped positional convolution and 2 transformer
    layers; the last hidden states out."""
    import torch
    import transformers as tr

    config = tr.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                               conv_dim=(32, 32, 32, 32, 32, 32, 32), num_conv_pos_embeddings=16,
                               num_conv_pos_embedding_groups=4, do_stable_layer_norm=False)
    model = tr.Wav2Vec2Model(config).eval()
    x = torch.from_numpy(np.random.default_rng(EVAL_SEED).standard_normal((BATCH, 8000)).astype(np.float32))
    return _FirstOutput.wrap(model, "last_hidden_state"), x



CNN, VIT, TV, HAND = "timm CNN", "timm transformer/hybrid", "torchvision", "hand-written"
HF = "transformers (config, no weights)"
MODELS: dict[str, tuple[str, object]] = {
    # timm CNNs
    "resnet18": (CNN, _timm("resnet18", 160)),
    "resnet50": (CNN, _timm("resnet50", 160)),
    "mobilenetv2_100": (CNN, _timm("mobilenetv2_100", 160)),
    "mobilenetv3_small_100": (CNN, _timm("mobilenetv3_small_100", 160)),
    "mobilenetv3_large_100": (CNN, _timm("mobilenetv3_large_100", 160)),
    "efficientnet_b0": (CNN, _timm("efficientnet_b0", 160)),
    "efficientnet_lite0": (CNN, _timm("efficientnet_lite0", 160)),
    "regnetx_002": (CNN, _timm("regnetx_002", 160)),
    "regnety_002": (CNN, _timm("regnety_002", 160)),
    "densenet121": (CNN, _timm("densenet121", 160)),
    "inception_v3": (CNN, _timm("inception_v3", 160)),
    "ghostnet_100": (CNN, _timm("ghostnet_100", 160)),
    "mnasnet_100": (CNN, _timm("mnasnet_100", 160)),
    "rexnet_100": (CNN, _timm("rexnet_100", 160)),
    "hrnet_w18_small": (CNN, _timm("hrnet_w18_small", 160)),
    "convnext_atto": (CNN, _timm("convnext_atto", 160)),
    "convnext_nano": (CNN, _timm("convnext_nano", 160)),
    "repvgg_a0": (CNN, _timm("repvgg_a0", 160)),
    "dla34": (CNN, _timm("dla34", 160)),
    "cspresnet50": (CNN, _timm("cspresnet50", 160)),
    "ese_vovnet19b_dw": (CNN, _timm("ese_vovnet19b_dw", 160)),
    "lcnet_050": (CNN, _timm("lcnet_050", 160)),
    "mobileone_s0": (CNN, _timm("mobileone_s0", 160)),
    "mixnet_s": (CNN, _timm("mixnet_s", 160)),
    "ghostnetv2_100": (CNN, _timm("ghostnetv2_100", 160)),
    "mobilenetv4_conv_small": (CNN, _timm("mobilenetv4_conv_small", 160)),
    "repvit_m0_9": (CNN, _timm("repvit_m0_9", 160)),
    "hgnetv2_b0": (CNN, _timm("hgnetv2_b0", 160)),
    "tinynet_a": (CNN, _timm("tinynet_a", 160)),
    "fbnetv3_b": (CNN, _timm("fbnetv3_b", 160)),
    "res2net50_14w_8s": (CNN, _timm("res2net50_14w_8s", 160)),
    "inception_next_atto": (CNN, _timm("inception_next_atto", 160)),
    # timm transformers and hybrids
    "vit_tiny_patch16_224": (VIT, _timm("vit_tiny_patch16_224", 160, img_size=160)),
    "deit_tiny_patch16_224": (VIT, _timm("deit_tiny_patch16_224", 160, img_size=160)),
    "swin_tiny_patch4_window7_224": (VIT, _timm("swin_tiny_patch4_window7_224", 224)),
    "mobilevit_xxs": (VIT, _timm("mobilevit_xxs", 128)),
    "mobilevitv2_050": (VIT, _timm("mobilevitv2_050", 128)),
    "efficientformer_l1": (VIT, _timm("efficientformer_l1", 224)),
    "poolformer_s12": (VIT, _timm("poolformer_s12", 160)),
    "edgenext_xx_small": (VIT, _timm("edgenext_xx_small", 160)),
    "fastvit_t8": (VIT, _timm("fastvit_t8", 160)),
    "levit_128s": (VIT, _timm("levit_128s", 224)),
    "coat_lite_tiny": (VIT, _timm("coat_lite_tiny", 224)),
    "tiny_vit_5m_224": (VIT, _timm("tiny_vit_5m_224", 224)),
    "efficientvit_m0": (VIT, _timm("efficientvit_m0", 224)),
    "pvt_v2_b0": (VIT, _timm("pvt_v2_b0", 160)),
    "gcvit_xxtiny": (VIT, _timm("gcvit_xxtiny", 224)),
    "xcit_nano_12_p16_224": (VIT, _timm("xcit_nano_12_p16_224", 160)),
    "pit_ti_224": (VIT, _timm("pit_ti_224", 224)),
    "resmlp_12_224": (VIT, _timm("resmlp_12_224", 224)),
    "mobilenetv4_hybrid_medium": (VIT, _timm("mobilenetv4_hybrid_medium", 160)),
    "efficientformerv2_s0": (VIT, _timm("efficientformerv2_s0", 224)),
    "visformer_tiny": (VIT, _timm("visformer_tiny", 224)),
    # torchvision
    "tv_squeezenet1_0": (TV, _torchvision("squeezenet1_0", 160)),
    "tv_squeezenet1_1": (TV, _torchvision("squeezenet1_1", 160)),
    "tv_googlenet": (TV, _torchvision("googlenet", 160, aux_logits=False, init_weights=True)),
    "tv_shufflenet_v2_x0_5": (TV, _torchvision("shufflenet_v2_x0_5", 160)),
    "tv_mnasnet0_5": (TV, _torchvision("mnasnet0_5", 160)),
    "tv_mobilenet_v3_small": (TV, _torchvision("mobilenet_v3_small", 160)),
    "tv_regnet_y_400mf": (TV, _torchvision("regnet_y_400mf", 160)),
    "tv_lraspp_mobilenet_v3_large": (TV, _torchvision_segmentation("lraspp_mobilenet_v3_large", 160)),
    "tv_deeplabv3_mobilenet_v3_large": (TV, _torchvision_segmentation("deeplabv3_mobilenet_v3_large", 160)),
    # hand-written / built from a yaml
    "unet_small": (HAND, _unet),
    "yolo_head_tiny": (HAND, _yolo_head),
    "yolov8n": ("ultralytics (yaml, no weights)", _yolov8n),
    "bert_tiny": (HAND, _bert_tiny),
    "kws_dscnn1d": (HAND, _kws_dscnn1d),
    "hf_distilbert_small": (HF, _hf_text("distilbert")),
    "hf_gpt2_small": (HF, _hf_text("gpt2")),
    "hf_albert_small": (HF, _hf_text("albert")),
    "hf_wav2vec2_small": (HF, _hf_wav2vec2),
}

# detectors: the score channels (axis 1 from index 4 on: after the 4 box coordinates) are
# also compared on their own, since the boxes (in pixels) dominate a whole-output cosine
SCORE_SLICES = {"yolo_head_tiny": 4, "yolov8n": 4}

# ---------------------------------------------------------------------------------------------
# the worker: one model, every stage, the record rewritten after each
# ---------------------------------------------------------------------------------------------


def cosine(a, b) -> float | None:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        return None
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("nan")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b / (na * nb))


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def ort_session(model, threads: int = 1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # the default, said explicitly
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _by_position(q_outputs, ref: dict, ref_outputs) -> dict:
    """Map the quantized graph's output names to the reference's (same name, else same position)."""
    return {name: (name if name in ref else ref_outputs[i]) for i, name in enumerate(q_outputs)}


FLOAT_WARNING = re.compile(r"^node '(?P<node>.*)' \((?P<op>[^)]*)\) kept in float: (?P<reason>.*)$", re.S)


def run_worker(name: str, record_path: Path, workdir: Path, export_dir: Path | None = None) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    family, build = MODELS[name]
    rec = {"model": name, "family": family, "stages": {}, "seconds": {}}
    t_model = time.perf_counter()

    def save():
        rec["seconds"]["total"] = round(time.perf_counter() - t_model, 2)
        record_path.write_text(json.dumps(rec, indent=1, default=str))

    def stage(key, fn):
        """Run fn(); the stage is 'ok' or its one-line error (traceback tail kept)."""
        t = time.perf_counter()
        try:
            out = fn()
            rec["stages"][key] = "ok"
            return out
        except Exception as e:  # noqa: BLE001 -- every failure is a result here
            rec["stages"][key] = one_line(e)
            rec.setdefault("tracebacks", {})[key] = traceback.format_exc(limit=-6)
            return None
        finally:
            rec["seconds"][key] = round(time.perf_counter() - t, 3)
            save()

    save()
    # 0. build and export ---------------------------------------------------------------------
    built = stage("build", build)
    if built is None:
        return
    module, x = built
    rec["input_shape"] = list(x.shape)
    rec["parameters"] = int(sum(p.numel() for p in module.parameters()))
    path = workdir / f"{name}.onnx"

    def export():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.no_grad():
                torch.onnx.export(module.eval(), x, str(path), opset_version=17, dynamo=False)

    stage("export", export)
    if rec["stages"]["export"] != "ok":
        return
    x_np = x.numpy()

    # 1. import and float agreement with ONNX Runtime -------------------------------------------
    import npuforge

    graph = stage("import", lambda: npuforge.load(path))
    if graph is None:
        return
    rec["nodes"] = len(graph.nodes)
    rec["ops"] = dict(Counter(n.op for n in graph.nodes).most_common())
    feeds = {graph.inputs[0]: x_np}

    def float_check():
        sess = ort_session(str(path))
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {sess.get_inputs()[0].name: x_np})))
        got = graph.run(feeds)
        rel = {}
        for i, out in enumerate(graph.outputs):
            r = ref.get(out, list(ref.values())[i])
            rel[out] = float(np.abs(got[out].astype(np.float64) - r).max() / max(float(np.abs(r).max()), 1e-30))
        rec["float_rel_err"] = rel
        return got

    float_out = stage("float_vs_ort", float_check)

    # 2. quantize -----------------------------------------------------------------------------
    rng_calib = [np.random.default_rng(seed) for seed in range(CALIB_BATCHES)]
    if x_np.dtype == np.int64:
        calib = [r.integers(0, VOCAB, x_np.shape).astype(np.int64) for r in rng_calib]
    else:
        calib = [r.standard_normal(x_np.shape).astype(np.float32) for r in rng_calib]
    messages: list[str] = []
    q = stage("quantize", lambda: npuforge.quantize(graph, calib, {}, log=messages.append))
    rec["warnings"] = messages
    if q is None:
        return
    meta = q.metadata["quantization"]
    rec["quantized_nodes"] = meta.get("quantized_nodes")
    rec["q_nodes"] = len(q.nodes)
    kept = []
    for m in messages:
        hit = FLOAT_WARNING.match(m)
        if hit:
            kept.append({"node": hit["node"], "op": hit["op"], "reason": " ".join(hit["reason"].split())})
    listed = set(meta.get("float_nodes", []))
    for n in q.nodes:  # a float node the warnings did not name (should not happen): keep it, reason unknown
        if n.name in listed and not any(k["node"] == n.name for k in kept):
            kept.append({"node": n.name, "op": n.op, "reason": "(no warning)"})
    rec["float_nodes"] = kept
    rec["int16_concats"] = meta.get("int16_concats", [])
    save()

    # 3. integer simulator vs fake-quant, fake-quant vs float ---------------------------------
    from npuforge.sim.fake_quant import run_fake_quant
    from npuforge.sim.integer import IntegerSimulator

    qfeeds = {q.inputs[0]: x_np}
    fake = stage("fake_quant", lambda: run_fake_quant(q, qfeeds))
    if fake is not None and float_out is not None:
        names = _by_position(q.outputs, float_out, graph.outputs)
        rec["cos_fake_vs_float"] = {o: cosine(fake[o], float_out[names[o]]) for o in q.outputs}
    plain = {}

    def integer():
        sim = IntegerSimulator(q, "fixedpoint")
        out = sim.run(qfeeds)
        plain["codes"] = sim.run(qfeeds, dequantize=False)
        return out

    ints = stage("integer_sim", integer)
    if ints is not None and fake is not None:
        rec["cos_int_vs_fake"] = {o: cosine(ints[o], fake[o]) for o in q.outputs}
    zero = {kind: [o for o in q.outputs if o in out and not np.any(out[o])]
            for kind, out in (("fake-quant", fake or {}), ("integer", ints or {}))}
    zero = {kind: outs for kind, outs in zero.items() if outs}
    if zero:
        rec["all_zero_outputs"] = zero  # a cosine against an all-zero vector is reported as 0
    k = SCORE_SLICES.get(name)
    if k is not None and fake is not None and float_out is not None:
        o = q.outputs[0]
        ref = float_out[_by_position(q.outputs, float_out, graph.outputs)[o]]
        rec["scores"] = {"float_range": [float(ref[:, k:].min()), float(ref[:, k:].max())],
                         "cos_fake_vs_float": cosine(fake[o][:, k:], ref[:, k:]),
                         "max_abs_fake_vs_float": float(np.abs(fake[o][:, k:] - ref[:, k:]).max()),
                         "distinct_fake_values": int(np.unique(fake[o][:, k:]).size)}
        if ints is not None:
            rec["scores"]["cos_int_vs_fake"] = cosine(ints[o][:, k:], fake[o][:, k:])
    save()

    # 4. the ONNX Runtime lowering ------------------------------------------------------------
    from npuforge.sim.lowered import make_simulator

    lowered = stage("lowering", lambda: make_simulator(q, "fixedpoint", "ort"))
    if lowered is not None and hasattr(lowered, "lowering") and hasattr(lowered, "model"):
        # the IR's ops that run through the float lowering (between conversions of their codes) rather than
        # ONNX Runtime's integer operators, and the lowered program's size
        ops = {n.name: n.op for n in q.nodes}
        in_float = [ops.get(k) for k, how in lowered.lowering.items() if how.startswith("in float")]
        rec["lowered_in_float"] = {op: in_float.count(op) for op in sorted(set(in_float), key=str)}
        rec["lowered_nodes"] = len(lowered.model.graph.node)
    if lowered is not None and plain.get("codes") is not None:
        def compare():
            codes = lowered.run(qfeeds, dequantize=False)
            diff = {}
            for o in q.outputs:
                a, b = np.asarray(codes[o]), np.asarray(plain["codes"][o])
                diff[o] = int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max()) if a.shape == b.shape else None
            rec["lowered_max_code_diff_vs_plain"] = diff

        stage("lowered_run", compare)

    # 5. QDQ in ONNX Runtime ------------------------------------------------------------------
    from npuforge.export import to_qdq_onnx

    qdq_path = workdir / f"{name}.qdq.onnx"

    sessions = {}

    def qdq():
        model = to_qdq_onnx(q)
        qdq_path.write_bytes(model.SerializeToString())
        sess = sessions["qdq"] = ort_session(str(qdq_path))
        res = sess.run(None, {sess.get_inputs()[0].name: x_np})
        return dict(zip([o.name for o in sess.get_outputs()], res))

    got = stage("qdq_ort", qdq)
    if got is not None and fake is not None:
        names = list(got)
        rec["cos_qdq_vs_fake"] = {o: cosine(got.get(o, got[names[i]]), fake[o]) for i, o in enumerate(q.outputs)}
    if got is not None and lowered is not None:
        def speed():
            # the lowered integer simulator against ONNX Runtime's own int8 run of the QDQ file, same input,
            # same thread; the median of SPEED_RUNS interleaved runs after a warm-up of each
            sess = sessions["qdq"]
            feed = {sess.get_inputs()[0].name: x_np}
            times = {"lowered": [], "qdq_ort": []}
            for run in range(SPEED_RUNS + 1):
                for key, fn in (("lowered", lambda: lowered.run(qfeeds)), ("qdq_ort", lambda: sess.run(None, feed))):
                    t = time.perf_counter()
                    fn()
                    if run:
                        times[key].append(time.perf_counter() - t)
            ms = {key: 1e3 * float(np.median(v)) for key, v in times.items()}
            rec["sim_speed"] = {**{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                                "ratio": round(ms["qdq_ort"] / ms["lowered"], 3), "form": lowered.form}

        stage("sim_speed", speed)
    save()

    # 6. the NPU program, on each target: compiled, run by the program simulator on the first sample,
    # its output codes against the integer simulator's -----------------------------------------------
    from npuforge.compiler.binfmt import read_program
    from npuforge.compiler.compile import compile_graph
    from npuforge.compiler.progsim import ProgramSimulator
    from npuforge.compiler.target import load_target
    from npuforge.sim.integer import quantize_input

    p_in = q.values[q.inputs[0]].quant
    one = x_np[:1]
    feeds1 = {q.inputs[0]: quantize_input(one, p_in) if p_in is not None else one}
    rec["compile"] = {}
    for target in COMPILE_TARGETS:
        def compiled(target=target):
            t0 = time.perf_counter()
            program = compile_graph(q, load_target(target))
            seconds = time.perf_counter() - t0
            got = ProgramSimulator(read_program(program.data, name)).run(feeds1)
            want = IntegerSimulator(q, "fixedpoint").run(feeds1, dequantize=False)
            differ = {o: int(np.count_nonzero(np.asarray(got[o]) != np.asarray(want[o]))) for o in q.outputs}
            s = program.stats
            rec["compile"][target] = {"npu_macs_fraction": s["npu_macs_fraction"], "cpu_ops": s["cpu_ops"],
                                      "peak_sram": s["peak_sram"], "sram_budget": s["sram_budget"],
                                      "cycles": s["cycles"], "seconds": round(seconds, 2),
                                      "codes_differing": differ}
        stage(f"compile_{target}", compiled)
        save()

    # 7. the int8 TFLite export: quantized again with target 'tflite' (same calibration), exported, and
    # LiteRT's reference kernels against the integer simulator on TFLITE_SAMPLES seeded inputs ----------
    from npuforge.export.litert_check import compare
    from npuforge.export.tflite_export import to_tflite
    from npuforge.quant import QuantConfig

    qt = stage("tflite_quantize", lambda: npuforge.quantize(graph, calib, QuantConfig(target="tflite"),
                                                            log=lambda m: None))
    data = stage("tflite_export", lambda: to_tflite(qt)) if qt is not None else None
    if data is not None:
        rec["tflite"] = {"bytes": len(data)}
        if export_dir is not None:  # for benchmarks/compile_vs_vela.py: the export and the IR it came from
            from npuforge.ir import textio

            export_dir.mkdir(parents=True, exist_ok=True)
            (export_dir / f"{name}.tflite").write_bytes(data)
            textio.save(qt, export_dir / f"{name}.tflite.nfir")

        def litert():
            rng = np.random.default_rng(EVAL_SEED + 1)
            batches = [{qt.inputs[0]: x_np[:1]}]
            for _ in range(TFLITE_SAMPLES - 1):
                other = (rng.integers(0, VOCAB, x_np[:1].shape).astype(np.int64) if x_np.dtype == np.int64
                         else rng.standard_normal(x_np[:1].shape).astype(np.float32))
                batches.append({qt.inputs[0]: other})
            rec["tflite"]["litert"] = compare(qt, data, batches)

        stage("tflite_litert", litert)
    rec["done"] = True
    save()


# ---------------------------------------------------------------------------------------------
# the driver: one subprocess per model, then the table and the summary
# ---------------------------------------------------------------------------------------------

COMPILE_TARGETS = ("npu256", "npu1k")
TFLITE_SAMPLES = 2
STAGES = ("build", "export", "import", "float_vs_ort", "quantize", "fake_quant", "integer_sim", "lowering",
          "lowered_run", "qdq_ort", "sim_speed") + tuple(f"compile_{t}" for t in COMPILE_TARGETS) + (
          "tflite_quantize", "tflite_export", "tflite_litert")


def run_one(name: str, timeout: float, workdir: Path, export_dir: Path | None = None) -> dict:
    record = workdir / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--record", str(record),
           "--workdir", str(workdir)] + (["--export-dir", str(export_dir)] if export_dir else [])
    start = time.perf_counter()
    status, tail = "ok", ""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            status = f"worker exited with code {proc.returncode}"
            tail = (proc.stderr or proc.stdout)[-2000:]
    except subprocess.TimeoutExpired:
        status = f"timeout after {timeout:.0f} s"
    wall = time.perf_counter() - start
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):
        rec = {"model": name, "family": MODELS[name][0], "stages": {}, "seconds": {}}
    rec["worker"] = status
    if tail:
        rec["worker_stderr_tail"] = tail
    if status != "ok" and not rec.get("done"):
        # the stage that was running when the worker died is the first one without a verdict
        for s in STAGES:
            if s not in rec["stages"]:
                rec["stages"][s] = f"(worker died: {status})"
                break
    rec["seconds"]["wall"] = round(wall, 2)
    for p in (workdir / f"{name}.onnx", workdir / f"{name}.qdq.onnx"):
        p.unlink(missing_ok=True)
    return rec


def environment() -> dict:
    import onnx
    import onnxruntime
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "onnx": onnx.__version__,
           "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "machine": platform.machine(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    for mod in ("torchvision", "timm", "ultralytics"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            env[mod] = f"not importable ({one_line(e)})"
    try:
        import npuforge

        root = Path(npuforge.__file__).resolve().parents[1]
        pkg = Path(npuforge.__file__).resolve().parent
        env["npuforge"] = str(pkg)
        import hashlib

        digest = hashlib.sha256()
        for f in sorted(pkg.rglob("*.py")):
            digest.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
        env["npuforge_sources_sha256"] = digest.hexdigest()[:16]
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "npuforge"],
                               capture_output=True, text=True).stdout.strip()
        env["npuforge_git"] = (head + (" + uncommitted changes under npuforge/" if dirty else "")) or "(no git)"
    except Exception as e:  # noqa: BLE001
        env["npuforge"] = f"not importable ({one_line(e)})"
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
        env["cpu"] = " ".join(x for x in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if x in flags)
    except (OSError, IndexError):
        pass
    return env


# ---------------------------------------------------------------------------------------------
# reading the records
# ---------------------------------------------------------------------------------------------


def _minval(d):
    vals = [v for v in (d or {}).values() if v is not None]
    if not vals:
        return None
    return min(vals, key=lambda v: (not math.isnan(v), v))  # NaN counts as the worst


def _fmt_cos(v) -> str:
    if v is None:
        return "-"
    if math.isnan(v):
        return "NaN"
    return f"{v:.4f}" if v < 0.99995 else f"{v:.5f}"


def _short(msg: str, n: int = 90) -> str:
    msg = msg.replace("|", "\\|")
    return msg if len(msg) <= n else msg[: n - 1] + "…"


def _float_summary(rec) -> str:
    kept = rec.get("float_nodes")
    if kept is None:
        return "-"
    if not kept:
        return "0"
    groups = Counter((k["op"], k["reason"]) for k in kept)
    return f"{len(kept)}: " + "; ".join(f"{n}x {op} ({_short(reason, 50)})" for (op, reason), n in groups.items())


def _lowering_cell(rec) -> str:
    s = rec["stages"].get("lowering")
    if s is None:
        return "-"
    if s == "ok":
        diff = rec.get("lowered_max_code_diff_vs_plain")
        if diff is None:
            return "yes"
        worst = max((v for v in diff.values() if v is not None), default=None)
        speed = rec.get("sim_speed")
        ratio = f", {speed['ratio']:.2f}x ORT int8" if speed else ""
        return ("yes (= plain" if worst == 0 else f"yes (codes differ by {worst}") + ratio + ")"
    return "no: " + _short(_lowering_reason(s), 70)


def _lowering_reason(msg: str) -> str:
    """The refusal without the node name and the advice after ';'."""
    msg = re.sub(r"^UnsupportedError: ", "", msg)
    msg = msg.split("; the plain simulator runs it")[0]
    return re.sub(r"^node '[^']*' ", "", msg)


def _first_failure(rec) -> tuple[str, str] | None:
    for s in STAGES:
        v = rec["stages"].get(s)
        if v is not None and v != "ok" and s not in ("lowering", "lowered_run"):
            return s, v
    return None


def _compile_cell(rec, target: str) -> str:
    s = rec["stages"].get(f"compile_{target}")
    if s is None:
        return "-"
    if s != "ok":
        return "FAIL: " + _short(s, 60)
    c = rec["compile"][target]
    exact = "exact" if not any(c["codes_differing"].values()) else \
        f"{sum(c['codes_differing'].values())} codes differ"
    return f"{100 * c['npu_macs_fraction']:.1f} %, {exact}"


def _tflite_cell(rec) -> str:
    for s in ("tflite_quantize", "tflite_export", "tflite_litert"):
        v = rec["stages"].get(s)
        if v is None:
            return "-"
        if v != "ok":
            return f"FAIL ({s.split('_')[1]}): " + _short(v, 60)
    r = rec["tflite"]["litert"]
    same = "exact" if r["bit_exact_samples"] == r["samples"] else \
        f"{r['codes_differing']} codes differ (max {r['max_code_difference']})"
    return f"{r['bit_exact_samples']}/{r['samples']} {same}"


def table(records: list[dict]) -> str:
    head = ("| model | family | import | float rel. err | nodes left float (ops, reason) | int16 concats | "
            "int vs fake cos (min) | fake vs float cos (min) | ORT lowering | QDQ in ORT (cos vs fake) | "
            + " | ".join(f"{t}: NPU MACs, program vs int" for t in COMPILE_TARGETS)
            + " | TFLite: LiteRT ref vs int | s |")
    lines = [head, "|" + "---|" * (12 + len(COMPILE_TARGETS))]
    for rec in records:
        st = rec["stages"]
        imp = st.get("import")
        if st.get("build", "ok") != "ok":
            imp = "build failed"
        elif st.get("export", "ok") != "ok":
            imp = "export failed"
        imp = "-" if imp is None else ("ok" if imp == "ok" else "FAIL: " + _short(imp, 60))
        rel = rec.get("float_rel_err")
        rel = f"{max(rel.values()):.1e}" if rel else ("-" if st.get("float_vs_ort") in (None, "ok") else "FAIL")
        i16 = rec.get("int16_concats")
        if i16 is None:
            i16 = "-"
        elif i16:
            ratios = ", ".join(f"{c.get('ratio', 0):.0f}x" for c in i16)
            i16 = f"{len(i16)} (ranges {ratios} apart)"
        else:
            i16 = "0"
        ci = _minval(rec.get("cos_int_vs_fake"))
        cf = _minval(rec.get("cos_fake_vs_float"))
        ci_cell = _fmt_cos(ci) if ci is not None else ("FAIL" if st.get("integer_sim") not in (None, "ok") else "-")
        qs = st.get("qdq_ort")
        qdq_cell = "-" if qs is None else ("ok " + _fmt_cos(_minval(rec.get("cos_qdq_vs_fake"))) if qs == "ok"
                                            else "FAIL: " + _short(qs, 60))
        if st.get("quantize") not in (None, "ok"):
            fl = "quantize FAIL: " + _short(st["quantize"], 60)
        else:
            fl = _float_summary(rec)
        zero = rec.get("all_zero_outputs", {})
        if "integer" in zero:
            ci_cell += " (int output all 0)"
        if "fake-quant" in zero:
            ci_cell += " (fake-quant output all 0)"
            cf_cell = _fmt_cos(cf) + " (fake-quant output all 0)"
        else:
            cf_cell = _fmt_cos(cf)
        secs = rec["seconds"].get("total", rec["seconds"].get("wall"))
        worker = "" if rec.get("worker", "ok") == "ok" else f" ({rec['worker']})"
        compiled = " | ".join(_compile_cell(rec, t) for t in COMPILE_TARGETS)
        lines.append(f"| {rec['model']}{worker} | {rec['family']} | {imp} | {rel} | {fl} | {i16} | {ci_cell} | "
                     f"{cf_cell} | {_lowering_cell(rec)} | {qdq_cell} | {compiled} | {_tflite_cell(rec)} | {secs} |")
    return "\n".join(lines)


def _tick(msg: str) -> str:
    return msg.replace("`", "'")


def _cause(msg: str) -> str:
    """A failure message with the model-specific parts (quoted names, long numbers, shapes) blanked."""
    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(r"\[[\d, N]*\]", "[…]", msg)
    msg = re.sub(r"\d{3,}", "N", msg)
    return msg


def int16_norms(rec) -> list[str]:
    """The normalizations the quantizer gave an int16 input, from its warnings."""
    return [m for m in rec.get("warnings", []) if "narrowest input slice" in m]


def summary(records: list[dict]) -> str:
    n = len(records)

    def count(pred):
        return sum(1 for r in records if pred(r))

    ok = lambda r, s: r["stages"].get(s) == "ok"  # noqa: E731
    ci = {r["model"]: _minval(r.get("cos_int_vs_fake")) for r in records}
    cf = {r["model"]: _minval(r.get("cos_fake_vs_float")) for r in records}
    cq = {r["model"]: _minval(r.get("cos_qdq_vs_fake")) for r in records}
    rel = {r["model"]: max(r["float_rel_err"].values()) for r in records if r.get("float_rel_err")}
    lowered_exact = count(lambda r: ok(r, "lowering") and r.get("lowered_max_code_diff_vs_plain") is not None
                          and max(v for v in r["lowered_max_code_diff_vs_plain"].values() if v is not None) == 0)
    rows = [
        ("models in the sweep", n),
        ("built and exported to ONNX (torch)", count(lambda r: ok(r, "export"))),
        ("imported by npuforge", count(lambda r: ok(r, "import"))),
        ("float rel. error vs ONNX Runtime <= 1e-4", sum(1 for v in rel.values() if v <= 1e-4)),
        ("quantized (no error)", count(lambda r: ok(r, "quantize"))),
        ("quantized with no node left in float", count(lambda r: ok(r, "quantize") and not r.get("float_nodes"))),
        ("quantized with at least one int16 Concat", count(lambda r: bool(r.get("int16_concats")))),
        ("... with at least one normalization given an int16 input (narrow slices)",
         count(lambda r: bool(int16_norms(r)))),
        ("integer simulator ran", count(lambda r: ok(r, "integer_sim"))),
        ("integer vs fake-quant cosine >= 0.99 (every output)", sum(1 for v in ci.values()
                                                                    if v is not None and v >= 0.99)),
        ("integer vs fake-quant cosine >= 0.999 (every output)", sum(1 for v in ci.values()
                                                                     if v is not None and v >= 0.999)),
        ("fake-quant vs float cosine >= 0.99 (every output)", sum(1 for v in cf.values()
                                                                  if v is not None and v >= 0.99)),
        ("ONNX Runtime lowering accepted", count(lambda r: ok(r, "lowering"))),
        ("... and its output codes equal the plain simulator's", lowered_exact),
        ("... at >= 0.5x ONNX Runtime's int8 QDQ speed (batch 1, one thread)",
         count(lambda r: r.get("sim_speed", {}).get("ratio", 0) >= 0.5)),
        ("QDQ file runs in ONNX Runtime (ORT_ENABLE_ALL)", count(lambda r: ok(r, "qdq_ort"))),
        ("QDQ in ONNX Runtime vs fake-quant cosine >= 0.99", sum(1 for v in cq.values()
                                                                 if v is not None and v >= 0.99)),
    ] + [(f"compiled for {t}, program = integer simulator", count(
        lambda r, t=t: ok(r, f"compile_{t}") and not any(r["compile"][t]["codes_differing"].values())))
        for t in COMPILE_TARGETS] + [
        ("quantized with target 'tflite'", count(lambda r: ok(r, "tflite_quantize"))),
        ("int8 TFLite written", count(lambda r: ok(r, "tflite_export"))),
        ("... LiteRT reference kernels = integer simulator on every sample", count(
            lambda r: ok(r, "tflite_litert") and r["tflite"]["litert"]["bit_exact_samples"]
            == r["tflite"]["litert"]["samples"])),
    ]
    out = ["| criterion | models |", "|---|---:|"] + [f"| {a} | {b} |" for a, b in rows]
    total = sum(r["seconds"].get("wall", 0) for r in records)
    out.append(f"\nTotal wall time of the workers: {total:.0f} s ({total / 60:.1f} min).")

    # failures grouped by cause -------------------------------------------------------------------
    def section(title, items):
        """items: (model, exact message); grouped by the message with names blanked."""
        if not items:
            return [f"\n### {title}\n\nNone."]
        groups = defaultdict(list)
        for model, msg in items:
            groups[_cause(msg)].append((model, msg))
        lines = [f"\n### {title}\n"]
        for cause, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"- **{len(members)} model(s)**: `{_tick(_short(cause, 200))}`")
            for model, msg in members:
                lines.append(f"  - {model}: `{_tick(msg)}`")
        return lines

    failures = []
    for r in records:
        f = _first_failure(r)
        if f is not None:
            failures.append((r["model"], f"[{f[0]}] {f[1]}"))
        for s in STAGES[STAGES.index(f[0]) + 1:] if f else ():
            v = r["stages"].get(s)
            if v is not None and v != "ok" and s not in ("lowering", "lowered_run"):
                failures.append((r["model"], f"[{s}] {v}"))
        if r.get("worker", "ok") != "ok" and r.get("done"):
            failures.append((r["model"], f"[worker] {r['worker']}"))
    out += section("Failures (build, export, import, quantize, simulators, QDQ), grouped by cause", failures)
    lowering = [(r["model"], r["stages"]["lowering"]) for r in records
                if r["stages"].get("lowering") not in (None, "ok")]
    lowering += [(r["model"], "[lowered_run] " + r["stages"]["lowered_run"]) for r in records
                 if r["stages"].get("lowered_run") not in (None, "ok")]
    out += section("ONNX Runtime lowering refusals, grouped by cause", lowering)
    kept = [(r["model"], f"{k['op']}: {k['reason']}") for r in records for k in r.get("float_nodes") or []]
    kept_grouped = defaultdict(list)
    for model, why in kept:
        kept_grouped[why].append(model)
    lines = ["\n### Nodes left in float, grouped by op and reason\n"]
    if not kept_grouped:
        lines.append("None.")
    for why, models in sorted(kept_grouped.items(), key=lambda kv: -len(kv[1])):
        per = Counter(models)
        lines.append(f"- `{why}`: {len(models)} node(s) in "
                     + ", ".join(f"{m} ({c})" for m, c in per.items()))
    out += lines
    low = [(r["model"], f"integer vs fake-quant min cosine {_fmt_cos(ci[r['model']])}"
            f" (per output: {', '.join(f'{k}={_fmt_cos(v)}' for k, v in r['cos_int_vs_fake'].items())})")
           for r in records if ci[r["model"]] is not None and not ci[r["model"]] >= 0.99]
    lines = ["\n### Integer simulator vs fake-quant below 0.99\n"]
    lines += [f"- {m}: {t}" for m, t in low] or ["None."]
    out += lines
    narrow = [(r["model"], int16_norms(r)) for r in records if int16_norms(r)]
    out.append("\n### Normalizations given an int16 input (narrowest slice under norm_spread_codes steps)\n")
    out += [f"- {m}: {len(found)} ({_tick(_short(found[0], 200))}{', ...' if len(found) > 1 else ''})"
            for m, found in narrow] or ["None."]
    det = [r for r in records if r.get("scores")]
    if det:
        out.append("\n### Detector score channels (output channels 4 and up) on their own\n")
        out.append("| model | float range of the scores | fake vs float cos | max abs error | distinct fake-quant "
                   "values | int vs fake cos |")
        out.append("|---|---|---:|---:|---:|---:|")
        for r in det:
            s = r["scores"]
            lo, hi = s["float_range"]
            out.append(f"| {r['model']} | [{lo:.4g}, {hi:.4g}] | {_fmt_cos(s['cos_fake_vs_float'])} | "
                       f"{s['max_abs_fake_vs_float']:.3g} | {s['distinct_fake_values']} | "
                       f"{_fmt_cos(s.get('cos_int_vs_fake'))} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", help="comma-separated subset (default: all; see --list)")
    ap.add_argument("--out", default="results.json", help="the records, JSON (default results.json)")
    ap.add_argument("--markdown", help="also write the table and the summary to this markdown file")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model (default 900)")
    ap.add_argument("--report", help="read records from this JSON instead of running")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--rev", help="run npuforge as committed at this git revision (git archive into a temporary "
                                  "folder put first on PYTHONPATH), not the working tree")
    ap.add_argument("--export-dir", help="write each model's int8 TFLite export (NAME.tflite) and the quantized IR "
                    "it came from (NAME.tflite.nfir) here, for benchmarks/compile_vs_vela.py")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--record", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        run_worker(args.worker, Path(args.record), Path(args.workdir),
                   Path(args.export_dir) if args.export_dir else None)
        return 0
    if args.list:
        for name, (family, _) in MODELS.items():
            print(f"{name:32s} {family}")
        return 0
    if args.report:
        data = json.loads(Path(args.report).read_text())
        records, env = data["records"], data.get("environment", {})
    else:
        names = args.models.split(",") if args.models else list(MODELS)
        unknown = [m for m in names if m not in MODELS]
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}; --list shows them")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with tempfile.TemporaryDirectory(prefix="npuforge-sweep-") as tmp:
            rev = None
            if args.rev:
                repo = Path(__file__).resolve().parents[1]
                rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", args.rev], check=True,
                                     capture_output=True, text=True).stdout.strip()
                src = Path(tmp) / "src"
                src.mkdir()
                archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "npuforge"], check=True,
                                         capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))
                sys.path.insert(0, str(src))
            env = environment()
            if rev:
                env["npuforge_git"] = f"{rev} (git archive, --rev {args.rev})"
            records = []
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            for i, name in enumerate(names, 1):
                rec = run_one(name, args.timeout, Path(tmp),
                              Path(args.export_dir).resolve() if args.export_dir else None)
                records.append(rec)
                f = _first_failure(rec)
                print(f"[{i}/{len(names)}] {name}: {rec['seconds'].get('wall')} s"
                      f"{'' if f is None else f' -- {f[0]}: {_short(f[1], 120)}'}", flush=True)
                env["sweep_seconds"] = round(time.perf_counter() - start, 1)
                Path(args.out).write_text(json.dumps({"environment": env, "records": records}, indent=1,
                                                     default=str))
    text = table(records) + "\n\n" + summary(records)
    print()
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        header = "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + "\n\n"
        Path(args.markdown).write_text(header + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
