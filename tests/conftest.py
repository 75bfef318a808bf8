import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    env = os.environ.get("NPUFORGE_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def imagenet_sample() -> Path:
    folder = shared_data_dir() / "imagenet-sample-even"
    if not folder.is_dir():
        pytest.skip(f"shared ImageNet sample not found at {folder} (set NPUFORGE_SHARED_DATA)")
    return folder
