import mathlib.Fraction;

/** Every public static void method whose name starts with "test" is a test (see TestRunner). */
public final class FractionTest {
    public static void testReducesToLowestTerms() {
        Check.equal("1/2", new Fraction(2, 4).toString());
        Check.equal("3", new Fraction(6, 2).toString());
    }

    public static void testAddsPositiveFractions() {
        Check.equal(new Fraction(5, 6), new Fraction(1, 2).add(new Fraction(1, 3)));
    }

    public static void testSubtractsBelowZero() {
        Check.equal("-1/6", new Fraction(1, 3).subtract(new Fraction(1, 2)).toString());
    }

    public static void testMultiplies() {
        Check.equal(new Fraction(1, 4), new Fraction(1, 2).multiply(new Fraction(1, 2)));
    }

    public static void testZeroDenominatorIsRejected() {
        Check.throwsException(ArithmeticException.class, () -> new Fraction(1, 0));
    }

    public static void testZeroIsWhole() {
        Check.equal("0", new Fraction(0, -5).toString());
    }

    public static void testNegativeDenominatorMovesSignToNumerator() {
        Fraction f = new Fraction(1, -2);
        Check.equal(-1L, f.numerator());
        Check.equal(2L, f.denominator());
        Check.equal("-1/2", f.toString());
    }

    public static void testEqualsIgnoresWhereTheSignWasWritten() {
        Check.equal(new Fraction(-1, 2), new Fraction(1, -2));
        Check.equal(new Fraction(3, 4), new Fraction(-3, -4));
    }

    public static void testComparesWithNegativeDenominators() {
        Check.isTrue(new Fraction(1, -2).compareTo(new Fraction(1, 3)) < 0, "1/-2 < 1/3");
        Check.isTrue(new Fraction(-1, -3).compareTo(new Fraction(1, 4)) > 0, "-1/-3 > 1/4");
    }

    public static void testDividesByNegative() {
        Check.equal("-3/2", new Fraction(1, 2).divide(new Fraction(-1, 3)).toString());
    }
}
