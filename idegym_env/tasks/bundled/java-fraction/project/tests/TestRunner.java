import java.io.IOException;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;

/**
 * Runs the public static void test* methods of the given classes and writes a JUnit XML report.
 * Usage: java TestRunner REPORT.xml TestClass...
 */
public final class TestRunner {
    private record Outcome(String suite, String name, double seconds, String failure) {}

    public static void main(String[] args) throws IOException {
        if (args.length < 2) {
            System.err.println("usage: java TestRunner REPORT.xml TestClass...");
            System.exit(2);
        }
        List<Outcome> outcomes = new ArrayList<>();
        for (String className : Arrays.copyOfRange(args, 1, args.length)) {
            Class<?> type;
            try {
                type = Class.forName(className);
            } catch (ClassNotFoundException e) {
                outcomes.add(new Outcome(className, "load", 0, "class not found: " + className));
                continue;
            }
            Method[] methods = type.getDeclaredMethods();
            Arrays.sort(methods, Comparator.comparing(Method::getName));
            for (Method m : methods) {
                int mods = m.getModifiers();
                if (!m.getName().startsWith("test") || !Modifier.isStatic(mods) || !Modifier.isPublic(mods)
                        || m.getParameterCount() != 0) {
                    continue;
                }
                long start = System.nanoTime();
                String failure = null;
                try {
                    m.invoke(null);
                } catch (InvocationTargetException e) {
                    StringWriter trace = new StringWriter();
                    e.getCause().printStackTrace(new PrintWriter(trace));
                    failure = trace.toString();
                } catch (ReflectiveOperationException e) {
                    failure = e.toString();
                }
                double seconds = (System.nanoTime() - start) / 1e9;
                outcomes.add(new Outcome(className, m.getName(), seconds, failure));
                System.out.println((failure == null ? "PASS " : "FAIL ") + className + "." + m.getName());
                if (failure != null) {
                    System.out.println(failure.lines().limit(3).reduce("", (a, b) -> a + "    " + b + "\n"));
                }
            }
        }
        long failed = outcomes.stream().filter(o -> o.failure() != null).count();
        System.out.println(outcomes.size() + " tests, " + (outcomes.size() - failed) + " passed, " + failed + " failed");
        Files.writeString(Path.of(args[0]), report(outcomes, failed), StandardCharsets.UTF_8);
        System.exit(failed == 0 && !outcomes.isEmpty() ? 0 : 1);
    }

    private static String report(List<Outcome> outcomes, long failed) {
        StringBuilder xml = new StringBuilder("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        xml.append("<testsuite name=\"java\" tests=\"").append(outcomes.size()).append("\" failures=\"")
                .append(failed).append("\" errors=\"0\" skipped=\"0\">\n");
        for (Outcome o : outcomes) {
            xml.append("  <testcase classname=\"").append(escape(o.suite())).append("\" name=\"")
                    .append(escape(o.name())).append("\" time=\"").append(String.format("%.4f", o.seconds())).append('"');
            if (o.failure() == null) {
                xml.append("/>\n");
            } else {
                String first = o.failure().lines().findFirst().orElse("failed");
                xml.append(">\n    <failure message=\"").append(escape(first)).append("\">")
                        .append(escape(o.failure())).append("</failure>\n  </testcase>\n");
            }
        }
        return xml.append("</testsuite>\n").toString();
    }

    private static String escape(String text) {
        StringBuilder out = new StringBuilder();
        for (char c : text.toCharArray()) {
            switch (c) {
                case '&' -> out.append("&amp;");
                case '<' -> out.append("&lt;");
                case '>' -> out.append("&gt;");
                case '"' -> out.append("&quot;");
                default -> {
                    if (c >= 0x20 || c == '\n' || c == '\t') {
                        out.append(c);
                    }
                }
            }
        }
        return out.toString();
    }
}
