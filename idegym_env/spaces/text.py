"""``UnicodeText``: a space whose members are arbitrary Python strings.

Gymnasium's own :class:`gymnasium.spaces.Text` rejects the empty string by default and every
character outside a fixed charset (alphanumerics unless told otherwise, and no charset can cover
all of Unicode). Real sandbox output is UTF-8 with ANSI escapes, NUL bytes and emoji, and an
empty stdout is common, so an observation space built on ``Text`` is violated all the time. This
space checks only what is meaningful for text: the type and the length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector.utils import create_empty_array, create_shared_memory

# Sampling draws from this alphabet; membership does not depend on it. It mixes printable
# ASCII with whitespace and multi-byte characters so that consumers of samples see real text.
DEFAULT_SAMPLE_CHARSET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " .,;:!?-_/()[]{}<>'\"=+*&%$#@\n\t"
    "éüßñøλΩжд中文字😀✓→"
)
DEFAULT_SAMPLE_MAX_LENGTH = 64


class UnicodeText(Space[str]):
    """Every ``str`` with ``min_length <= len(s) <= max_length`` (``max_length=None``: no bound).

    Lengths are counted in Unicode code points, like ``len``. Any character is allowed,
    including the empty string (with the default ``min_length=0``), control characters, ``\\x00``
    and characters outside the BMP. ``np.str_`` values are strings and therefore members.

    ``sample()`` draws a length uniformly from ``[min_length, min(max_length, sample_max_length)]``
    and characters uniformly from ``sample_charset``, using the space's seeded ``np_random``.
    ``sample(mask=n)`` fixes the length to ``n``. Two spaces are equal when they have the same
    members, so the sampling parameters take no part in ``==``.

    The space is not flattenable to a ``Box`` (``is_np_flattenable`` is False): tokenize text
    with a wrapper instead. Use :meth:`fit` to turn any string into a member.
    """

    def __init__(
        self,
        max_length: int | None = None,
        *,
        min_length: int = 0,
        sample_charset: str = DEFAULT_SAMPLE_CHARSET,
        sample_max_length: int = DEFAULT_SAMPLE_MAX_LENGTH,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 0:
            raise ValueError(f"min_length must be an int >= 0, got {min_length!r}")
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < min_length
        ):
            raise ValueError(
                f"max_length must be None or an int >= min_length ({min_length}), got {max_length!r}")
        if not isinstance(sample_charset, str) or not sample_charset:
            raise ValueError("sample_charset must be a non-empty str (it only affects sample())")
        if sample_max_length < 0:
            raise ValueError(f"sample_max_length must be >= 0, got {sample_max_length!r}")
        self.min_length = min_length
        self.max_length = max_length
        self.sample_charset = sample_charset
        self.sample_max_length = sample_max_length
        # Sorted and deduplicated so that sampling depends on the set of characters, not its order.
        self._sample_chars = np.array(sorted(set(sample_charset)), dtype=object)
        super().__init__(shape=None, dtype=None, seed=seed)

    # -- membership --------------------------------------------------------------------------------

    def contains(self, x: Any) -> bool:
        """True iff ``x`` is a ``str`` whose length is within the bounds."""
        if not isinstance(x, str):
            return False
        n = len(x)
        return n >= self.min_length and (self.max_length is None or n <= self.max_length)

    def fit(self, text: str, marker: str = "\n…[{n} characters cut]…\n",
            cut_before: Sequence[tuple[int, int, int]] = ()) -> str:
        """Return a member of the space made from ``text``.

        Too long: the middle is cut and replaced by ``marker`` (``{n}`` = characters removed),
        keeping the head and the tail, where a command's output usually says what went wrong.
        If even the marker does not fit, the text is cut at ``max_length``. Too short: padded
        with spaces. Non-``str`` input raises ``TypeError``.

        ``cut_before`` lists ``(start, end, count)``: ``text[start:end]`` is the marker of an
        earlier cut that dropped ``count`` characters (the sandbox server's, which counts bytes).
        Such a marker is kept or cut whole, and ``{n}`` counts what it stood for, not its length.
        """
        if not isinstance(text, str):
            raise TypeError(f"UnicodeText.fit expects a str, got {type(text).__name__}")
        if len(text) < self.min_length:
            return text + " " * (self.min_length - len(text))
        limit = self.max_length
        if limit is None or len(text) <= limit:
            return text
        if cut_before:
            return _cut_around(text, limit, marker, sorted(cut_before))
        # The marker's length depends on n, the number of characters it replaces; keep shrinks
        # monotonically, so this settles within a few rounds.
        keep, note = limit, ""
        for _ in range(8):
            note = marker.format(n=len(text) - keep)
            if limit - len(note) == keep:
                break
            keep = limit - len(note)
        if keep <= 0 or keep + len(note) != limit:
            return text[:limit]
        head = (keep + 1) // 2
        tail = keep - head
        return text[:head] + note + (text[len(text) - tail :] if tail else "")

    # -- sampling ----------------------------------------------------------------------------------

    def sample(self, mask: Any | None = None, probability: Any | None = None) -> str:
        """A random member. ``mask`` may be an ``int`` length; ``probability`` is not supported."""
        if probability is not None:
            raise ValueError("UnicodeText.sample does not support a probability mask")
        if mask is None:
            upper = self.sample_max_length
            if self.max_length is not None:
                upper = min(upper, self.max_length)
            upper = max(upper, self.min_length)
            length = int(self.np_random.integers(self.min_length, upper + 1))
        else:
            if isinstance(mask, bool) or not isinstance(mask, (int, np.integer)):
                raise ValueError(f"UnicodeText.sample mask must be an int length, got {mask!r}")
            length = int(mask)
            if not self.contains("x" * length):
                raise ValueError(f"mask length {length} is outside [{self.min_length}, {self.max_length}]")
        if length == 0:
            return ""
        picks = self.np_random.integers(0, len(self._sample_chars), size=length)
        return "".join(self._sample_chars[picks])

    @property
    def is_np_flattenable(self) -> bool:
        return False

    # -- serialization, comparison ----------------------------------------------------------------

    def to_jsonable(self, sample_n: Iterable[str]) -> list[Any]:
        """Strings are JSON already: a list of the same strings."""
        return [str(s) for s in sample_n]

    def from_jsonable(self, sample_n: Sequence[Any]) -> list[str]:
        """Inverse of :meth:`to_jsonable`; raises ``ValueError`` for a non-member."""
        out = []
        for item in sample_n:
            if not self.contains(item):
                raise ValueError(f"{item!r} is not a member of {self!r}")
            out.append(item)
        return out

    def __repr__(self) -> str:
        parts = [] if self.max_length is None else [f"max_length={self.max_length}"]
        if self.min_length:
            parts.append(f"min_length={self.min_length}")
        return f"UnicodeText({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))


# Vector envs build their observation buffer with ``create_empty_array``; gymnasium has no
# default for custom spaces (``batch_space``, ``concatenate`` and ``iterate`` work through Tuple).
@create_empty_array.register(UnicodeText)
def _create_empty_unicode_text(space: UnicodeText, n: int = 1, fn: Any = np.zeros) -> tuple[str, ...]:
    return tuple(" " * space.min_length for _ in range(n))


def _cut_around(text: str, limit: int, marker: str, earlier: list[tuple[int, int, int]]) -> str:
    """``fit`` when ``text`` holds earlier cuts' markers: the middle goes, each marker whole or not at all."""
    keep = limit - len(marker.format(n=len(text)))
    for _ in range(8):
        if keep <= 0:
            break
        start, end = (keep + 1) // 2, len(text) - (keep - (keep + 1) // 2)
        widened = True
        while widened:  # a marker the cut would split goes whole
            widened = False
            for s, e, _ in earlier:
                if s < end and e > start and (s < start or e > end):
                    start, end, widened = min(start, s), max(end, e), True
        inside = [(s, e, c) for s, e, c in earlier if start <= s and e <= end]
        n = end - start - sum(e - s for s, e, _ in inside) + sum(c for _, _, c in inside)
        note = marker.format(n=n)
        over = start + len(note) + len(text) - end - limit
        if over <= 0:
            return text[:start] + note + text[end:]
        keep -= over
    return text[:limit]


NO_SHARED_MEMORY = (
    "IdeGym's observations are text of any length (UnicodeText), which gymnasium's AsyncVectorEnv cannot keep in "
    "its fixed-size shared memory: use vectorization_mode='vector_entry_point' (RayVectorEnv: sub-envs step "
    "concurrently in Ray actors) or 'sync', or keep 'async' with shared_memory=False "
    "(gym.make_vec(..., vector_kwargs={'shared_memory': False}))")


# AsyncVectorEnv turns gymnasium's own error into a generic one; say why, and what to use instead.
@create_shared_memory.register(UnicodeText)
def _no_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None) -> Any:
    raise ValueError(NO_SHARED_MEMORY)


__all__ = ["UnicodeText", "DEFAULT_SAMPLE_CHARSET"]
