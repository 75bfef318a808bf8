"""Reading one image file. Every reader of photos goes through :func:`read_rgb`, so a corrupt,
truncated or oversized file gets the same one-line reason wherever it is read."""

from __future__ import annotations

from PIL import Image, UnidentifiedImageError

from .errors import NpuforgeError

# Refused before decoding: an 8K frame is 33 M pixels; a 20000 x 20000 PNG (400 M) would take 1.2 GB
# decoded, and PIL itself refuses above 179 M as a possible decompression bomb.
MAX_PIXELS = 1 << 26


class ImageReadError(NpuforgeError):
    """An image file that cannot be read: corrupt, truncated, not an image, or too large."""


def read_rgb(path) -> Image.Image:
    """The image at ``path``, decoded and converted to RGB; ImageReadError says why not."""
    try:
        with Image.open(path) as img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise ImageReadError(f"{path}: {width} x {height} pixels is above the {MAX_PIXELS:,}-pixel limit; "
                                     f"downscale the image")
            img.load()
            return img.convert("RGB")
    except Image.DecompressionBombError:
        raise ImageReadError(f"{path}: larger than PIL decodes safely (far above the {MAX_PIXELS:,}-pixel limit); "
                             f"downscale the image") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        # PIL raises SyntaxError and EOFError from some truncated or malformed headers
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageReadError(f"{path}: cannot read the image ({reason})") from None
