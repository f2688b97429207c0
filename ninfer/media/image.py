"""Image preparation: bytes -> decoded RGB -> smart resize -> normalised patch rows.

`prepare_image(data, config)` is the whole path and the only entry point. It reads the image
header first and refuses a frame larger than `config.max_source_pixels` before any pixel is
decoded (a 20000 x 20000 PNG is a few hundred bytes and would decode to 1.2 GB), then decodes,
applies the EXIF orientation, composites transparency onto white and converts to RGB, resizes
with bicubic filtering to the smart-resize size, and builds the patch rows with the image
repeated to `temporal_patch_size` frames. The numbers match transformers'
``Qwen2VLImageProcessorPil`` (the image processor of Qwen2-VL, Qwen3-VL and Qwen3.5).

Errors: ``invalid_media`` for bytes that are not an image of an accepted format, truncated or
corrupt data, or an impossible shape; ``media_budget_exceeded`` for a frame over the pixel bound.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ninfer.media import errors
from ninfer.media.config import VisionPreprocessConfig
from ninfer.media.patches import PreparedMedia, pack, smart_resize_image, to_prepared

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def open_checked(data: bytes, config: VisionPreprocessConfig) -> Image.Image:
    """The image in `data`, header read and size checked, pixels not yet decoded."""
    if not data:
        raise errors.invalid_media("the image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Pillow warns (and past twice its limit, raises) about large frames; our own bound
            # below is the one that decides, with a message that names it.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as e:
        raise errors.budget_exceeded(
            f"the image is larger than the limit of {config.max_source_pixels} pixels ({e})"
        ) from e
    except UnidentifiedImageError as e:
        raise errors.invalid_media(
            f"the bytes are not an image in an accepted format ({', '.join(FORMATS)})"
        ) from e
    except (OSError, SyntaxError, ValueError) as e:
        raise errors.invalid_media(f"the image header is truncated or corrupt: {e}") from e
    width, height = image.size
    if width * height > config.max_source_pixels:
        raise errors.budget_exceeded(
            f"the image is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{config.max_source_pixels} pixels"
        )
    if width <= 0 or height <= 0:
        raise errors.invalid_media(f"the image has no pixels ({width}x{height})")
    return image


def decode_rgb(data: bytes, config: VisionPreprocessConfig) -> Image.Image:
    """The upright RGB image in `data` (first frame of an animation), fully decoded."""
    image = open_checked(data, config)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
            image = ImageOps.exif_transpose(image)
            return to_rgb(image)
    except Image.DecompressionBombError as e:
        raise errors.budget_exceeded(f"the image decodes to too many pixels ({e})") from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise errors.invalid_media(f"the image data is truncated or corrupt: {e}") from e


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (as the Qwen processors do)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def prepare_image(data: bytes, config: VisionPreprocessConfig) -> PreparedMedia:
    """Encoded image bytes -> `PreparedMedia` (see the module docstring). Pure and thread-safe."""
    image = decode_rgb(data, config)
    return prepare_rgb(image, config)


def prepare_rgb(image: Image.Image, config: VisionPreprocessConfig) -> PreparedMedia:
    """A decoded RGB image -> `PreparedMedia`, without the decoding steps."""
    width, height = image.size
    new_h, new_w = smart_resize_image(
        height, width, config.factor, config.image_min_pixels, config.image_max_pixels
    )
    resized = np.asarray(image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC))
    # The image is its own temporal pair: repeated to temporal_patch_size frames.
    frames = np.broadcast_to(resized[None], (config.temporal_patch_size, *resized.shape))
    rows, grid = pack(frames, config)
    return to_prepared("image", rows, grid, config)
