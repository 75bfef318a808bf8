"""The npuforge model zoo: reference models to train, evaluate, export and quantize.

    from npuforge.zoo import create_model, list_models, get_config
    model = create_model("efficientnet_lite0", pretrained=True)
    cfg = get_config("efficientnet_lite0")   # input size, resize/crop, mean/std, class names...
"""

from .checkpoint import CheckpointMismatchError, load_checkpoint, read_checkpoint
from .registry import PretrainedConfig, create_model, get_config, list_models

__all__ = ["create_model", "list_models", "get_config", "PretrainedConfig", "load_checkpoint", "read_checkpoint",
           "CheckpointMismatchError"]
