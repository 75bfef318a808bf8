"""npuforge quantize / eval on real images: bad inputs, and EfficientNet-Lite0's accuracy cost."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

import npuforge
from npuforge.cli import main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU6(), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    path = folder / "tiny.onnx"
    npuforge.export_onnx(m, torch.zeros(1, 3, 32, 32), str(path))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (folder / cls).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / cls / f"{i}.png")
    return folder


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *fragments):
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("npuforge: error: "), err
    for f in fragments:
        assert f in line, line


def test_quantize_writes_ir_weights_and_qdq(capsys, tiny_model, images, tmp_path):
    out = tmp_path / "q" / "tiny.nfir"
    code, stdout, _ = run(capsys, "quantize", tiny_model, "--calib", images, "--num-calib", 6, "-o", out, "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["calibration_images"] == 6 and summary["float_nodes"] == []
    for suffix in (".nfir", ".safetensors", ".onnx"):
        assert out.with_suffix(suffix).is_file()
    ops = {n.op_type for n in onnx.load(out.with_suffix(".onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    q = npuforge.load(out)
    assert q.metadata["quantization"]["config"]["method"] == "minmax"
    code, stdout, _ = run(capsys, "eval", out, "--data", images, "--json")
    assert code == 0 and json.loads(stdout)["images"] == 6
    code, stdout, _ = run(capsys, "eval", out.with_suffix(".onnx"), "--engine", "ort", "--data", images, "--json")
    assert code == 0 and json.loads(stdout)["images"] == 6


def test_empty_calibration_folder(capsys, tiny_model, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", tmp_path / "empty", "-o", tmp_path / "q.nfir")
    one_line_error(code, err, "empty", "no images found", "point --calib at")
    assert not (tmp_path / "q.nfir").exists()
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", tmp_path / "nope", "-o", tmp_path / "q.nfir")
    one_line_error(code, err, "nope", "no such folder (--calib)")


@pytest.mark.parametrize("option", ["--int16", "--keep-float"])
def test_a_misspelt_node_name_is_refused_before_calibrating(capsys, tiny_model, images, tmp_path, option):
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, option, "NOSUCHNODE", "-o",
                       tmp_path / "q.nfir")
    one_line_error(code, err, option, "no node or value named 'NOSUCHNODE'")
    assert not (tmp_path / "q.nfir").exists()


def test_fewer_images_than_num_calib(capsys, tiny_model, images, tmp_path):
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, "--num-calib", 100, "-o", tmp_path / "q.nfir")
    one_line_error(code, err, "holds 6 images but --num-calib is 100")


def test_output_must_name_the_ir(capsys, tiny_model, images, tmp_path):
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, "-o", tmp_path / "q.onnx")
    one_line_error(code, err, "--output", "name the IR file")


def test_misspelt_method_is_an_argparse_error(capsys, tiny_model, images, tmp_path):
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, "--method", "klx", "-o", tmp_path / "q.nfir")
    one_line_error(code, err, "invalid choice: 'klx'")


def test_corrupt_calibration_image_is_skipped(capsys, tiny_model, images, tmp_path):
    folder = tmp_path / "calib"
    shutil.copytree(images, folder)
    (folder / "a" / "9.png").write_bytes(b"not an image")
    code, stdout, _ = run(capsys, "quantize", tiny_model, "--calib", folder, "--num-calib", 7,
                          "-o", tmp_path / "q.nfir", "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["skipped_images"] == 1 and summary["calibration_images"] == 6


def test_equalize_bias_correction_adaround_flags_and_resume(capsys, tiny_model, images, tmp_path):
    out = tmp_path / "q.nfir"
    argv = ["quantize", tiny_model, "--calib", images, "--num-calib", 6, "-o", out, "--granularity", "per-tensor",
            "--equalize", "--bias-correction", "--adaround", "--adaround-iters", 5]
    code, stdout, _ = run(capsys, *argv, "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["equalize"]["pairs"] == 1  # conv -> ReLU6 -> pool -> flatten -> linear
    assert summary["adaround"]["layers"] == 2 and summary["adaround"]["reused"] == 0
    assert summary["bias_correction"]["corrected"] == 2
    assert len(list(out.with_suffix(".adaround").iterdir())) == 2  # one file per learnt layer
    code, stdout, _ = run(capsys, *argv)  # again: AdaRound resumes from its cache
    assert code == 0 and "reused 2" in stdout and "equalize: pairs 1" in stdout
    code, _, err = run(capsys, *argv[:-1], 0)
    one_line_error(code, err, "adaround_iters=0")


@pytest.mark.slow
def test_efficientnet_lite0_per_channel_accuracy_cost(imagenet_sample, capsys, tmp_path):
    """The issue's protocol: calibrate on the first 100 images (file order), evaluate on the other 400."""
    out = tmp_path / "l0q.nfir"
    code, _, _ = run(capsys, "quantize", "efficientnet_lite0", "--calib", imagenet_sample, "--num-calib", 100,
                     "-o", out, "-q")
    assert code == 0
    results = {}
    for model in ("efficientnet_lite0", out):
        code, stdout, _ = run(capsys, "eval", model, "--data", imagenet_sample, "--skip", 100, "--json")
        assert code == 0
        results[str(model)] = json.loads(stdout)
    fp32, int8 = results["efficientnet_lite0"], results[str(out)]
    print(f"\nEfficientNet-Lite0 on 400 images: FP32 top-1 {fp32['top1']:.2f}%, int8 per-channel "
          f"(minmax, fake-quant) {int8['top1']:.2f}%")
    assert fp32["images"] == int8["images"] == 400
    # One image is 0.25 points here, and which near-tie images flip depends on the CPU's
    # float kernels (calibration ranges and fake-quant both run on them): measured drops
    # 0.25 on an AVX2 machine, 0.75 on an AVX-512 VNNI one (under every ATEN_CPU_CAPABILITY).
    # The bound leaves that spread and still fails for per-tensor weights (drop 4.75 on the
    # AVX-512 machine, 5.75 in docs/benchmarks.md) or a broken quantizer.
    assert fp32["top1"] - int8["top1"] <= 1.0


