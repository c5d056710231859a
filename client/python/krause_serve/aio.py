"""The asyncio client: Client's methods on grpc.aio, for many calls in flight from one thread."""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Iterable, List, Optional, Sequence, Union

import grpc

from krause_serve import _calls
from krause_serve._errors import from_rpc_error
from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._generate import Event, ResumePlan, generate_request
from krause_serve._images import ImageLike, ImagesLike
from krause_serve._types import (ClassifyResult, GeneratedImage, Inspection, ModelInfo,
                                 RepositoryEntry, ScoreResult)
from krause_serve.client import _Connection, _attempt_timeout, _entries


class AsyncClient(_Connection):
    """Client's methods as coroutines (generate: an async iterator), on grpc.aio. The same
    arguments as Client; use it with `async with`, or await close()."""

    _grpc = grpc.aio

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method: str, request, idempotent: bool = True):
        fn = getattr(self._stub, method)
        attempt = 0
        while True:
            try:
                return await fn(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                delay = _calls.retry_delay(error, attempt, self.retries if idempotent else 0)
                if delay is None:
                    raise error from None
                await asyncio.sleep(delay)
                attempt += 1

    async def models(self) -> List[ModelInfo]:
        """As Client.models."""
        r = await self._call("ListModels", pb.ListModelsRequest())
        return [ModelInfo.from_proto(m) for m in r.models]

    async def model(self, name: str, version: str = "") -> ModelInfo:
        """As Client.model."""
        return ModelInfo.from_proto(await self._call("GetModel", pb.GetModelRequest(name=name, version=version)))

    async def classify(self, images: ImagesLike, model: str = "", top_k: int = 5,
                       version: str = "", priority: int = 0) -> ClassifyResult:
        """As Client.classify."""
        return ClassifyResult.from_proto(await self._call(
            "Classify", _calls.classify_request(images, model, top_k, version, priority)))

    async def score(self, images: ImagesLike, model: str = "",
                    label: Union[None, str, Sequence[str]] = None,
                    class_index: Union[None, int, Sequence[int]] = None,
                    version: str = "") -> ScoreResult:
        """As Client.score."""
        return ScoreResult.from_proto(await self._call(
            "Score", _calls.score_request(images, model, label, class_index, version)))

    async def inspect(self, image: ImageLike, model: str = "",
                      layers: Optional[Iterable[int]] = None, heads: Optional[Iterable[int]] = None,
                      queries: Optional[Iterable[int]] = None, top_k: int = 0,
                      label: Optional[str] = None, class_index: Optional[int] = None,
                      version: str = "") -> Inspection:
        """As Client.inspect."""
        r = await self._call("Inspect", _calls.inspect_request(image, model, layers, queries,
                                                               top_k, label, class_index, version))
        return Inspection.from_proto(r, heads)

    async def generate(self, **settings) -> AsyncIterator[Event]:
        """As Client.generate (the same keyword arguments): an async iterator of its events;
        leaving the loop cancels the call on the server."""
        plan = ResumePlan(generate_request(**settings), self.max_resumes if self.resume else 0)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while plan.attempts():
            request, images = plan.attempts()[0]
            call = self._stub.Generate(request, timeout=_attempt_timeout(deadline, self.attempt_timeout),
                                       metadata=self._metadata)
            try:
                async for message in call:
                    for event in plan.on_message(message, images):
                        yield event
                plan.done_attempt()
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                if deadline is not None and time.monotonic() >= deadline:
                    raise error from None
                await asyncio.sleep(plan.on_break(error))
            finally:
                call.cancel()
        yield plan.summary()

    async def generate_images(self, **settings) -> List[GeneratedImage]:
        """As Client.generate_images."""
        out = [e async for e in self.generate(**settings) if isinstance(e, GeneratedImage)]
        return sorted(out, key=lambda g: g.image)

    async def load_model(self, name: str, version: str = "") -> List[RepositoryEntry]:
        """As Client.load_model."""
        r = await self._call("LoadModel", pb.LoadModelRequest(name=name, version=version), False)
        return _entries(r.versions)

    async def unload_model(self, name: str, version: str = "") -> List[RepositoryEntry]:
        """As Client.unload_model."""
        r = await self._call("UnloadModel", pb.UnloadModelRequest(name=name, version=version), False)
        return _entries(r.versions)

    async def repository_index(self, ready: bool = False) -> List[RepositoryEntry]:
        """As Client.repository_index."""
        r = await self._call("RepositoryIndex", pb.RepositoryIndexRequest(ready_only=ready))
        return _entries(r.models)
