"""The synchronous client."""
from __future__ import annotations

import time
from typing import Iterable, Iterator, List, Optional, Sequence, Union

import grpc

from krause_serve import _calls
from krause_serve._channel import Address, channel_options, credentials, metadata, target
from krause_serve._errors import from_rpc_error
from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._gen.krause.v1 import krause_pb2_grpc as pb_grpc
from krause_serve._generate import Event, ResumePlan, generate_request
from krause_serve._images import ImageLike, ImagesLike
from krause_serve._types import (ClassifyResult, GeneratedImage, Inspection, ModelInfo,
                                 RepositoryEntry, ScoreResult)


def _entries(versions) -> List[RepositoryEntry]:
    return [RepositoryEntry(v.name, v.version, pb.RepositoryEntry.State.Name(v.state), v.reason)
            for v in versions]


class _Connection:
    """What Client and AsyncClient share: the channel (of `_grpc`: grpc or grpc.aio), the stub,
    the token and the call settings."""

    _grpc = grpc

    def __init__(self, address: Address = "localhost:50051", *, token: Optional[str] = None,
                 tls: bool = False, root_certificates: Optional[bytes] = None,
                 certificate_chain: Optional[bytes] = None, private_key: Optional[bytes] = None,
                 timeout: Optional[float] = None, retries: int = 3, resume: bool = True,
                 max_resumes: int = 8, attempt_timeout: Optional[float] = None,
                 max_message_bytes: int = 64 << 20):
        creds = credentials(tls, root_certificates, certificate_chain, private_key)
        options = channel_options(address, max_message_bytes)
        self._channel = (self._grpc.secure_channel(target(address), creds, options) if creds
                         else self._grpc.insecure_channel(target(address), options))
        self._stub = pb_grpc.KrauseServiceStub(self._channel)
        self._metadata = metadata(token)
        self.timeout, self.retries = timeout, retries
        self.resume, self.max_resumes, self.attempt_timeout = resume, max_resumes, attempt_timeout


