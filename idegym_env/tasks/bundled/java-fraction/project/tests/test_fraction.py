import unittest

from idegym_judge import subject

# The code under test runs in a JVM of its own (the judge); build/ holds its compiled classes.
java = subject.java(classpath="build")
Fraction = java.cls("mathlib.Fraction")
ArithmeticException = java.exception("java.lang.ArithmeticException")


class FractionTest(unittest.TestCase):
    def test_reduces_to_lowest_terms(self):
        self.assertEqual(Fraction(2, 4).toString(), "1/2")
        self.assertEqual(Fraction(6, 2).toString(), "3")

    def test_adds_positive_fractions(self):
        self.assertEqual(Fraction(1, 2).add(Fraction(1, 3)).toString(), "5/6")

    def test_subtracts_below_zero(self):
        self.assertEqual(Fraction(1, 3).subtract(Fraction(1, 2)).toString(), "-1/6")

    def test_multiplies(self):
        self.assertEqual(Fraction(1, 2).multiply(Fraction(1, 2)).toString(), "1/4")

    def test_zero_denominator_is_rejected(self):
        with self.assertRaises(ArithmeticException):
            Fraction(1, 0)

    def test_zero_is_whole(self):
        self.assertEqual(Fraction(0, -5).toString(), "0")

    def test_negative_denominator_moves_sign_to_numerator(self):
        f = Fraction(1, -2)
        self.assertEqual(f.numerator(), -1)
        self.assertEqual(f.denominator(), 2)
        self.assertEqual(f.toString(), "-1/2")

    def test_equals_ignores_where_the_sign_was_written(self):
        self.assertTrue(Fraction(-1, 2).equals(Fraction(1, -2)))
        self.assertTrue(Fraction(3, 4).equals(Fraction(-3, -4)))
        self.assertEqual(Fraction(-1, 2).hashCode(), Fraction(1, -2).hashCode())

    def test_compares_with_negative_denominators(self):
        self.assertLess(Fraction(1, -2).compareTo(Fraction(1, 3)), 0, "1/-2 < 1/3")
        self.assertGreater(Fraction(-1, -3).compareTo(Fraction(1, 4)), 0, "-1/-3 > 1/4")

    def test_divides_by_negative(self):
        self.assertEqual(Fraction(1, 2).divide(Fraction(-1, 3)).toString(), "-3/2")
