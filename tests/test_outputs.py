"""Nothing the user gave is overwritten by accident: every output that resolves to an input (or to a
file the command writes beside it) is refused in one line before any work, and only regular files of
the kind the command writes are replaced (npuforge/outputs.py)."""

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import npuforge
from npuforge.cli import build_parser, command_parsers, main


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with a float ONNX model, its quantized IR set (IR, weights, QDQ), a compiled program
    and a few calibration photos."""
    folder = tmp_path_factory.mktemp("work")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).eval()
    npuforge.export_onnx(m, torch.zeros(1, 3, 16, 16), str(folder / "cnn.onnx"))
    rng = np.random.default_rng(0)
    (folder / "photos" / "a").mkdir(parents=True)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(folder / "photos" / "a" / f"{i}.png")
    assert main(["quantize", str(folder / "cnn.onnx"), "--calib", str(folder / "photos"), "--num-calib", "4",
                 "-o", str(folder / "q.nfir"), "-q"]) == 0
    assert main(["compile", str(folder / "q.nfir"), "-o", str(folder / "q.npub")]) == 0
    return folder


def digests(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, argv, *fragments):
    code = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("npuforge: error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, fragment", [
    # quantize -o cnn.nfir would write its QDQ export to cnn.onnx, the model being quantized
    (["quantize", "{w}/cnn.onnx", "--calib", "{w}/photos", "-o", "{w}/cnn.nfir"], "the input"),
    (["optimize", "{w}/cnn.onnx", "-o", "{w}/cnn.onnx"], "name the IR file"),
    # the IR's weights file is an input too
    (["optimize", "{w}/q.nfir", "-o", "{w}/q.nfir"], "is the input"),
    (["compile", "{w}/q.nfir", "-o", "{w}/x.npub", "--csv", "{w}/q.nfir"], "is the input"),
    (["compile", "{w}/q.nfir", "-o", "{w}/x.npub", "--report", "{w}/x.npub"], "same file"),
    (["run", "{w}/q.nfir", "--output", "{w}/q.safetensors"], "is the input"),
    (["run", "{w}/q.npub", "--output", "{w}/q.npub"], "is the input"),
    (["export", "{w}/q.nfir", "--format", "onnx", "-o", "{w}/q.nfir"], "is the input"),
    (["export", "{w}/q.nfir", "--format", "tflite", "-o", "{w}/q.safetensors"], "is the input"),
    (["detect", "{w}/q.nfir", "{w}/photos/a/0.png", "-o", "{w}/photos/a/0.png"], "is the input"),
    (["analyze", "{w}/cnn.onnx", "--calib", "{w}/photos", "--data", "{w}/photos", "-o", "{w}/cnn.nfir"],
     "the input"),
    (["zoo", "export", "{w}/cnn.onnx", "-o", "{w}/cnn.onnx"], "is the input"),
    # not a file to write
    (["quantize", "{w}/cnn.onnx", "--calib", "{w}/photos", "-o", "{w}"], "is a folder"),
    (["quantize", "{w}/cnn.onnx", "--calib", "{w}/photos", "-o", ""], "not a folder"),
    (["quantize", "{w}/cnn.onnx", "--calib", "{w}/photos", "-o", "."], "not a folder"),
    (["compile", "{w}/q.nfir", "-o", "{w}/cnn.onnx/x.npub"], "is not a folder"),
    # an existing file of another kind is replaced only with --force
    (["compile", "{w}/q.nfir", "-o", "{w}/photos/a/1.png"], "png file"),
    (["export", "{w}/q.nfir", "--format", "tflite", "-o", "{w}/cnn.onnx"], "onnx file"),
    # a user's ONNX model beside the named output is not a QDQ file npuforge wrote
    (["quantize", "{w}/q.nfir", "--calib", "{w}/photos", "-o", "{w}/cnn.nfir"], "not written by npuforge"),
])
def test_an_output_that_would_lose_a_file_is_refused_before_any_work(capsys, work, argv, fragment):
    before = digests(work)
    refused(capsys, [a.format(w=work) for a in argv], fragment)
    assert digests(work) == before


def test_a_qdq_file_beside_the_output_that_npuforge_did_not_write_is_kept(capsys, work, tmp_path):
    other = tmp_path / "mine.onnx"
    other.write_bytes((work / "cnn.onnx").read_bytes())  # the user's float model, named like the QDQ file
    before = other.read_bytes()
    refused(capsys, ["quantize", work / "q.nfir", "--calib", work / "photos", "-o", tmp_path / "mine.nfir"],
            "mine.onnx", "not written by npuforge", "--force")
    assert other.read_bytes() == before and not (tmp_path / "mine.nfir").exists()


def test_force_replaces_a_file_of_another_kind_but_never_an_input(capsys, work, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    assert main(["compile", str(work / "q.nfir"), "-o", str(target), "--force"]) == 0
    assert target.read_bytes()[:4] == b"NPUB"
    capsys.readouterr()
    refused(capsys, ["compile", work / "q.nfir", "-o", work / "q.nfir", "--force"], "is the input")


def test_an_earlier_output_of_the_same_kind_is_replaced(capsys, work, tmp_path):
    out = tmp_path / "again.npub"
    for _ in range(2):
        assert main(["compile", str(work / "q.nfir"), "-o", str(out)]) == 0
    for _ in range(2):
        assert main(["quantize", str(work / "cnn.onnx"), "--calib", str(work / "photos"), "--num-calib", "4",
                     "-o", str(tmp_path / "again.nfir"), "-q"]) == 0


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/full"), reason="needs root and /dev/full")
def test_a_device_node_is_never_replaced(capsys, work):
    refused(capsys, ["quantize", work / "cnn.onnx", "--calib", work / "photos", "-o", "/dev/full"],
            "not a regular file")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_write_atomic_refuses_a_non_regular_target(tmp_path):
    from npuforge.errors import NpuforgeError
    from npuforge.fileio import write_atomic

    (tmp_path / "d").mkdir()
    with pytest.raises(NpuforgeError, match="not a regular file"):
        write_atomic(tmp_path / "d", b"x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(NpuforgeError, match="not a regular file"):
        write_atomic(fifo, b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


OUTPUT_DESTS = {"output", "csv", "report", "run_dir"}


def test_every_command_that_writes_declares_its_outputs():
    """Coverage: a command with an output option that does not plan its outputs is not checked."""
    for p in command_parsers(build_parser()):
        dests = {a.dest for a in p._actions}
        if dests & OUTPUT_DESTS:
            assert p.get_default("outputs") is not None, p.prog
            assert "force" in dests, p.prog
