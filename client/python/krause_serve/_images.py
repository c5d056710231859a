"""Images in (numpy arrays, PIL images, paths, PNG bytes) and out (numpy, PIL)."""
from __future__ import annotations

import io
import os
from typing import List, Sequence, Union

import numpy as np
from PIL import Image as PILImage

from krause_serve._gen.krause.v1 import krause_pb2 as pb

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# One image: a uint8 array [H, W] (grey) or [H, W, C] (C 1 or 3), a PIL image, a path to a
# picture file, or a PNG file's bytes.
ImageLike = Union[np.ndarray, PILImage.Image, str, "os.PathLike[str]", bytes]
# Several: a uint8 array [N, H, W, C], or [N, H, W] of grey images (the layout Fashion-MNIST and
# MNIST loaders give: an array of 3 dimensions whose last is not 1 or 3, which cannot be one
# [H, W, C] image), or a sequence of ImageLike. One ImageLike is one image.
ImagesLike = Union[ImageLike, Sequence[ImageLike]]


def _raw(array: np.ndarray) -> pb.Image:
    if array.dtype != np.uint8:
        raise TypeError(f"images must be uint8 (0-255), got {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3):
        raise ValueError(f"an image is [H, W] or [H, W, C] with C 1 or 3, got shape {array.shape}")
    h, w, c = array.shape
    return pb.Image(raw=pb.RawImage(pixels=np.ascontiguousarray(array).tobytes(), height=h,
                                    width=w, channels=c))


def _from_pil(image: PILImage.Image) -> pb.Image:
    grey = image.mode in ("1", "L", "LA", "I", "I;16", "F")
    return _raw(np.asarray(image.convert("L" if grey else "RGB")))


def image_message(image: ImageLike) -> pb.Image:
    """krause.v1's Image: raw pixels, or a PNG file's own bytes (the server decodes them)."""
    if isinstance(image, np.ndarray):
        return _raw(image)
    if isinstance(image, PILImage.Image):
        return _from_pil(image)
    if isinstance(image, (str, os.PathLike)):
        with open(image, "rb") as f:
            image = f.read()
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        if data.startswith(PNG_SIGNATURE):
            return pb.Image(png=data)
        return _from_pil(PILImage.open(io.BytesIO(data)))  # another format: decoded here
    raise TypeError(f"not an image: {type(image).__name__} (a uint8 numpy array, a PIL image, "
                    "a path or PNG bytes)")


def image_messages(images: ImagesLike) -> List[pb.Image]:
    """The request's images: an array [N, H, W, C] is N images, and so is [N, H, W] when its last
    dimension is not 1 or 3 (N grey images); any other single image is one."""
    if isinstance(images, np.ndarray):
        if images.ndim == 4 or (images.ndim == 3 and images.shape[2] not in (1, 3)):
            return [_raw(a) for a in images]
        return [_raw(images)]
    if isinstance(images, (PILImage.Image, str, os.PathLike, bytes, bytearray, memoryview)):
        return [image_message(images)]
    return [image_message(i) for i in images]


def decode_png(png: bytes) -> np.ndarray:
    """A PNG's pixels as uint8 [H, W, C] (C 1 or 3)."""
    a = np.asarray(PILImage.open(io.BytesIO(png)))
    return a[:, :, None] if a.ndim == 2 else a


def to_pil(array: np.ndarray) -> PILImage.Image:
    """uint8 [H, W, C] as a PIL image ("L" or "RGB")."""
    return PILImage.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)
