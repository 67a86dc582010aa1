import unittest

from idegym_judge import subject

# The code under test runs in a process of its own (the judge): these are proxies to it.
roman = subject.module("roman")
to_roman, from_roman = roman.to_roman, roman.from_roman


class ToRomanTest(unittest.TestCase):
    def test_single_symbols(self):
        self.assertEqual([to_roman(n) for n in (1, 5, 10, 50, 100, 500, 1000)],
                         ["I", "V", "X", "L", "C", "D", "M"])

    def test_additive(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(8), "VIII")
        self.assertEqual(to_roman(2023), "MMXXIII")

    def test_subtractive_four_and_nine(self):
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")

    def test_subtractive_tens_and_hundreds(self):
        self.assertEqual(to_roman(40), "XL")
        self.assertEqual(to_roman(90), "XC")
        self.assertEqual(to_roman(400), "CD")
        self.assertEqual(to_roman(900), "CM")

    def test_mixed(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(3999), "MMMCMXCIX")

    def test_out_of_range(self):
        for bad in (0, -1, 4000, 2.5, "7"):
            with self.assertRaises(ValueError):
                to_roman(bad)


class FromRomanTest(unittest.TestCase):
    def test_parses_subtractive(self):
        self.assertEqual(from_roman("XIV"), 14)
        self.assertEqual(from_roman("MCMXCIV"), 1994)

    def test_round_trip(self):
        # Every 7th number and every power-of-ten boundary: each call is a round trip to the subject.
        numbers = sorted(set(range(1, 4000, 7)) | {n + d for n in (10, 100, 1000) for d in (-1, 0, 1)} | {3999})
        for n in numbers:
            self.assertEqual(from_roman(to_roman(n)), n, n)

