import unittest

from idegym_judge import subject

# The code under test runs in a process of its own (the judge): this is a proxy to it.
LRUCache = subject.module("lru").LRUCache


# `key in cache` and `len(cache)`, asked of the cache by name: the judge answers no operator on
# an object of the code under test (its answer would decide the assertion); a method's answer
# is plain data, checked here.
def contains(cache, key):
    return cache.call_method("__contains__", key)


def length(cache):
    return cache.call_method("__len__")


class LRUCacheTest(unittest.TestCase):
    def test_put_and_get(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.get("a"), 1)
        self.assertEqual(cache.get("b"), 2)

    def test_missing_key_returns_default(self):
        cache = LRUCache(1)
        self.assertIsNone(cache.get("nope"))
        self.assertEqual(cache.get("nope", 42), 42)

    def test_evicts_oldest_when_full(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("c", 3)
        self.assertIs(contains(cache, "a"), False)
        self.assertEqual(length(cache), 2)

    def test_put_existing_key_counts_as_use(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        cache.put("c", 3)
        self.assertEqual(cache.get("a"), 10)
        self.assertIs(contains(cache, "b"), False)

    def test_get_counts_as_use(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("a")
        cache.put("c", 3)
        self.assertIs(contains(cache, "a"), True)
        self.assertIs(contains(cache, "b"), False)

    def test_usage_order(self):
        cache = LRUCache(3)
        for key in "abc":
            cache.put(key, key.upper())
        cache.get("a")
        cache.get("b")
        self.assertEqual(cache.keys(), ["c", "a", "b"])

    def test_get_of_missing_key_changes_nothing(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("zzz")
        self.assertEqual(cache.keys(), ["a", "b"])

    def test_contains_is_not_a_use(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertIs(contains(cache, "a"), True)
        cache.put("c", 3)
        self.assertIs(contains(cache, "a"), False)

    def test_rejects_bad_capacity(self):
        for bad in (0, -3, 1.5, None):
            with self.assertRaises(ValueError):
                LRUCache(bad)