@pytest.mark.slow
def test_torchrun_quantize_and_eval_equal_one_process(capsys, tiny_model, images, tmp_path):
    """Two processes, each calibrating a consecutive share of the batches (3 batches of 2: 1 + 2) and
    evaluating a share of the images, write the same bytes and count the same top-1 as one. KL reads
    the merged histograms (every observer's merge is tested exactly in test_quant.py)."""
    method = "kl"
    from test_train import torchrun

    one, two = tmp_path / "one" / "q.nfir", tmp_path / "two" / "q.nfir"
    common = ["--calib", images, "--num-calib", 6, "--batch-size", 2, "--method", method]
    code, _, _ = run(capsys, "quantize", tiny_model, *common, "-o", one, "--json")
    assert code == 0
    done = torchrun("-m", "npuforge", "quantize", str(tiny_model), *map(str, common), "-o", str(two), "--json",
                    procs=2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["processes"] == 2
    for suffix in (".nfir", ".safetensors", ".onnx"):
        assert one.with_suffix(suffix).read_bytes() == two.with_suffix(suffix).read_bytes(), suffix
    code, stdout, _ = run(capsys, "eval", one, "--data", images, "--engine", "int", "--json")
    alone = json.loads(stdout)
    done = torchrun("-m", "npuforge", "eval", str(one), "--data", str(images), "--engine", "int", "--json",
                    "--batch-size", "2", procs=2)
    assert done.returncode == 0, done.stderr[-2000:]
    shared = json.loads(done.stdout)
    assert shared["processes"] == 2 and alone["processes"] == 1
    assert alone["images"] == 6
    assert (shared["images"], shared["top1"], shared["top5"]) == (alone["images"], alone["top1"], alone["top5"])


def test_calibration_takes_every_class_in_turn_from_class_subfolders(tmp_path):
    """--num-calib N of a folder of class subfolders: one image of each class in turn, not the first
    class's N images; a flat folder keeps file order."""
    from npuforge.zoo.data import ImageDataset

    rng = np.random.default_rng(1)
    for cls, count in (("a", 5), ("b", 1), ("c", 3)):
        (tmp_path / "tree" / cls).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(tmp_path / "tree" / cls / f"{i}.png")
    data = ImageDataset(tmp_path / "tree", labelled=False)
    data.keep_first(6)
    assert [(p.parent.name, p.stem) for p, _ in data.samples] == [("a", "0"), ("b", "0"), ("c", "0"), ("a", "1"),
                                                                 ("c", "1"), ("a", "2")]
    (tmp_path / "flat").mkdir()
    for name in ("n01440764_1.png", "n01443537_2.png", "n01484850_3.png"):
        shutil.copy(tmp_path / "tree" / "a" / "0.png", tmp_path / "flat" / name)
    flat = ImageDataset(tmp_path / "flat", labelled=False)
    flat.keep_first(2)
    assert [p.name for p, _ in flat.samples] == ["n01440764_1.png", "n01443537_2.png"]


class _Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.fc = torch.nn.Embedding(30, 8), torch.nn.Linear(8, 3)

    def forward(self, ids):
        return self.fc(self.embed(ids).mean(dim=1))


def test_quantize_calibrates_a_token_model_on_npy_and_npz_files(capsys, tmp_path):
    """Token ids from .npy files (one sample, or a batch, each) and from .npz files named by input;
    a file of the wrong shape is one line naming it."""
    torch.manual_seed(0)
    model = tmp_path / "tokens.onnx"
    npuforge.export_onnx(_Tokens().eval(), torch.zeros(1, 6, dtype=torch.int64), str(model))
    name = npuforge.load(model).inputs[0]
    rng = np.random.default_rng(0)
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "a.npy", rng.integers(0, 30, 6))  # one sample
    np.save(tmp_path / "npy" / "b.npy", rng.integers(0, 30, (5, 6)))  # a batch of five
    (tmp_path / "npz").mkdir()
    for i in range(3):
        np.savez(tmp_path / "npz" / f"{i}.npz", **{name: rng.integers(0, 30, (2, 6))})
    for folder, count in (("npy", 6), ("npz", 6)):
        code, out, err = run(capsys, "quantize", model, "--calib", tmp_path / folder, "--num-calib", count,
                             "--batch-size", 4, "-o", tmp_path / f"{folder}.nfir", "--json")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["calibration_images"] == count and summary["float_nodes"] == []
    (tmp_path / "labelled").mkdir()  # eval: a subfolder of .npy samples per class
    for cls in ("0", "1", "2"):
        (tmp_path / "labelled" / cls).mkdir()
        np.save(tmp_path / "labelled" / cls / "x.npy", rng.integers(0, 30, (3, 6)))
    for target in (tmp_path / "npy.nfir", model):
        code, out, err = run(capsys, "eval", target, "--data", tmp_path / "labelled", "--engine", "int"
                             if target.suffix == ".nfir" else "npuforge", "--json")
        assert code == 0, err
        assert json.loads(out)["images"] == 9
    np.save(tmp_path / "npy" / "c.npy", rng.integers(0, 30, (2, 7)))
    code, _, err = run(capsys, "quantize", model, "--calib", tmp_path / "npy", "--num-calib", 8, "-o",
                       tmp_path / "bad.nfir")
    one_line_error(code, err, "c.npy", "[2, 7]")


