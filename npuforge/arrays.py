"""Model inputs that are not photos: a folder of ``.npy`` / ``.npz`` / ``.wav`` files.

Each file holds one sample, or several: a ``.npy`` file the single input of a one-input
model, a ``.npz`` file one array per input name. What a sample is follows the input's
declared shape. Where its leading dim is dynamic (a batch), an array of the input's rank
is a batch and one dim fewer a single sample. Where the model fixes the leading dim (a
batch of 4, an LSTM state [1, 1, 128] whose dim 0 counts layers), an array of the
declared shape is one sample as it is and one of [k, *shape] k samples (a fixed dim 0 of
1 also takes the batch forms). The arrays of a file hold the same number of samples.
Float arrays are cast to the input's float type, integer arrays (token ids) to its
integer type.
A ``.wav`` file (PCM, 8 to 32 bits; channels averaged; not resampled) is one sample of
a one-input audio model in [-1, 1), cut or zero-padded to the input's static length.
Files are read in name order. Every fault is one line naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import NpuforgeError
from .ir import dtypes

ARRAY_EXTENSIONS = (".npy", ".npz", ".wav")


def array_files(root) -> list[Path]:
    """The .npy / .npz / .wav files of a folder, in name order (empty if there are none)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in ARRAY_EXTENSIONS)


