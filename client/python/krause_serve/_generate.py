"""Generate's requests and its stream across replicas, as plain state (no gRPC, no clock): the
sync and asyncio clients carry it out.

A stream that breaks (the replica died, drained, or refused) is resumed as krause-client does
(docs/api.md, "Resuming a stream"): the finished images are kept; each unfinished image with
rows beyond the call's own prompt is asked again as a completion of the rows received (the
call's seed, its own index as first_image, one image; an image whose every row came but not its
PNG, from all rows but the last); runs of untouched images together; always with the call's
class and settings and the first attempt's model version. The server guarantees that such a
completion is the uninterrupted image byte for byte, so the caller sees one stream: every row
once and in order, each image once, one summary.
"""
from __future__ import annotations

import random
import time
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from krause_serve._errors import KrauseError
from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._images import ImageLike, image_message
from krause_serve._types import GeneratedImage, Progress, Rows, Start, Summary

Event = Union[Start, Rows, Progress, GeneratedImage, Summary]


def generate_request(*, model: str = "", n: int = 1, seed: Optional[int] = None,
                     label: Optional[str] = None, class_index: Optional[int] = None,
                     temperature: Optional[float] = None, top_p: Optional[float] = None,
                     top_k: Optional[int] = None, guidance: Optional[float] = None,
                     prompt: Optional[ImageLike] = None, prompt_rows: Optional[int] = None,
                     version: str = "", update_interval_ms: int = 0,
                     priority: int = 0) -> pb.GenerateRequest:
    """krause.v1's GenerateRequest; the seed is drawn here when none is given, so that the images
    can be made again (and a broken stream resumed)."""
    if label is not None and class_index is not None:
        raise ValueError("give label or class_index, not both")
    r = pb.GenerateRequest(model=model, num_images=n, version=version,
                           update_interval_ms=update_interval_ms, priority=priority)
    r.seed = seed if seed is not None else random.getrandbits(63)
    if label is not None:
        r.label = label
    if class_index is not None:
        r.class_index = class_index
    for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                        ("guidance", guidance)):
        if value is not None:
            setattr(r, name, value)
    if prompt is not None:
        r.prompt.CopyFrom(image_message(prompt))
        if prompt_rows is None:
            raise ValueError("a prompt needs prompt_rows: the rows of it to keep")
        r.prompt_rows = prompt_rows
    return r


# A break worth resuming: the replica went away or refused, or cancelled a call the client did
# not cancel (a replica at the end of its shutdown), or one attempt ran past its own deadline.
RESUMABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.DEADLINE_EXCEEDED)


