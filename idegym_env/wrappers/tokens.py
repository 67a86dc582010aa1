"""``TokenizeObservation``: text observations as a fixed-length ``Box`` of token ids.

RLlib's default models (and SB3's) cannot encode text: their catalogs have encoders for ``Box``
and ``Discrete`` observations only. This wrapper turns each observation string into exactly
``length`` token ids with a simple, deterministic tokenizer that needs no download:

* ``"bytes"`` (default): the UTF-8 bytes, id = byte + 1 (vocabulary 257);
* ``"words"``: words and punctuation marks (``\\w+|[^\\w\\s]``), id = 1 + crc32(word) mod
  (``vocab_size`` - 1) — the hashing trick, so unseen words still get an id;
* any object with ``encode(text) -> list[int]`` and ``vocab_size``.

Id 0 is padding. A text longer than ``length`` tokens keeps its head and its tail (``keep="both"``,
the default: an instruction starts with the problem and a command's output ends with its
verdict), only the head (``"head"``) or only the tail (``"tail"``). Ids fit ``[0, vocab_size)``.

    env = TokenizeObservation(gym.make("IdeGym-v0"), length=256)
    env.observation_space   # Box(0.0, 256.0, (256,), float32)

The ids are ``float32`` by default (exact up to 2**24): RLlib's default encoder for a 1-D ``Box``
is an MLP whose float weights cannot multiply an integer tensor. Pass ``dtype=np.int64`` for a
model that embeds ids itself.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

PAD = 0
_WORD = re.compile(r"\w+|[^\w\s]")


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes; id = byte + 1, so 0 stays free for padding."""

    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8", errors="replace")]

    def decode(self, ids: Any) -> str:
        return bytes(int(i) - 1 for i in ids if 0 < int(i) < 257).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HashedWordTokenizer:
    """Words and punctuation marks hashed (crc32, stable across processes) into ``vocab_size - 1`` ids."""

    def __init__(self, vocab_size: int = 4096, *, lowercase: bool = False) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (0 is padding), got {vocab_size}")
        self.vocab_size = vocab_size
        self.lowercase = lowercase

    def encode(self, text: str) -> list[int]:
        if self.lowercase:
            text = text.lower()
        buckets = self.vocab_size - 1
        return [1 + zlib.crc32(w.encode("utf-8", errors="replace")) % buckets for w in _WORD.findall(text)]

    def __repr__(self) -> str:
        return f"HashedWordTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"


def make_tokenizer(tokenizer: str | Tokenizer = "bytes", vocab_size: int | None = None) -> Tokenizer:
    if tokenizer == "bytes":
        if vocab_size not in (None, ByteTokenizer.vocab_size):
            raise ValueError("the byte tokenizer has a fixed vocabulary of 257 ids")
        return ByteTokenizer()
    if tokenizer == "words":
        return HashedWordTokenizer(vocab_size or 4096)
    if isinstance(tokenizer, str):
        raise ValueError(f"unknown tokenizer {tokenizer!r}: use 'bytes', 'words' or an object with encode()")
    if not callable(getattr(tokenizer, "encode", None)) or not isinstance(getattr(tokenizer, "vocab_size", None), int):
        raise TypeError("a tokenizer needs encode(text) -> list[int] and an int vocab_size")
    return tokenizer


class TokenizeObservation(gym.ObservationWrapper):
    """Text observation → ``Box(0, vocab_size - 1, (length,), dtype)`` of token ids (see the module doc)."""

    def __init__(self, env: gym.Env, length: int = 256, tokenizer: str | Tokenizer = "bytes", *,
                 vocab_size: int | None = None, keep: str = "both", dtype: Any = np.float32) -> None:
        super().__init__(env)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an int >= 1, got {length!r}")
        if keep not in ("both", "head", "tail"):
            raise ValueError(f"keep must be 'both', 'head' or 'tail', got {keep!r}")
        self.length = length
        self.keep = keep
        self.tokenizer = make_tokenizer(tokenizer, vocab_size)
        self.dtype = np.dtype(dtype)
        if not (np.issubdtype(self.dtype, np.integer) or np.issubdtype(self.dtype, np.floating)):
            raise ValueError(f"dtype must be an integer or float type, got {self.dtype}")
        self.observation_space = gym.spaces.Box(low=0, high=self.tokenizer.vocab_size - 1, shape=(length,),
                                                dtype=self.dtype)

    def tokenize(self, text: str) -> np.ndarray:
        ids = self.tokenizer.encode(str(text))
        n = self.length
        if len(ids) > n:
            if self.keep == "head":
                ids = ids[:n]
            elif self.keep == "tail":
                ids = ids[-n:]
            else:
                head = (n + 1) // 2
                ids = ids[:head] + (ids[len(ids) - (n - head):] if n - head else [])
        out = np.full(n, PAD, dtype=self.dtype)
        out[: len(ids)] = ids
        return out

    def observation(self, observation: Any) -> np.ndarray:
        return self.tokenize(observation)


__all__ = ["TokenizeObservation", "ByteTokenizer", "HashedWordTokenizer", "Tokenizer", "make_tokenizer", "PAD"]