class Client(_Connection):
    """krause-serve over gRPC (krause.v1).

    Args:
        address: "host:port", or a list of replicas' addresses: calls are spread round robin,
            a replica whose connection is down is skipped, and a broken generation resumes on
            another replica (the images stay byte-identical).
        token: the bearer token (--auth_tokens); admin calls need an --admin_tokens one.
        tls: connect with TLS (the system's roots unless root_certificates is given).
        root_certificates, certificate_chain, private_key: PEM bytes for a private CA and
            mutual TLS.
        timeout: each call's deadline in seconds (a generation's: the whole call, its resumes
            included); None: none.
        retries: how often an idempotent call (models, classify, score, inspect) is repeated
            after a refusal worth repeating, as the server's retry information says.
        resume: resume a broken generation on another replica; max_resumes: breaks survived per
            call.
        attempt_timeout: one generation attempt's deadline (past it, it is resumed); None: none.

    Usable as a context manager (the channel is closed at the end). Thread-safe: calls may run
    from several threads at once.
    """

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- unary calls

    def _call(self, method: str, request, idempotent: bool = True):
        fn = getattr(self._stub, method)
        attempt = 0
        while True:
            try:
                return fn(request, timeout=self.timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                delay = _calls.retry_delay(error, attempt, self.retries if idempotent else 0)
                if delay is None:
                    raise error from None
                time.sleep(delay)
                attempt += 1

    def models(self) -> List[ModelInfo]:
        """The served models."""
        return [ModelInfo.from_proto(m) for m in self._call("ListModels", pb.ListModelsRequest()).models]

    def model(self, name: str, version: str = "") -> ModelInfo:
        """One served model (the newest version unless `version` names one)."""
        return ModelInfo.from_proto(self._call("GetModel", pb.GetModelRequest(name=name, version=version)))

    def classify(self, images: ImagesLike, model: str = "", top_k: int = 5,
                 version: str = "", priority: int = 0) -> ClassifyResult:
        """Classifies images: a uint8 array [N, H, W, C], [N, H, W] of grey images or [H, W],
        PIL images, paths or PNG bytes (one, or a sequence). Each result has every class's
        probability, the `top_k` most probable classes and the label. `priority` 0 .. 2: higher
        is served sooner among your tenant's calls (2 needs the token's max_priority=2)."""
        return ClassifyResult.from_proto(self._call(
            "Classify", _calls.classify_request(images, model, top_k, version, priority)))

    def score(self, images: ImagesLike, model: str = "", label: Union[None, str, Sequence[str]] = None,
              class_index: Union[None, int, Sequence[int]] = None, version: str = "") -> ScoreResult:
        """Bits per dimension of each image under a generator, with a class for every image, one
        per image, or none."""
        return ScoreResult.from_proto(
            self._call("Score", _calls.score_request(images, model, label, class_index, version)))

    def inspect(self, image: ImageLike, model: str = "", layers: Optional[Iterable[int]] = None,
                heads: Optional[Iterable[int]] = None, queries: Optional[Iterable[int]] = None,
                top_k: int = 0, label: Optional[str] = None, class_index: Optional[int] = None,
                version: str = "") -> Inspection:
        """What one image's attention keeps: per layer and head the kept keys and weights of each
        query (numpy) and the head's figures. `heads` keeps only those heads."""
        r = self._call("Inspect", _calls.inspect_request(image, model, layers, queries, top_k,
                                                         label, class_index, version))
        return Inspection.from_proto(r, heads)

    # --- generation

    def generate(self, *, model: str = "", n: int = 1, seed: Optional[int] = None,
                 label: Optional[str] = None, class_index: Optional[int] = None,
                 temperature: Optional[float] = None, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, guidance: Optional[float] = None,
                 prompt: Optional[ImageLike] = None, prompt_rows: Optional[int] = None,
                 version: str = "", update_interval_ms: int = 0,
                 priority: int = 0) -> Iterator[Event]:
        """Generates `n` images, as events: Start, then Rows as they are sampled, Progress while
        waiting, GeneratedImage for each finished image, and a Summary last. Leaving the loop
        (or closing the iterator) cancels the call on the server, which frees its cache slots.
        A completion keeps the first `prompt_rows` rows of `prompt`. The seed is drawn here
        when none is given (Start and Summary report it). `priority` as classify's: higher gets
        its cache slots sooner among your tenant's images."""
        request = generate_request(model=model, n=n, seed=seed, label=label,
                                   class_index=class_index, temperature=temperature,
                                   top_p=top_p, top_k=top_k, guidance=guidance, prompt=prompt,
                                   prompt_rows=prompt_rows, version=version,
                                   update_interval_ms=update_interval_ms, priority=priority)
        plan = ResumePlan(request, self.max_resumes if self.resume else 0)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while plan.attempts():
            request, images = plan.attempts()[0]
            timeout = _attempt_timeout(deadline, self.attempt_timeout)
            call = self._stub.Generate(request, timeout=timeout, metadata=self._metadata)
            try:
                for message in call:
                    yield from plan.on_message(message, images)
                plan.done_attempt()
            except grpc.RpcError as e:
                error = from_rpc_error(e)
                if deadline is not None and time.monotonic() >= deadline:
                    raise error from None
                time.sleep(plan.on_break(error))
            finally:
                call.cancel()  # a no-op once the call ended; else the caller left the loop
        yield plan.summary()

    def generate_images(self, **settings) -> List[GeneratedImage]:
        """generate()'s finished images, in order (the same settings)."""
        out = [e for e in self.generate(**settings) if isinstance(e, GeneratedImage)]
        return sorted(out, key=lambda g: g.image)

    # --- model control (an admin token with --admin_tokens)

    def load_model(self, name: str, version: str = "") -> List[RepositoryEntry]:
        """Loads a model's policy versions, or the one named; its versions afterwards."""
        return _entries(self._call("LoadModel", pb.LoadModelRequest(name=name, version=version),
                                   idempotent=False).versions)

    def unload_model(self, name: str, version: str = "") -> List[RepositoryEntry]:
        """Unloads every version of a model, or the one named; its versions afterwards."""
        return _entries(self._call("UnloadModel", pb.UnloadModelRequest(name=name, version=version),
                                   idempotent=False).versions)

    def repository_index(self, ready: bool = False) -> List[RepositoryEntry]:
        """Every model version the repository holds with its state (only serving ones: ready)."""
        return _entries(self._call("RepositoryIndex", pb.RepositoryIndexRequest(ready_only=ready)).models)


def _attempt_timeout(deadline: Optional[float], attempt_timeout: Optional[float]) -> Optional[float]:
    """One attempt's deadline in seconds from now: the call's, or the attempt's if sooner."""
    left = None if deadline is None else max(0.001, deadline - time.monotonic())
    if attempt_timeout is None:
        return left
    return attempt_timeout if left is None else min(left, attempt_timeout)
