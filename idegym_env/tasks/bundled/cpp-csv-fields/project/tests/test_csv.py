import unittest

from idegym_judge import subject

# src/csv.cpp runs in the driver's process (tests/driver.cpp), not in this one: the judge.
csv = subject.process(["build/driver"])
InvalidArgument = subject.exception_class("std::invalid_argument")


def split_line(line):
    return csv.call("split_line", line)


class SplitLineTest(unittest.TestCase):
    def test_plain_fields(self):
        self.assertEqual(split_line("a,b,c"), ["a", "b", "c"])

    def test_empty_fields(self):
        self.assertEqual(split_line(",x,"), ["", "x", ""])

    def test_empty_line_is_one_empty_field(self):
        self.assertEqual(split_line(""), [""])

    def test_quoted_field_with_comma(self):
        self.assertEqual(split_line('"Smith, Jane",42'), ["Smith, Jane", "42"])

    def test_doubled_quote_inside_quotes(self):
        self.assertEqual(split_line('"say ""hi""",ok'), ['say "hi"', "ok"])

    def test_quoted_empty_field(self):
        self.assertEqual(split_line('"",b'), ["", "b"])

    def test_unterminated_quote_is_rejected(self):
        with self.assertRaises(InvalidArgument):
            split_line('"abc,def')

    def test_text_after_closing_quote_is_rejected(self):
        with self.assertRaises(InvalidArgument):
            split_line('"abc"def,x')

    def test_join_then_split_round_trips(self):
        fields = ["plain", "with, comma", 'with "quotes"', ""]
        self.assertEqual(split_line(csv.call("join_line", fields)), fields)
