// The subject side of the judge for Java: classes of the code under test, driven by reflection.
// Run as `java -cp <judge>/subjects/java:<classes> JudgeSubject` by the grader (as the tool user);
// requests on stdin, answers on the descriptor named by IDEGYM_ANSWER_FD, one JSON document a
// line (see ../../protocol.py). Values: JSON's own; other objects stay here as refs.
// Compiled on first use into a private directory (see subject.py); no dependency.

import java.io.*;
import java.lang.reflect.*;
import java.nio.charset.StandardCharsets;
import java.util.*;

public final class JudgeSubject {
    private static final Map<Long, Object> objects = new HashMap<>();
    private static long nextId = 1;
    private static final String TAG = "$t";

    public static void main(String[] args) throws Exception {
        String fd = System.getenv().getOrDefault("IDEGYM_ANSWER_FD", "3");
        PrintStream answers = new PrintStream(new FileOutputStream("/proc/self/fd/" + fd), true, "UTF-8");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            Map<String, Object> doc = new LinkedHashMap<>();
            try {
                Map<?, ?> req = (Map<?, ?>) new Json(line).value();
                Object result = handle(req);
                doc.put("ok", "import".equals(req.get("op")) ? ref(result) : encode(result, 0));
            } catch (InvocationTargetException e) {
                doc.put("err", exception(e.getCause()));
            } catch (Throwable e) {
                doc.put("err", exception(e));
            }
            answers.println(Json.write(doc));
        }
    }

    private static Object handle(Map<?, ?> req) throws Throwable {
        String op = String.valueOf(req.get("op"));
        if (op.equals("import")) return new ClassRef(Class.forName(String.valueOf(req.get("name"))));
        if (op.equals("release")) return null;
        Object target = decode(req.get("ref"));
        List<Object> args = new ArrayList<>();
        Object raw = req.get("args");
        if (raw instanceof List) for (Object a : (List<?>) raw) args.add(decode(a));
        String name = req.get("name") == null ? null : String.valueOf(req.get("name"));
        switch (op) {
            case "call":
                if (target instanceof ClassRef) return construct(((ClassRef) target).cls, args);
                if (target instanceof BoundMethod) return invoke(null, target, null, args);
                throw new IllegalArgumentException("only a class (to construct it) or a method can be called");
            case "callmethod":
                if (target instanceof ClassRef) return invoke(((ClassRef) target).cls, null, name, args);
                return invoke(target.getClass(), target, name, args);
            case "getattr":
                Class<?> cls = target instanceof ClassRef ? ((ClassRef) target).cls : target.getClass();
                Object self = target instanceof ClassRef ? null : target;
                try {
                    return cls.getField(name).get(self);
                } catch (NoSuchFieldException e) {
                    return new BoundMethod(cls, self, name);
                }
            default:
                throw new IllegalArgumentException("unknown request op " + op);
        }
    }

    private static Object construct(Class<?> cls, List<Object> args) throws Throwable {
        for (Constructor<?> c : cls.getConstructors()) {
            Object[] converted = convert(c.getParameterTypes(), args);
            if (converted != null) return c.newInstance(converted);
        }
        throw new NoSuchMethodException("no public constructor of " + cls.getName() + " takes " + describe(args));
    }

    private static Object invoke(Class<?> cls, Object self, String name, List<Object> args) throws Throwable {
        if (self instanceof BoundMethod) {
            BoundMethod m = (BoundMethod) self;
            return invoke(m.cls, m.self, m.name, args);
        }
        for (Method m : cls.getMethods()) {
            if (!m.getName().equals(name) || (self == null) != Modifier.isStatic(m.getModifiers())) continue;
            Object[] converted = convert(m.getParameterTypes(), args);
            if (converted != null) return m.invoke(self, converted);
        }
        throw new NoSuchMethodException("no public " + (self == null ? "static " : "") + "method " + cls.getName()
                + "." + name + " takes " + describe(args));
    }

    private static String describe(List<Object> args) {
        StringBuilder sb = new StringBuilder("(");
        for (Object a : args) sb.append(sb.length() > 1 ? ", " : "").append(a == null ? "null" : a.getClass().getSimpleName());
        return sb.append(")").toString();
    }

    private static Object[] convert(Class<?>[] types, List<Object> args) {
        if (types.length != args.size()) return null;
        Object[] out = new Object[types.length];
        for (int i = 0; i < types.length; i++) {
            Object v = convertOne(types[i], args.get(i));
            if (v == NO) return null;
            out[i] = v;
        }
        return out;
    }

    private static final Object NO = new Object();

    private static Object convertOne(Class<?> t, Object v) {
        if (v == null) return t.isPrimitive() ? NO : null;
        if (v instanceof Long) {
            long n = (Long) v;
            if (t == long.class || t == Long.class) return n;
            if ((t == int.class || t == Integer.class) && n == (int) n) return (int) n;
            if ((t == short.class || t == Short.class) && n == (short) n) return (short) n;
            if ((t == byte.class || t == Byte.class) && n == (byte) n) return (byte) n;
            if (t == double.class || t == Double.class) return (double) n;
            if (t == float.class || t == Float.class) return (float) n;
        }
        if (v instanceof Double && (t == double.class || t == Double.class)) return v;
        if (v instanceof Double && (t == float.class || t == Float.class)) return ((Double) v).floatValue();
        if (v instanceof Boolean && (t == boolean.class || t == Boolean.class)) return v;
        if (v instanceof String && (t == char.class || t == Character.class) && ((String) v).length() == 1) return ((String) v).charAt(0);
        if (v instanceof List && t.isArray()) {
            List<?> list = (List<?>) v;
            Object array = Array.newInstance(t.getComponentType(), list.size());
            for (int i = 0; i < list.size(); i++) {
                Object e = convertOne(t.getComponentType(), list.get(i));
                if (e == NO) return NO;
                Array.set(array, i, e);
            }
            return array;
        }
        if (!t.isPrimitive() && t.isInstance(v)) return v;
        return NO;
    }

    private static Object decode(Object doc) {
        if (doc instanceof Map) {
            Map<?, ?> m = (Map<?, ?>) doc;
            Object tag = m.get(TAG);
            if ("ref".equals(tag)) {
                Object id = m.get("id");
                if (!(id instanceof Long) || !objects.containsKey(id)) throw new IllegalArgumentException("unknown object reference " + id);
                return objects.get(id);
            }
            if ("tuple".equals(tag)) return decode(m.get("v"));
            if ("dict".equals(tag)) {
                Map<Object, Object> out = new LinkedHashMap<>();
                for (Object pair : (List<?>) m.get("v")) out.put(decode(((List<?>) pair).get(0)), decode(((List<?>) pair).get(1)));
                return out;
            }
            throw new IllegalArgumentException("unsupported value tag " + tag);
        }
        if (doc instanceof List) {
            List<Object> out = new ArrayList<>();
            for (Object e : (List<?>) doc) out.add(decode(e));
            return out;
        }
        return doc;
    }

    private static Object encode(Object v, int depth) {
        if (depth > 64) throw new IllegalArgumentException("value nested too deeply");
        if (v == null || v instanceof Boolean || v instanceof String) return v;
        if (v instanceof Character) return String.valueOf(v);
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) return ((Number) v).longValue();
        if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put(TAG, "float");
                m.put("v", Double.isNaN(d) ? "nan" : (d > 0 ? "inf" : "-inf"));
                return m;
            }
            return d;
        }
        if (v instanceof List || v.getClass().isArray()) {
            List<Object> out = new ArrayList<>();
            if (v instanceof List) for (Object e : (List<?>) v) out.add(encode(e, depth + 1));
            else for (int i = 0; i < Array.getLength(v); i++) out.add(encode(Array.get(v, i), depth + 1));
            return out;
        }
        return ref(v);
    }

    private static Map<String, Object> ref(Object v) {
        long id = nextId++;
        objects.put(id, v);
        Map<String, Object> m = new LinkedHashMap<>();
        m.put(TAG, "ref");
        m.put("id", id);
        Class<?> cls = v instanceof ClassRef ? ((ClassRef) v).cls : v.getClass();
        m.put("type", cls.getName());
        m.put("callable", v instanceof ClassRef || v instanceof BoundMethod);
        String repr;
        try { repr = String.valueOf(v); } catch (Throwable e) { repr = "<" + cls.getName() + ">"; }
        m.put("repr", repr.length() > 200 ? repr.substring(0, 200) : repr);
        return m;
    }

    private static Map<String, Object> exception(Throwable e) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put(TAG, "exc");
        List<Object> chain = new ArrayList<>();
        for (Class<?> c = e.getClass(); c != null && c != Object.class; c = c.getSuperclass()) chain.add(c.getName());
        m.put("type", e.getClass().getName());
        m.put("chain", chain);
        m.put("builtin", null);
        String message = String.valueOf(e.getMessage());
        m.put("message", message.length() > 4000 ? message.substring(0, 4000) : message);
        StringWriter sw = new StringWriter();
        e.printStackTrace(new PrintWriter(sw));
        String tb = sw.toString();
        m.put("traceback", tb.length() > 4000 ? tb.substring(tb.length() - 4000) : tb);
        return m;
    }

    /** A class as a value: called to construct, its static methods called on it. */
    private static final class ClassRef {
        final Class<?> cls;
        ClassRef(Class<?> cls) { this.cls = cls; }
        public String toString() { return cls.getName(); }
    }

    /** `obj.name` without a field of that name: a method, called next. */
    private static final class BoundMethod {
        final Class<?> cls; final Object self; final String name;
        BoundMethod(Class<?> cls, Object self, String name) { this.cls = cls; this.self = self; this.name = name; }
        public String toString() { return cls.getName() + "." + name; }
    }

    /** A small JSON reader and writer (numbers: Long when integral, else Double). */
    static final class Json {
        private final String s;
        private int i;
        Json(String s) { this.s = s; }

        Object value() {
            Object v = read(0);
            skip();
            if (i != s.length()) throw new IllegalArgumentException("trailing characters in JSON at " + i);
            return v;
        }

        private void skip() { while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++; }

        private Object read(int depth) {
            if (depth > 64) throw new IllegalArgumentException("JSON nested too deeply");
            skip();
            if (i >= s.length()) throw new IllegalArgumentException("unexpected end of JSON");
            char c = s.charAt(i);
            if (c == '{') {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                skip();
                if (s.charAt(i) == '}') { i++; return m; }
                while (true) {
                    skip();
                    String k = string();
                    skip();
                    expect(':');
                    m.put(k, read(depth + 1));
                    skip();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect('}');
                    return m;
                }
            }
            if (c == '[') {
                i++;
                List<Object> l = new ArrayList<>();
                skip();
                if (s.charAt(i) == ']') { i++; return l; }
                while (true) {
                    l.add(read(depth + 1));
                    skip();
                    if (s.charAt(i) == ',') { i++; continue; }
                    expect(']');
                    return l;
                }
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return Boolean.TRUE; }
            if (s.startsWith("false", i)) { i += 5; return Boolean.FALSE; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            String num = s.substring(start, i);
            if (num.isEmpty()) throw new IllegalArgumentException("unexpected character in JSON at " + start);
            if (num.contains(".") || num.contains("e") || num.contains("E")) return Double.parseDouble(num);
            return Long.parseLong(num);
        }

        private void expect(char c) {
            if (i >= s.length() || s.charAt(i) != c) throw new IllegalArgumentException("expected '" + c + "' in JSON at " + i);
            i++;
        }

        private String string() {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return sb.toString();
                if (c != '\\') { sb.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': sb.append('\n'); break;
                    case 't': sb.append('\t'); break;
                    case 'r': sb.append('\r'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'u': sb.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: sb.append(e);
                }
            }
        }

        static String write(Object v) {
            StringBuilder sb = new StringBuilder();
            write(sb, v);
            return sb.toString();
        }

        private static void write(StringBuilder sb, Object v) {
            if (v == null) sb.append("null");
            else if (v instanceof Boolean || v instanceof Long) sb.append(v);
            else if (v instanceof Double) sb.append(v);
            else if (v instanceof String) {
                sb.append('"');
                for (char c : ((String) v).toCharArray()) {
                    if (c == '"' || c == '\\') sb.append('\\').append(c);
                    else if (c < 0x20 || c > 0x7e) sb.append(String.format("\\u%04x", (int) c));
                    else sb.append(c);
                }
                sb.append('"');
            } else if (v instanceof Map) {
                sb.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) sb.append(',');
                    first = false;
                    write(sb, String.valueOf(e.getKey()));
                    sb.append(':');
                    write(sb, e.getValue());
                }
                sb.append('}');
            } else if (v instanceof List) {
                sb.append('[');
                boolean first = true;
                for (Object e : (List<?>) v) {
                    if (!first) sb.append(',');
                    first = false;
                    write(sb, e);
                }
                sb.append(']');
            } else throw new IllegalArgumentException("cannot write " + v.getClass());
        }
    }
}
