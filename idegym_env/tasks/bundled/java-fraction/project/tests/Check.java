import java.util.Objects;

/** Assertions for the tests; a failed one throws AssertionError with a readable message. */
final class Check {
    private Check() {}

    static void equal(Object expected, Object actual) {
        if (!Objects.equals(expected, actual)) {
            throw new AssertionError("expected <" + expected + "> but was <" + actual + ">");
        }
    }

    static void isTrue(boolean condition, String what) {
        if (!condition) {
            throw new AssertionError("expected true: " + what);
        }
    }

    static void throwsException(Class<? extends Throwable> type, Runnable code) {
        try {
            code.run();
        } catch (Throwable t) {
            if (type.isInstance(t)) {
                return;
            }
            throw new AssertionError("expected " + type.getSimpleName() + " but got " + t);
        }
        throw new AssertionError("expected " + type.getSimpleName() + " but nothing was thrown");
    }
}