class ResumePlan:
    """One Generate call over its attempts.

    attempts() gives what to ask now: (request, the call's image index of each of its images).
    on_message() turns an attempt's message into the caller's events. on_break() records a
    break and says whether to go on; then attempts() gives the resumed requests.
    """

    def __init__(self, request: pb.GenerateRequest, max_resumes: int = 8,
                 backoff: float = 0.05, max_backoff: float = 2.0):
        self.request = request
        self.n = max(1, request.num_images)
        self.own_prompt_rows = request.prompt_rows if request.HasField("prompt") else 0
        self.max_resumes = max_resumes
        self.backoff, self.max_backoff = backoff, max_backoff
        self.rows: List[bytearray] = [bytearray() for _ in range(self.n)]
        self.finished = [False] * self.n
        self.start: Optional[Start] = None
        self.version = request.version
        self.breaks: List[str] = []
        self.breaks_in_a_row = 0
        self.pixels_generated = 0
        self.flops = [0.0, 0.0]
        self.started_at = time.monotonic()
        self._attempts: List[Tuple[pb.GenerateRequest, List[int]]] = [
            (request, list(range(self.n)))]

    # --- what to ask

    def attempts(self) -> List[Tuple[pb.GenerateRequest, List[int]]]:
        return list(self._attempts)

    def done_attempt(self) -> None:
        """The first pending attempt ended well."""
        self._attempts.pop(0)
        self.breaks_in_a_row = 0

    def _row_bytes(self) -> int:
        _, w, c = self.start.shape
        return w * c

    def on_break(self, error: KrauseError, cancelled_by_caller: bool = False) -> float:
        """Records a broken attempt. Returns the seconds to wait before the resumed attempts;
        raises `error` when the call cannot go on (the request's own error, too many breaks, a
        stream that never started)."""
        if (cancelled_by_caller or error.code not in RESUMABLE or self.start is None
                or len(self.breaks) >= self.max_resumes):
            raise error
        self.breaks.append(f"{error.code.name}: {error.message}")
        delay = (error.retry_delay if error.retry_delay is not None
                 else min(self.max_backoff, self.backoff * 2 ** self.breaks_in_a_row))
        self.breaks_in_a_row += 1
        self._attempts = self._resumed()
        return delay

    def _resumed(self) -> List[Tuple[pb.GenerateRequest, List[int]]]:
        height, width, channels = self.start.shape
        per_row = self._row_bytes()
        out: List[Tuple[pb.GenerateRequest, List[int]]] = []
        run: List[int] = []

        def ask(images: List[int], prompt_rows: int = 0) -> None:
            r = pb.GenerateRequest()
            r.CopyFrom(self.request)
            r.seed = self.start.seed
            r.version = self.version
            r.first_image = self.request.first_image + images[0]
            r.num_images = len(images)
            if prompt_rows:
                r.prompt.CopyFrom(pb.Image(raw=pb.RawImage(
                    pixels=bytes(self.rows[images[0]][:prompt_rows * per_row]),
                    height=prompt_rows, width=width, channels=channels)))
                r.prompt_rows = prompt_rows
            out.append((r, images))

        for i in range(self.n):
            if self.finished[i]:
                continue
            have = len(self.rows[i]) // per_row
            if have > self.own_prompt_rows:
                if run:
                    ask(run)
                    run = []
                ask([i], have if have < height else height - 1)
            elif run and run[-1] != i - 1:
                ask(run)
                run = [i]
            else:
                run.append(i)
        if run:
            ask(run)
        return out

    # --- what the caller sees

    def on_message(self, m: pb.GenerateResponse, images: Sequence[int]) -> Iterator[Event]:
        if m.HasField("start") and self.start is not None and \
                m.start.numerics != self.start.numerics:
            # A replica that computes otherwise would continue the images with other bits.
            raise KrauseError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"not resumed: the resumed attempt's replica computes with "
                f"\"{m.start.numerics}\", the stream began with \"{self.start.numerics}\" "
                f"(its rows would not continue these images bit for bit)")
        if m.HasField("start") and self.start is None:
            s = m.start
            self.start = Start(s.model, s.model_version, s.seed, s.first_image,
                               (s.height, s.width, s.channels), s.numerics)
            self.version = s.model_version  # resumes ask this version
            yield self.start
        if m.HasField("progress") and len(self._attempts) == 1 and not self.breaks:
            p = m.progress
            yield Progress(p.pixels_done, p.pixels_total, p.images_done, p.images_total,
                           p.waiting)
        if m.rows and self.start is not None:
            _, width, channels = self.start.shape
            per_row = width * channels
            for r in m.rows:
                i = images[r.image]
                have = len(self.rows[i]) // per_row
                end = r.first_row + r.num_rows
                if end <= have or r.first_row > have:
                    continue  # rows the caller has (a completion's prompt), or a gap
                new = r.pixels[(have - r.first_row) * per_row:]
                self.rows[i] += new
                yield Rows(i, have, np.frombuffer(new, dtype=np.uint8).reshape(-1, width, channels))
        for g in m.images:
            i = images[g.image]
            if not self.finished[i]:
                self.finished[i] = True
                yield GeneratedImage(i, g.seed, g.png)
        if m.HasField("summary"):
            self.pixels_generated += m.summary.pixels_generated
            self.flops[0] += m.summary.flops_executed
            self.flops[1] += m.summary.flops_dense_equivalent

    def summary(self) -> Summary:
        s = self.start
        return Summary(s.model if s else self.request.model, self.version,
                       s.seed if s else self.request.seed, sum(self.finished),
                       self.pixels_generated, time.monotonic() - self.started_at, self.flops[0],
                       self.flops[1], len(self.breaks), tuple(self.breaks))
