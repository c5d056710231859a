"""krause-serve's Python client: classify, generate, score and inspect over gRPC (krause.v1),
from numpy arrays, PIL images, paths or PNG bytes.

    from krause_serve import Client
    with Client("localhost:50051") as c:
        print(c.classify("shoe.png").labels)
        for image in c.generate_images(label="Sneaker", n=4, seed=7):
            image.pil().save(f"sneaker-{image.image}.png")

Client is synchronous and thread-safe; AsyncClient has the same methods on asyncio. Every
failed call raises KrauseError (its code, the server's message, reason, retry delay, field).
"""
from krause_serve._errors import KrauseError
from krause_serve._generate import Event
from krause_serve._types import (ClassifyResult, Classification, ClassScore, GeneratedImage,
                                 HeadAttention, Inspection, KernelCheck, LayerAttention,
                                 ModelInfo, Progress, RepositoryEntry, Rows, ScoreResult, Start,
                                 Summary)
from krause_serve.aio import AsyncClient
from krause_serve.client import Client

__all__ = ["AsyncClient", "ClassifyResult", "Classification", "ClassScore", "Client", "Event",
           "GeneratedImage", "HeadAttention", "Inspection", "KernelCheck", "KrauseError",
           "LayerAttention", "ModelInfo", "Progress", "RepositoryEntry", "Rows", "ScoreResult",
           "Start", "Summary"]
__version__ = "0.1.0"