def _stateful_model(path):
    """Two inputs whose dim 0 is no sample count: 'x' [4, 8] (a batch of 4 fixed in the model) and an
    LSTM-like state 'h' [1, 1, 5] (dim 0: layers); y = x @ W + sum(h)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]),
             helper.make_node("ReduceSum", ["h"], ["hs"], keepdims=0),
             helper.make_node("Add", ["xw", "hs"], ["y"])]
    graph = helper.make_graph(nodes, "stateful", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                                                  helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], initializer=[w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_npz_samples_follow_the_models_fixed_input_shapes(capsys, tmp_path):
    """A .npz for a model that fixes 'x' [4, 8] and a state 'h' [1, 1, 5]: arrays of the declared shapes
    are one sample (dim 0 of 4 and of 1 are no sample counts), [k, *shape] k samples; each sample is fed
    whole, never stacked with another; the CLI calibrates from either."""
    from npuforge.arrays import array_files, batches, read_samples

    model = _stateful_model(tmp_path / "stateful.onnx")
    rng = np.random.default_rng(1)
    (tmp_path / "one").mkdir()
    x, h = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(1, 1, 5)).astype(np.float32)
    np.savez(tmp_path / "one" / "0.npz", x=x, h=h)
    (tmp_path / "stacked").mkdir()
    xs, hs = rng.normal(size=(3, 4, 8)).astype(np.float32), rng.normal(size=(3, 1, 1, 5)).astype(np.float32)
    np.savez(tmp_path / "stacked" / "0.npz", x=xs, h=hs)
    graph = npuforge.load(model)
    one = read_samples(graph, array_files(tmp_path / "one"), 10)
    assert len(one) == 1 and np.array_equal(one[0]["x"], x) and np.array_equal(one[0]["h"], h)
    stacked = read_samples(graph, array_files(tmp_path / "stacked"), 10)
    assert [s["x"].shape for s in stacked] == [(4, 8)] * 3 and [s["h"].shape for s in stacked] == [(1, 1, 5)] * 3
    assert np.array_equal(stacked[2]["x"], xs[2]) and np.array_equal(stacked[2]["h"], hs[2])
    fed = batches(stacked, 4)  # (the batch size the CLI takes from x's fixed dim 0)
    assert [(b["x"].shape, b["h"].shape) for b in fed] == [((4, 8), (1, 1, 5))] * 3
    for folder, count in (("one", 1), ("stacked", 3)):
        code, out, err = run(capsys, "quantize", model, "--calib", tmp_path / folder, "--num-calib", count,
                             "-o", tmp_path / f"{folder}.nfir", "--json")
        assert code == 0, err
        assert json.loads(out)["float_nodes"] == []
        assert json.loads(out)["calibration_images"] == count  # samples, not rows of the fixed batch
    code, _, err = run(capsys, "quantize", model, "--calib", tmp_path / "stacked", "--num-calib", 4,
                       "-o", tmp_path / "more.nfir")
    one_line_error(code, err, "holds 3 samples but --num-calib is 4")


def test_npz_scalar_input_is_fed_as_a_0d_array(capsys, tmp_path):
    """A scalar input (a sample rate 'sr', int64 []) in each .npz reaches ONNX Runtime as a 0-d array, not
    a NumPy scalar (which ORT refuses: 'Unable to handle object of type numpy.int64')."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "srf"], ["y"])]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                                helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "scaled.onnx")
    (tmp_path / "calib").mkdir()
    for i in range(3):
        np.savez(tmp_path / "calib" / f"{i}.npz", x=np.full((1, 4), i + 1, np.float32), sr=np.array(16000, np.int64))
    code, _, err = run(capsys, "quantize", tmp_path / "scaled.onnx", "--calib", tmp_path / "calib", "--num-calib", 3,
                       "-o", tmp_path / "q.nfir")
    assert code == 0, err