def read_wav(path: Path) -> np.ndarray:
    """A PCM WAV file's samples, channels averaged, in [-1, 1) (float32 [n])."""
    import wave

    try:
        with wave.open(str(path), "rb") as w:
            width, channels, frames = w.getsampwidth(), w.getnchannels(), w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError) as e:
        raise NpuforgeError(f"{path}: not a PCM WAV file ({' '.join(str(e).split())[:120]}); write 8, 16, 24 or "
                            f"32-bit PCM") from None
    if width not in (1, 2, 3, 4) or channels < 1:
        raise NpuforgeError(f"{path}: {8 * width}-bit samples in {channels} channel(s); write 8, 16, 24 or 32-bit PCM")
    frames = frames[:len(frames) // (width * channels) * width * channels]  # (a truncated last frame: dropped)
    if width == 3:  # 24-bit: widen each sample to 32 bits
        raw = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        ints = (np.pad(raw, ((0, 0), (1, 0))).view("<i4")[:, 0]).astype(np.float64) / 2.0**31
    elif width == 1:  # unsigned 8-bit
        ints = (np.frombuffer(frames, np.uint8).astype(np.float64) - 128) / 128
    else:
        ints = np.frombuffer(frames, {2: "<i2", 4: "<i4"}[width]).astype(np.float64) / 2.0 ** (8 * width - 1)
    return ints.reshape(-1, channels).mean(axis=1).astype(np.float32)


def _fit_audio(graph, name: str, audio: np.ndarray, path: Path) -> np.ndarray:
    """One sample of input ``name`` (shape [N, L] or [N, 1, L], L static) from a waveform."""
    shape = graph.values[name].shape
    length = shape[-1]
    if not isinstance(length, int) or any(d != 1 for d in shape[1:-1]):
        raise NpuforgeError(f"{path}: a WAV file feeds an input of shape [N, L] or [N, 1, L] with a static length L; "
                            f"'{name}' is {list(shape)} (fix L with --input-shape, or give .npy files)")
    audio = audio[:length] if audio.size >= length else np.pad(audio, (0, length - audio.size))
    return audio.reshape(tuple(shape[1:-1]) + (length,))


def _load(path: Path, inputs: list[str], graph=None) -> dict:
    if path.suffix.lower() == ".wav":
        if len(inputs) != 1:
            raise NpuforgeError(f"{path}: a WAV file feeds a one-input model; this one has inputs {', '.join(inputs)}")
        return {inputs[0]: _fit_audio(graph, inputs[0], read_wav(path), path)}
    try:
        if path.suffix.lower() == ".npy":
            if len(inputs) != 1:
                raise NpuforgeError(f"{path}: a .npy file feeds a one-input model, and this one has inputs "
                                    f"{', '.join(inputs)}; give .npz files with one array per input name")
            return {inputs[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except NpuforgeError:
        raise
    except (OSError, ValueError, EOFError) as e:
        raise NpuforgeError(f"{path}: not a readable {path.suffix} file ({' '.join(str(e).split())[:120]})") from None
    if len(inputs) == 1 and len(arrays) == 1:
        return {inputs[0]: next(iter(arrays.values()))}
    missing = [n for n in inputs if n not in arrays]
    if missing:
        raise NpuforgeError(f"{path}: holds {', '.join(sorted(arrays)) or 'no arrays'} but the model's inputs are "
                            f"{', '.join(inputs)}; name each array after its input")
    return {n: arrays[n] for n in inputs}


def _static(dim) -> bool:
    """Whether a declared dim is a fixed size (symbolic names, -1 and 0 are dynamic)."""
    return isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim > 0


def _fits(got, shape) -> bool:
    """Whether an array shape ``got`` matches the declared ``shape`` (its dynamic dims take any size)."""
    return len(got) == len(shape) and all(not _static(d) or g == d for g, d in zip(got, shape))


def _dims(shape) -> list:
    return [int(d) if isinstance(d, (int, np.integer)) else d for d in shape]


class Feed(dict):
    """One sample of a model that fixes the leading dim of an input (a batch of 4, an LSTM
    state [1, 1, 128]): a whole feed of the model, run as it is, never stacked with others."""


def _samples_of(graph, name: str, arr: np.ndarray, path: Path):
    """Input ``name``'s samples in the array ``arr`` of file ``path``: (count, take) where
    ``take(i)`` is sample i as the model takes it (the input's declared shape; a batch dim
    of 1 where the leading dim is dynamic)."""
    v = graph.values[name]
    shape = tuple(v.shape)
    rank = len(shape)
    if rank and not _static(shape[0]):  # a dynamic leading dim: dim 0 counts samples
        if arr.ndim == rank - 1:
            arr = arr[None]
        elif arr.ndim != rank:
            raise NpuforgeError(f"{path}: '{name}' has shape {list(arr.shape)}; the input is {_dims(shape)} (give "
                                f"one sample without the batch dim, or a batch)")
        if not _fits(arr.shape[1:], shape[1:]):
            raise NpuforgeError(f"{path}: '{name}' has shape {list(arr.shape)}; the input is {_dims(shape)}")
        rows = True
    elif arr.ndim == rank + 1 and _fits(arr.shape[1:], shape):  # [k, *shape]: k samples
        rows = False
    elif arr.ndim == rank and _fits(arr.shape, shape):  # the declared shape: one sample as it is
        arr, rows = arr[None], False
    elif shape[0] == 1 and arr.ndim == rank - 1 and _fits(arr.shape, shape[1:]):  # a fixed batch of 1: a
        arr, rows = arr[None], True  # sample without it, or a batch of them
    elif shape[0] == 1 and arr.ndim == rank and _fits(arr.shape[1:], shape[1:]):
        rows = True
    else:
        raise NpuforgeError(f"{path}: '{name}' has shape {list(arr.shape)}; the model's input is {_dims(shape)} "
                            f"with a fixed dim 0 (give one sample of that shape, or k of them as [k, "
                            f"{', '.join(map(str, _dims(shape)))}])")
    want = dtypes.to_numpy(v.dtype)
    if np.issubdtype(want, np.floating) != np.issubdtype(arr.dtype, np.floating) or arr.dtype.kind not in "biuf":
        raise NpuforgeError(f"{path}: '{name}' is {arr.dtype}; the input is {v.dtype}")
    if np.issubdtype(want, np.integer):
        info = np.iinfo(want)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise NpuforgeError(f"{path}: '{name}' holds values outside {v.dtype}")
    arr = arr.astype(want)
    return len(arr), ((lambda i: arr[i:i + 1]) if rows else (lambda i: arr[i, ...]))  # (a 0-d sample: an array)


def read_samples(graph, files: list[Path], limit: int) -> list[dict]:
    """The first ``limit`` samples of ``files``, each {input name: array}: an input with a
    dynamic leading dim gets a batch dim of 1, one whose leading dim the model fixes its
    declared shape (and the sample is then a :class:`Feed`, which :func:`batches` never stacks)."""
    whole = any(not v.shape or _static(v.shape[0]) for v in (graph.values[n] for n in graph.inputs))
    samples = []
    for path in files:
        loaded = _load(path, list(graph.inputs), graph)
        parts = {n: _samples_of(graph, n, a, path) for n, a in loaded.items()}
        counts = {n: count for n, (count, _) in parts.items()}
        if len(set(counts.values())) > 1:
            raise NpuforgeError(f"{path}: its arrays hold different numbers of samples: " + ", ".join(
                f"'{n}' {list(loaded[n].shape)} holds {counts[n]} (the input is "
                f"{_dims(graph.values[n].shape)})" for n in parts) + "; an array of the input's shape is one "
                f"sample, an array [k, *shape] k samples (k along dim 0 where the input's dim 0 is dynamic)")
        for i in range(next(iter(counts.values()), 0)):
            sample = {n: take(i) for n, (_, take) in parts.items()}
            samples.append(Feed(sample) if whole else sample)
            if len(samples) == limit:
                return samples
    return samples


def batches(samples: list[dict], size: int) -> list[dict]:
    """Consecutive samples stacked ``size`` at a time; samples of different shapes do not stack.
    :func:`read_samples` makes every sample of a model that fixes an input's leading dim a
    :class:`Feed`, and each of those is a batch alone."""
    if samples and isinstance(samples[0], Feed):
        return list(samples)
    out = []
    for start in range(0, len(samples), size):
        group = samples[start:start + size]
        try:
            out.append({n: np.concatenate([s[n] for s in group]) for n in group[0]})
        except ValueError:
            raise NpuforgeError(f"calibration samples {start} to {start + len(group) - 1} have different shapes; "
                                f"give samples of one shape, or --batch-size 1") from None
    return out


class ArrayDataset:
    """Labelled model inputs for ``npuforge eval``: one subfolder of .npy / .npz / .wav files per class
    (classes in name order, as for photos). It quacks like :class:`~npuforge.zoo.data.ImageDataset`
    for :func:`~npuforge.zoo.evaluate.evaluate_logits`: ``dataset[i]`` -> (one sample without its
    batch dim, label, file)."""

    layout = "arrays"

    def __init__(self, root, graph, limit: int | None = None, skip: int = 0):
        self.root = Path(root)
        if len(graph.inputs) != 1:
            raise NpuforgeError(f"{self.root}: evaluation feeds one-input models; this one has inputs "
                                f"{', '.join(graph.inputs)}")
        folders = sorted(d for d in self.root.iterdir() if d.is_dir() and array_files(d))
        self.classes = [d.name for d in folders]
        self.samples: list[tuple[np.ndarray, int, Path]] = []
        for label, folder in enumerate(folders):
            for path in array_files(folder):
                for sample in read_samples(graph, [path], -1):  # (a fixed batch of B: B rows, each labelled)
                    self.samples.extend((row, label, path) for row in sample[graph.inputs[0]])
        self.samples = self.samples[skip:]
        if limit is not None:
            self.samples = self.samples[:limit]
        self.skipped: list = []

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]


def labelled_array_folders(root) -> bool:
    """Whether ``root`` holds class subfolders of input arrays (and so is evaluated as such)."""
    root = Path(root)
    return root.is_dir() and any(d.is_dir() and array_files(d) for d in root.iterdir())
