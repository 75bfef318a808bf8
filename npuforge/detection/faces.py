"""Face photos to evaluate face detectors on, from installed packages (never downloaded): the
images of the insightface 2.1 wheel (installed --no-deps by make venv; a group photo, a
portrait and four masked faces) and scikit-image's astronaut."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def face_photos(folder=None) -> list[Path]:
    """Paths of the available face photos; scikit-image's astronaut is written into ``folder``
    (when given) as a PNG. Empty when neither package is installed."""
    paths = []
    spec = importlib.util.find_spec("insightface")
    if spec is not None and spec.submodule_search_locations:
        images = Path(spec.submodule_search_locations[0]) / "data" / "images"
        paths += sorted(p for p in images.glob("*") if p.suffix.lower() in (".jpg", ".png"))
    if folder is not None and importlib.util.find_spec("skimage") is not None:
        from PIL import Image
        from skimage import data

        out = Path(folder) / "astronaut.png"
        if not out.exists():
            Image.fromarray(data.astronaut()).save(out)
        paths.append(out)
    return paths