def test_npz_arrays_holding_different_sample_counts_are_one_line(capsys, tmp_path):
    """A .npz whose arrays disagree on their sample count (read against the model's shapes), or whose
    array fits neither form of a fixed input, is refused in one line naming the file and the shapes."""
    model = _stateful_model(tmp_path / "stateful.onnx")
    rng = np.random.default_rng(2)
    (tmp_path / "calib").mkdir()
    np.savez(tmp_path / "calib" / "0.npz", x=rng.normal(size=(2, 4, 8)).astype(np.float32),
             h=rng.normal(size=(1, 1, 5)).astype(np.float32))
    code, _, err = run(capsys, "quantize", model, "--calib", tmp_path / "calib", "--num-calib", 1, "-o",
                       tmp_path / "q.nfir")
    one_line_error(code, err, "0.npz", "different numbers of samples", "'x' [2, 4, 8] holds 2 (the input is [4, 8])",
                   "'h' [1, 1, 5] holds 1 (the input is [1, 1, 5])")
    assert "Traceback" not in err
    np.savez(tmp_path / "calib" / "0.npz", x=rng.normal(size=(8, 8)).astype(np.float32),
             h=rng.normal(size=(1, 1, 5)).astype(np.float32))
    code, _, err = run(capsys, "quantize", model, "--calib", tmp_path / "calib", "--num-calib", 1, "-o",
                       tmp_path / "q.nfir")
    one_line_error(code, err, "0.npz", "'x' has shape [8, 8]", "[4, 8]", "[k, 4, 8]")


def _write_wav(path, samples: np.ndarray, width: int = 2, channels: int = 1, rate: int = 16000) -> None:
    import wave

    scaled = np.round(np.clip(samples, -1, 0.999) * 2.0 ** (8 * width - 1))
    data = {1: (scaled + 128).astype(np.uint8), 2: scaled.astype("<i2"), 4: scaled.astype("<i4")}[width]
    with wave.open(str(path), "wb") as w:
        w.setsampwidth(width)
        w.setnchannels(channels)
        w.setframerate(rate)
        w.writeframes(np.repeat(data, channels).tobytes())


