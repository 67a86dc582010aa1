"""Wrappers that adapt an IdeGym env to learners that cannot handle text or tool calls.

* :class:`TokenizeObservation` — text observations → fixed-length ``Box`` of token ids;
* :class:`DiscreteActions` — ``Discrete(n)`` over a task's candidate tool calls (+ ``submit``).

Together they make an IdeGym task trainable with RLlib's or SB3's default models::

    env = TokenizeObservation(DiscreteActions(gym.make("IdeGym-v0", task="python-roman-numerals")), length=128)
"""

from .discrete import DiscreteActions
from .tokens import ByteTokenizer, HashedWordTokenizer, TokenizeObservation

__all__ = ["DiscreteActions", "TokenizeObservation", "ByteTokenizer", "HashedWordTokenizer"]
