package mathlib;

/** An exact rational number, always kept in lowest terms. Immutable. */
public final class Fraction implements Comparable<Fraction> {
    private final long numerator;
    private final long denominator;

    /**
     * Creates numerator/denominator in lowest terms. The sign is carried by the numerator, so the
     * denominator of every Fraction is positive: new Fraction(1, -2) is -1/2.
     *
     * @throws ArithmeticException if denominator is 0
     */
    public Fraction(long numerator, long denominator) {
        if (denominator == 0) {
            throw new ArithmeticException("denominator is zero");
        }
        long divisor = gcd(Math.abs(numerator), Math.abs(denominator));
        this.numerator = numerator / divisor;
        this.denominator = denominator / divisor;
    }

    public static Fraction of(long whole) {
        return new Fraction(whole, 1);
    }

    private static long gcd(long a, long b) {
        while (b != 0) {
            long t = a % b;
            a = b;
            b = t;
        }
        return a;
    }

    public long numerator() {
        return numerator;
    }

    public long denominator() {
        return denominator;
    }

    public Fraction add(Fraction other) {
        return new Fraction(numerator * other.denominator + other.numerator * denominator,
                denominator * other.denominator);
    }

    public Fraction subtract(Fraction other) {
        return add(new Fraction(-other.numerator, other.denominator));
    }

    public Fraction multiply(Fraction other) {
        return new Fraction(numerator * other.numerator, denominator * other.denominator);
    }

    public Fraction divide(Fraction other) {
        if (other.numerator == 0) {
            throw new ArithmeticException("division by zero");
        }
        return new Fraction(numerator * other.denominator, denominator * other.numerator);
    }

    public double toDouble() {
        return (double) numerator / denominator;
    }

    @Override
    public int compareTo(Fraction other) {
        // Cross-multiplying preserves the order because both denominators are positive.
        return Long.compare(numerator * other.denominator, other.numerator * denominator);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Fraction f && numerator == f.numerator && denominator == f.denominator;
    }

    @Override
    public int hashCode() {
        return Long.hashCode(numerator) * 31 + Long.hashCode(denominator);
    }

    /** "3/4", "-1/2", or just "2" for whole numbers. */
    @Override
    public String toString() {
        return denominator == 1 ? Long.toString(numerator) : numerator + "/" + denominator;
    }
}
