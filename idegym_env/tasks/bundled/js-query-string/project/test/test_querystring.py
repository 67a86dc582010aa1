import unittest

from idegym_judge import subject

# The code under test runs in a Node.js process of its own (the judge): this is a proxy to it.
qs = subject.module("src/querystring.js", runtime="node")
parseQuery, stringifyQuery = qs.parseQuery, qs.stringifyQuery


class ParseQueryTest(unittest.TestCase):
    def test_parses_simple_pairs(self):
        self.assertEqual(parseQuery("a=1&b=two"), {"a": "1", "b": "two"})

    def test_ignores_a_leading_question_mark(self):
        self.assertEqual(parseQuery("?page=3"), {"page": "3"})

    def test_empty_query_gives_an_empty_object(self):
        self.assertEqual(parseQuery(""), {})
        self.assertEqual(parseQuery("?"), {})

    def test_repeated_keys_collect_into_an_array(self):
        self.assertEqual(parseQuery("tag=a&tag=b&tag=c"), {"tag": ["a", "b", "c"]})

    def test_a_key_without_equals_has_an_empty_value(self):
        self.assertEqual(parseQuery("debug&x=1"), {"debug": "", "x": "1"})

    def test_decodes_percent_escapes(self):
        self.assertEqual(parseQuery("name=Ren%C3%A9e&path=%2Fhome%2Fme"), {"name": "Renée", "path": "/home/me"})

    def test_plus_means_space(self):
        self.assertEqual(parseQuery("q=hello+world"), {"q": "hello world"})

    def test_plus_in_keys_means_space_too(self):
        self.assertEqual(parseQuery("first+name=Ada"), {"first name": "Ada"})

    def test_an_encoded_plus_stays_a_plus(self):
        self.assertEqual(parseQuery("expr=1%2B1+%3D+2"), {"expr": "1+1 = 2"})


class RoundTripTest(unittest.TestCase):
    def test_stringify_then_parse_is_the_identity(self):
        params = {"q": "red shoes + socks", "tag": ["a b", "c"], "empty": ""}
        self.assertEqual(stringifyQuery(params), "q=red+shoes+%2B+socks&tag=a+b&tag=c&empty=")
        self.assertEqual(parseQuery(stringifyQuery(params)), params)
