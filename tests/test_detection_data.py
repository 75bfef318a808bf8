"""Detection sets: the synthetic generator (deterministic, tight boxes), the COCO reader's
one-line refusals, and COCO mAP through pycocotools."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from npuforge.cli import main as cli_main
from npuforge.detection.coco import load_coco
from npuforge.detection.metric import coco_map
from npuforge.detection.synthetic import SHAPES, make_synthetic_set


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A few background photos (random smooth images; the shared sample is not needed)."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for k in range(5):
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        Image.fromarray(small).resize((200 + 10 * k, 150), Image.BILINEAR).save(folder / f"p{k}.jpg")
    return folder


def digest(folder) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_synthetic_set_is_deterministic_and_a_prefix_of_a_larger_one(photos, tmp_path):
    a = make_synthetic_set(photos, tmp_path / "a", images=6, size=64, seed=3)
    b = make_synthetic_set(photos, tmp_path / "b", images=6, size=64, seed=3)
    assert digest(a.parent) == digest(b.parent)
    c = make_synthetic_set(photos, tmp_path / "c", images=9, size=64, seed=3)
    for k in range(6):
        name = f"{k:06d}.png"
        assert (a.parent / "images" / name).read_bytes() == (c.parent / "images" / name).read_bytes()
    d = make_synthetic_set(photos, tmp_path / "d", images=6, size=64, seed=4)
    assert digest(d.parent) != digest(a.parent)


def test_synthetic_boxes_are_tight_around_the_pasted_shapes(photos, tmp_path):
    """Render the same image over a flat background: every box edge touches a changed pixel and
    nothing changes outside the boxes."""
    from npuforge.detection.synthetic import render

    flat = np.full((96, 96, 3), 7, np.uint8)
    for seed in range(20):
        img, boxes = render(flat, np.random.default_rng(seed), 4)
        changed = (img != flat).any(axis=2)
        inside = np.zeros_like(changed)
        for k, x0, y0, x1, y1 in boxes:
            assert 0 <= k < len(SHAPES) and 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 96
            box = changed[y0:y1, x0:x1]
            # a stripe may match the background colour in spots, so test the shape's rows and columns
            assert box.any(axis=1)[[0, -1]].all() and box.any(axis=0)[[0, -1]].all(), (seed, k)
            inside[y0:y1, x0:x1] = True
        assert not (changed & ~inside).any()
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert a[3] <= b[1] or b[3] <= a[1] or a[4] <= b[2] or b[4] <= a[2]  # no overlap


def test_the_command_writes_a_set_the_reader_accepts(photos, tmp_path, capsys):
    out = tmp_path / "set"
    assert cli_main(["zoo", "detection-set", "--photos", str(photos), "-o", str(out), "--images", "12",
                     "--size", "64", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    ds = load_coco(out / "annotations.json")
    assert len(ds) == summary["images"] == 12
    assert sum(len(b) for b in ds.boxes.values()) == summary["objects"] >= 12
    assert set(summary["per_category"]) <= set(SHAPES)
    # a second run into the same folder is refused, and leaves the set as it was
    before = digest(out)
    assert cli_main(["zoo", "detection-set", "--photos", str(photos), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and digest(out) == before


def _write(tmp_path, coco: dict, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(coco))
    return path


def test_bad_annotations_get_one_line_errors(photos, tmp_path):
    from npuforge.errors import NpuforgeError

    good = make_synthetic_set(photos, tmp_path / "s", images=2, size=48, seed=0)
    coco = json.loads(good.read_text())
    images = good.parent / "images"
    cases = {
        "annotation file not found": None,
        "unknown category id 9": lambda c: c["annotations"][0].update(category_id=9),
        "lies outside its 48x48 image": lambda c: c["annotations"][0].update(bbox=[40, 40, 20, 5]),
        "non-positive width": lambda c: c["annotations"][0].update(bbox=[1, 1, 0, 5]),
        "unknown image id 77": lambda c: c["annotations"][0].update(image_id=77),
        "not found in": lambda c: c["images"][0].update(file_name="missing.png"),
        "listed twice": lambda c: c["images"].append(dict(c["images"][0])),
        "missing 'bbox'": lambda c: c["annotations"][0].pop("bbox"),
    }
    for expect, edit in cases.items():
        if edit is None:
            path = tmp_path / "nothing.json"
        else:
            broken = json.loads(json.dumps(coco))
            edit(broken)
            path = _write(tmp_path, broken)
        with pytest.raises(NpuforgeError) as e:
            load_coco(path, images)
        assert expect in str(e.value) and "\n" not in str(e.value), (expect, str(e.value))
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(NpuforgeError, match="not JSON"):
        load_coco(tmp_path / "junk.json")


def test_coco_map_of_the_truth_is_one_and_of_shifted_boxes_lower(photos, tmp_path):
    ds = load_coco(make_synthetic_set(photos, tmp_path / "m", images=10, size=96, seed=1))
    truth = {i: (b, np.ones(len(b)), ds.labels[i]) for i, b in ds.boxes.items()}
    assert coco_map(ds, truth)["map"] == pytest.approx(1.0)
    shifted = {i: (b + np.float32(6), np.ones(len(b)), ds.labels[i]) for i, b in ds.boxes.items()}
    worse = coco_map(ds, shifted)
    assert 0.0 <= worse["map"] < 0.9 and worse["map50"] <= 1.0
    wrong_class = {i: (b, np.ones(len(b)), (ds.labels[i] % 4) + 1) for i, b in ds.boxes.items()}
    assert coco_map(ds, wrong_class)["map"] == 0.0
