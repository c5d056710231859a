"""What the calls return: plain dataclasses with numpy arrays, built from krause.v1's messages."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
from PIL import Image as PILImage

from krause_serve._gen.krause.v1 import krause_pb2 as pb
from krause_serve._images import decode_png, to_pil


@dataclass(frozen=True)
class KernelCheck:
    """One implementation tried against the reference operator when the model was loaded."""
    implementation: str
    device: str
    result: str  # passed, mismatch, non_finite, error, unchecked
    max_abs_diff: float
    tolerance: float
    detail: str
    seconds: float


def _optional(message, name):
    return getattr(message, name) if message.HasField(name) else None


@dataclass(frozen=True)
class ModelInfo:
    """A served model (krause.v1's ModelInfo)."""
    name: str
    kind: str        # "classifier" or "generator"
    attention: str   # "krause" or "softmax"
    version: str
    is_default: bool
    shape: Tuple[int, int, int]  # (height, width, channels)
    labels: Tuple[str, ...]
    classes: int     # generators: the classes a conditional model draws (0: unconditional)
    window: int
    top_k: Tuple[int, ...]
    parameters: int
    flops_per_image_executed: float
    flops_per_image_dense_equivalent: float
    device: str
    implementation: str
    kernel_checks: Tuple[KernelCheck, ...]
    max_batch_size: int
    max_queue_delay_ms: int
    max_images_per_request: int
    kv_cache_bytes_per_sequence: int
    kv_cache_dtype: str
    weights_dtype: str  # the linear layers' weights as served: "float32" or "bfloat16"
    cpu_kernels: str    # models on the CPU: the CPU kernels' variant ("avx512", "avx2", "base")
    precision: str      # the arithmetic served: "fp32" or "bf16" (the linear layers in bfloat16)
    precision_fallback: str  # why a model asked for bf16 computes in fp32 ("" otherwise)
    linear_kernels: str  # what computes the linear layers ("avx512", "onednn brg:...")
    checkpoint: str
    default_temperature: Optional[float]
    default_top_p: Optional[float]
    default_top_k: Optional[int]
    default_guidance: Optional[float]

    @property
    def flop_saving(self) -> float:
        """The share of dense attention's FLOPs this model does not spend (0 for softmax)."""
        dense = self.flops_per_image_dense_equivalent
        return 1 - self.flops_per_image_executed / dense if dense else 0.0

    @classmethod
    def from_proto(cls, m: pb.ModelInfo) -> "ModelInfo":
        return cls(
            name=m.name, kind=pb.ModelInfo.Kind.Name(m.kind).lower(),
            attention=pb.ModelInfo.Attention.Name(m.attention).lower(), version=m.version,
            is_default=m.is_default, shape=(m.height, m.width, m.channels), labels=tuple(m.labels),
            classes=m.classes, window=m.window, top_k=tuple(m.top_k), parameters=m.parameters,
            flops_per_image_executed=m.flops_per_image_executed,
            flops_per_image_dense_equivalent=m.flops_per_image_dense_equivalent, device=m.device,
            implementation=m.implementation,
            kernel_checks=tuple(KernelCheck(k.implementation, k.device, k.result, k.max_abs_diff,
                                            k.tolerance, k.detail, k.seconds)
                                for k in m.kernel_checks),
            max_batch_size=m.max_batch_size, max_queue_delay_ms=m.max_queue_delay_ms,
            max_images_per_request=m.max_images_per_request,
            kv_cache_bytes_per_sequence=m.kv_cache_bytes_per_sequence,
            kv_cache_dtype=m.kv_cache_dtype, weights_dtype=m.weights_dtype,
            cpu_kernels=m.cpu_kernels, precision=m.precision,
            precision_fallback=m.precision_fallback, linear_kernels=m.linear_kernels,
            checkpoint=m.checkpoint,
            default_temperature=_optional(m, "default_temperature"),
            default_top_p=_optional(m, "default_top_p"),
            default_top_k=_optional(m, "default_top_k"),
            default_guidance=_optional(m, "default_guidance"))


@dataclass(frozen=True)
class ClassScore:
    index: int
    label: str  # "" when the model has no label for it
    probability: float


@dataclass(frozen=True)
class Classification:
    """One image's classes: the most probable first (ties: the lower index first)."""
    top: Tuple[ClassScore, ...]
    probabilities: np.ndarray  # float32 [classes]

    @property
    def label(self) -> str:
        """The most probable class's label (its index as text when the model has no labels)."""
        return self.top[0].label or str(self.top[0].index)


@dataclass(frozen=True)
class ClassifyResult:
    """A Classify call: one Classification per image, in the order given."""
    model: str
    model_version: str
    results: Tuple[Classification, ...]
    flops_executed: float
    flops_dense_equivalent: float

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> Classification:
        return self.results[i]

    @property
    def probabilities(self) -> np.ndarray:
        """float32 [N, classes]."""
        return np.stack([r.probabilities for r in self.results])

    @property
    def labels(self) -> List[str]:
        return [r.label for r in self.results]

    @classmethod
    def from_proto(cls, r: pb.ClassifyResponse) -> "ClassifyResult":
        return cls(r.model, r.model_version,
                   tuple(Classification(tuple(ClassScore(s.index, s.label, s.probability)
                                              for s in c.top),
                                        np.array(c.probabilities, dtype=np.float32))
                         for c in r.results),
                   r.flops_executed, r.flops_dense_equivalent)


@dataclass(frozen=True)
class ScoreResult:
    """A Score call: bits per dimension per image (lower: likelier)."""
    model: str
    model_version: str
    bits_per_dim: np.ndarray  # float64 [N]
    mean_bits_per_dim: float
    scored_subpixels_per_image: int
    flops_executed: float
    flops_dense_equivalent: float

    @classmethod
    def from_proto(cls, r: pb.ScoreResponse) -> "ScoreResult":
        return cls(r.model, r.model_version, np.array(r.bits_per_dim, dtype=np.float64),
                   r.mean_bits_per_dim, r.scored_subpixels_per_image, r.flops_executed,
                   r.flops_dense_equivalent)


# --- Generate's events, in the order they come -------------------------------------------------

@dataclass(frozen=True)
class Start:
    """First: what the call resolved (its seed too when the request set none)."""
    model: str
    model_version: str
    seed: int
    first_image: int
    shape: Tuple[int, int, int]  # (height, width, channels)
    # What decides the images' bits besides the request (precision, implementation, CPU kernel
    # family, dtypes): a resumed attempt must come from a replica that says the same.
    numerics: str = ""


@dataclass(frozen=True)
class Rows:
    """Rows of one image as they are sampled: every row of every image once, in order."""
    image: int
    first_row: int
    pixels: np.ndarray  # uint8 [rows, W, C]


@dataclass(frozen=True)
class Progress:
    pixels_done: int
    pixels_total: int
    images_done: int
    images_total: int
    waiting: int  # images still waiting for a cache slot


@dataclass(frozen=True)
class GeneratedImage:
    """A finished image: its PNG, exactly as the server encoded it."""
    image: int
    seed: int  # its own random stream: a one-image call with this seed gives the same image
    png: bytes

    @property
    def array(self) -> np.ndarray:
        """uint8 [H, W, C]."""
        return decode_png(self.png)

    def pil(self) -> PILImage.Image:
        return to_pil(self.array)


@dataclass(frozen=True)
class Summary:
    """Last: the call's figures (summed over the attempts when a broken stream was resumed)."""
    model: str
    model_version: str
    seed: int
    images: int
    pixels_generated: int
    seconds: float
    flops_executed: float
    flops_dense_equivalent: float
    resumed: int = 0  # breaks survived
    breaks: Tuple[str, ...] = field(default=())  # each: "CODE: message"


# --- Inspect ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadAttention:
    head: int
    sigma: float                 # Krause: the head's bandwidth; 0 for softmax
    sink_share: float            # over every query of the image: mean of its largest weight
    mean_distance: float
    effective_neighbours: float  # mean exp(entropy of the weights)
    busiest_key: int
    busiest_key_share: float
    keys: np.ndarray      # int64 [queries, k]: each query's kept keys in rank order; -1: none
    weights: np.ndarray   # float32 [queries, k]: their weights; 0 where keys is -1
    outside: np.ndarray   # float32 [queries]: softmax: the weight of the keys not listed


@dataclass(frozen=True)
class LayerAttention:
    layer: int
    keys_per_query: int
    heads: Tuple[HeadAttention, ...]


@dataclass(frozen=True)
class Inspection:
    """What one image's attention keeps (docs/attention.md): per layer and head, per query."""
    model: str
    model_version: str
    attention: str
    implementation: str
    tokens: int
    queries: np.ndarray        # int64: the queries listed, in the order of every head's rows
    token_rows: np.ndarray     # int32 [tokens]: a token's row on the grid (-1: CLS or start)
    token_columns: np.ndarray  # int32 [tokens]
    grid: Tuple[int, int]      # (height, width) in patches or pixels
    layers: Tuple[LayerAttention, ...]

    @classmethod
    def from_proto(cls, r: pb.InspectResponse, heads=None) -> "Inspection":
        def head(h: pb.HeadAttention) -> HeadAttention:
            k = max((len(q.keys) for q in h.queries), default=0)
            keys = np.full((len(h.queries), k), -1, dtype=np.int64)
            weights = np.zeros((len(h.queries), k), dtype=np.float32)
            for i, q in enumerate(h.queries):
                keys[i, :len(q.keys)] = q.keys
                weights[i, :len(q.weights)] = q.weights
            return HeadAttention(h.head, h.sigma, h.sink_share, h.mean_distance,
                                 h.effective_neighbours, h.busiest_key, h.busiest_key_share, keys,
                                 weights, np.array([q.outside for q in h.queries], dtype=np.float32))
        keep = None if heads is None else set(heads)
        return cls(r.model, r.model_version, pb.ModelInfo.Attention.Name(r.attention).lower(),
                   r.implementation, r.tokens, np.array(r.queries, dtype=np.int64),
                   np.array(r.token_rows, dtype=np.int32), np.array(r.token_columns, dtype=np.int32),
                   (r.grid_height, r.grid_width),
                   tuple(LayerAttention(l.layer, l.keys_per_query,
                                        tuple(head(h) for h in l.heads
                                              if keep is None or h.head in keep))
                         for l in r.layers))


@dataclass(frozen=True)
class RepositoryEntry:
    """A model version the repository holds, and its state (READY, UNAVAILABLE, ...)."""
    name: str
    version: str
    state: str
    reason: str