def test_wav_files_are_read_exactly_and_calibrate_an_audio_model(capsys, tmp_path):
    """PCM WAV of 8, 16 and 32 bits (stereo averaged) read to [-1, 1); cut or padded to the input's
    length; an audio model quantizes from a folder of them."""
    from npuforge.arrays import read_wav

    wave_ = np.sin(np.arange(800) / 7.0) * 0.8
    for width in (1, 2, 4):
        _write_wav(tmp_path / f"w{width}.wav", wave_, width, channels=2)
        got = read_wav(tmp_path / f"w{width}.wav")
        assert got.shape == (800,) and np.abs(got - wave_).max() <= 2.0 ** (1 - 8 * width) + 1e-6
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(1, 4, 9, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool1d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 2)).eval()
    model = tmp_path / "audio.onnx"
    npuforge.export_onnx(net, torch.zeros(1, 1, 1000), str(model))
    (tmp_path / "clips").mkdir()
    for i, n in enumerate((800, 1000, 1500)):  # shorter, equal, longer than the input
        _write_wav(tmp_path / "clips" / f"{i}.wav", np.random.default_rng(i).uniform(-0.5, 0.5, n))
    code, out, err = run(capsys, "quantize", model, "--calib", tmp_path / "clips", "--num-calib", 3, "-o",
                         tmp_path / "q" / "audio.nfir", "--json")
    assert code == 0, err
    assert json.loads(out)["calibration_images"] == 3
    for cls in ("yes", "no"):  # eval: a subfolder of clips per class
        (tmp_path / "words" / cls).mkdir(parents=True)
        _write_wav(tmp_path / "words" / cls / "a.wav", np.random.default_rng(len(cls)).uniform(-0.5, 0.5, 1000))
    code, out, err = run(capsys, "eval", tmp_path / "q" / "audio.nfir", "--data", tmp_path / "words", "--engine",
                         "int", "--json")
    assert code == 0, err
    assert json.loads(out)["images"] == 2
    (tmp_path / "clips" / "3.wav").write_bytes(b"RIFF....WAVEfmt ")
    code, _, err = run(capsys, "quantize", model, "--calib", tmp_path / "clips", "--num-calib", 4, "-o",
                       tmp_path / "bad.nfir")
    one_line_error(code, err, "3.wav", "not a PCM WAV file")


def test_preprocessing_options_are_recorded_in_the_quantized_ir(capsys, tiny_model, images, tmp_path):
    """--input-range / --mean / --std and --size for an ONNX file that records no preprocessing: no
    ImageNet-defaults note, and the quantized IR carries them (eval reads them back)."""
    out = tmp_path / "q" / "tiny.nfir"
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, "--num-calib", 4, "--input-range=-1,1",
                       "--size", 32, "-o", out)
    assert code == 0, err
    assert "records no preprocessing" not in err
    pre = npuforge.load(out).metadata["preprocess"]
    assert pre["source"] == "options" and pre["crop_size"] == [32, 32] and pre["resize_size"] == 37
    assert pre["mean"] == [127.5] * 3 and pre["std"] == [127.5] * 3
    code, _, err = run(capsys, "eval", out, "--data", images, "--json")
    assert code == 0 and "records no preprocessing" not in err
    code, _, err = run(capsys, "quantize", tiny_model, "--calib", images, "--input-range", "0,1", "--mean", "1,2,3",
                       "-o", tmp_path / "bad.nfir")
    one_line_error(code, err, "--input-range", "--mean")


def test_a_channels_last_image_model_with_layout_nhwc(capsys, images, tmp_path):
    """A model taking [N, H, W, 3] (as TensorFlow exports do): --layout nhwc feeds it HWC images, the
    IR records it; without it the refusal names the option."""
    torch.manual_seed(0)

    class Hwc(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                           torch.nn.Flatten(), torch.nn.Linear(4, 3))

        def forward(self, x):
            return self.net(x.permute(0, 3, 1, 2))

    model = tmp_path / "hwc.onnx"
    npuforge.export_onnx(Hwc().eval(), torch.zeros(1, 24, 20, 3), str(model))
    code, _, err = run(capsys, "quantize", model, "--calib", images, "--num-calib", 4, "-o", tmp_path / "a.nfir")
    one_line_error(code, err, "[N, 3, H, W]", "--layout nhwc")
    out = tmp_path / "q" / "hwc.nfir"
    code, _, err = run(capsys, "quantize", model, "--calib", images, "--num-calib", 4, "--layout", "nhwc",
                       "--input-range", "0,1", "-o", out)
    assert code == 0, err
    pre = npuforge.load(out).metadata["preprocess"]
    assert pre["layout"] == "nhwc" and pre["crop_size"] == [24, 20]
    code, stdout, err = run(capsys, "eval", out, "--data", images, "--engine", "int", "--json")
    assert code == 0, err
    assert json.loads(stdout)["images"] == 6
