"""A least-recently-used cache with a fixed capacity."""

from collections import OrderedDict


class LRUCache:
    """Maps keys to values and holds at most ``capacity`` entries.

    When a new key would exceed the capacity, the least recently *used* entry is evicted:
    both ``get`` and ``put`` count as a use. ``in`` and ``len`` do not.
    """

    def __init__(self, capacity):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._entries = OrderedDict()  # oldest use first

    def get(self, key, default=None):
        """Return the value of ``key`` (or ``default``), marking ``key`` as used."""
        if key not in self._entries:
            return default
        return self._entries[key]

    def put(self, key, value):
        """Store ``value`` under ``key``, evicting the least recently used entry when full."""
        if key in self._entries:
            self._entries.move_to_end(key)
        self._entries[key] = value
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __contains__(self, key):
        return key in self._entries

    def __len__(self):
        return len(self._entries)

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._entries)
