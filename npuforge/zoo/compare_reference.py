"""Side-by-side check of our EfficientNet-Lite against the efficientnet-lite-pytorch reference.

    python -m npuforge.zoo.compare_reference efficientnet_lite0 --data ../shared/data/imagenet-sample-even

Both models get the same weights file and the same preprocessing batches; prints
top-1 / top-5 of each and the largest logit difference. Needs the test extra
(``efficientnet-lite-pytorch``) and the weights package of the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import torch

from ..argtypes import positive_int
from ..errors import NpuforgeError


def compare(name: str, data: str, batch_size: int = 50, limit: int | None = None, progress: bool = True) -> dict:
    from tqdm import tqdm

    from .data import ImageDataset, iter_batches
    from .efficientnet_lite import weights_path
    from .registry import create_model, get_config
    from .transforms import eval_transform

    if not name.startswith("efficientnet_lite"):
        raise NpuforgeError(f"{name}: the reference comparison covers the efficientnet_lite models only")
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise NpuforgeError("the reference needs `pip install efficientnet-lite-pytorch`") from None
    config = get_config(name)
    ours = create_model(name, pretrained=True).eval().to(memory_format=torch.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = EfficientNet.from_pretrained(name.replace("_", "-"), weights_path=str(weights_path(config)))
    ref = ref.eval().to(memory_format=torch.channels_last)
    ds = ImageDataset(data, limit=limit)
    top1 = {"ours": 0, "reference": 0}
    top5 = {"ours": 0, "reference": 0}
    max_diff = 0.0
    seen = 0
    with torch.no_grad(), tqdm(total=len(ds), desc=name, unit="img", file=sys.stderr, disable=not progress) as bar:
        for x, y, _ in iter_batches(ds, eval_transform(config), batch_size):
            xt = torch.from_numpy(x).contiguous(memory_format=torch.channels_last)
            yt = torch.from_numpy(y)
            logits = {"ours": ours(xt), "reference": ref(xt)}
            max_diff = max(max_diff, float((logits["ours"] - logits["reference"]).abs().max()))
            for key, out in logits.items():
                top = out.topk(5, dim=1).indices
                top1[key] += int((top[:, 0] == yt).sum())
                top5[key] += int((top == yt[:, None]).any(1).sum())
            seen += len(y)
            bar.update(len(y))
    return {"model": name, "images": seen, "skipped": len(ds.skipped),
            "top1": {k: 100.0 * v / seen for k, v in top1.items()},
            "top5": {k: 100.0 * v / seen for k, v in top5.items()},
            "max_abs_logit_diff": max_diff, "preprocessing": repr(eval_transform(config))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m npuforge.zoo.compare_reference", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+", help="efficientnet_lite0 / 1 / 2")
    parser.add_argument("--data", required=True, help="image folder (flat <wnid>_name.JPEG or ImageFolder)")
    parser.add_argument("--batch-size", type=positive_int, default=50, help="images per batch (default 50)")
    parser.add_argument("--limit", type=positive_int, help="compare on at most N images")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(json.dumps(compare(name, args.data, args.batch_size, args.limit, not args.quiet)), flush=True)
    except NpuforgeError as e:
        print(f"npuforge: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
