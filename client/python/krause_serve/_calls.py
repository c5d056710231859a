"""Each call's request from Python values, and when to retry an idempotent one: what the sync and
asyncio clients share."""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

from krause_serve._errors import KrauseError
from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._images import ImageLike, ImagesLike, image_message, image_messages


def classify_request(images: ImagesLike, model: str, top_k: int, version: str,
                     priority: int = 0) -> pb.ClassifyRequest:
    return pb.ClassifyRequest(model=model, images=image_messages(images), top_k=top_k,
                              return_probabilities=True, version=version, priority=priority)


def score_request(images: ImagesLike, model: str, label: Union[None, str, Sequence[str]],
                  class_index: Union[None, int, Sequence[int]], version: str) -> pb.ScoreRequest:
    """One label (or class index) for every image, or one per image ("" / -1: none)."""
    ims = image_messages(images)
    r = pb.ScoreRequest(model=model, images=ims, version=version)
    if label is not None and class_index is not None:
        raise ValueError("give label or class_index, not both")
    if label is not None:
        r.labels.extend([label] * len(ims) if isinstance(label, str) else list(label))
    if class_index is not None:
        r.class_indices.extend([class_index] * len(ims) if isinstance(class_index, int)
                               else list(class_index))
    return r


def inspect_request(image: ImageLike, model: str, layers: Optional[Iterable[int]],
                    queries: Optional[Iterable[int]], top_k: int, label: Optional[str],
                    class_index: Optional[int], version: str) -> pb.InspectRequest:
    r = pb.InspectRequest(model=model, image=image_message(image), layers=list(layers or []),
                          queries=list(queries or []), top_k=top_k, version=version)
    if label is not None and class_index is not None:
        raise ValueError("give label or class_index, not both")
    if label is not None:
        r.label = label
    if class_index is not None:
        r.class_index = class_index
    return r


def retry_delay(error: KrauseError, attempt: int, retries: int) -> Optional[float]:
    """Seconds to wait before attempt `attempt + 1` of an idempotent call that failed with
    `error`, or None to give up: a refusal worth repeating (UNAVAILABLE, RESOURCE_EXHAUSTED)
    waits the server's RetryInfo delay (0 when draining: another replica at once), else 50 ms
    doubling; at most `retries` repeats."""
    if not error.retryable or attempt >= retries:
        return None
    if error.retry_delay is not None:
        return error.retry_delay
    return min(2.0, 0.05 * 2 ** attempt)
