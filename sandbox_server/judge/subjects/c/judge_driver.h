/* The subject side of the judge for C and C++: what a task's driver program needs to speak the
 * protocol of ../../protocol.py. A driver links the code under test and answers requests
 *     {"op": "<name>", "args": [<JSON values>]}
 * read one a line from stdin, writing one answer a line to the descriptor named by
 * IDEGYM_ANSWER_FD: {"ok": <value>} or {"err": {"$t": "exc", "type": ..., "message": ...}}.
 *
 *     jd_request req;
 *     while (jd_next(&req)) {
 *         if (jd_op(&req, "push")) jd_ok_int(rb_push(rbs[jd_int(&req, 0)], jd_int(&req, 1)));
 *         else jd_unknown(&req);
 *     }
 *
 * Header-only (static inline functions), valid C11 and C++17. The driver is part of the task's pristine
 * tests; the code under test it links is not trusted with anything (see ../../subject.py). */
#ifndef IDEGYM_JUDGE_DRIVER_H
#define IDEGYM_JUDGE_DRIVER_H

#if !defined(_POSIX_C_SOURCE) && !defined(__cplusplus)
#define _POSIX_C_SOURCE 200809L /* getline, fdopen under -std=c11; include this header first */
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JD_MAX_DEPTH 32

typedef enum { JD_NULL, JD_BOOL, JD_NUMBER, JD_STRING, JD_ARRAY, JD_OBJECT } jd_kind;

typedef struct jd_value {
    jd_kind kind;
    double number;
    int boolean;
    char *string;          /* JD_STRING: UTF-8, NUL-terminated (length in `length`) */
    size_t length;         /* JD_STRING bytes, JD_ARRAY/JD_OBJECT items */
    struct jd_value *items; /* JD_ARRAY / JD_OBJECT values */
    char **keys;           /* JD_OBJECT keys */
} jd_value;

typedef struct {
    char *line;
    jd_value doc;
    const char *op;
    jd_value *args;
    size_t nargs;
} jd_request;

static FILE *jd_answers = NULL;

static inline void jd_free_value(jd_value *v) {
    size_t i;
    if (v->kind == JD_STRING) free(v->string);
    if (v->kind == JD_ARRAY || v->kind == JD_OBJECT) {
        for (i = 0; i < v->length; i++) {
            jd_free_value(&v->items[i]);
            if (v->kind == JD_OBJECT) free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof *v);
}

static inline void jd_skip(const char **p) {
    while (**p == ' ' || **p == '\t' || **p == '\r' || **p == '\n') (*p)++;
}

static inline int jd_put_utf8(char *out, size_t *n, unsigned cp) {
    if (cp < 0x80) { out[(*n)++] = (char)cp; }
    else if (cp < 0x800) { out[(*n)++] = (char)(0xC0 | (cp >> 6)); out[(*n)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | (cp >> 12)); out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | (cp >> 18)); out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
    return 1;
}

static inline int jd_hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    int i;
    for (i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static inline int jd_parse_string(const char **p, char **out, size_t *len) {
    const char *s = *p + 1;
    size_t cap = strlen(s) + 1, n = 0;
    char *buf = (char *)malloc(cap);
    if (!buf) return 0;
    while (*s && *s != '"') {
        if (*s != '\\') { buf[n++] = *s++; continue; }
        s++;
        switch (*s) {
            case 'n': buf[n++] = '\n'; s++; break;
            case 't': buf[n++] = '\t'; s++; break;
            case 'r': buf[n++] = '\r'; s++; break;
            case 'b': buf[n++] = '\b'; s++; break;
            case 'f': buf[n++] = '\f'; s++; break;
            case 'u': {
                unsigned cp, lo;
                if (!jd_hex4(s + 1, &cp)) { free(buf); return 0; }
                s += 5;
                if (cp >= 0xD800 && cp < 0xDC00 && s[0] == '\\' && s[1] == 'u' && jd_hex4(s + 2, &lo)) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                }
                jd_put_utf8(buf, &n, cp);
                break;
            }
            case '\0': free(buf); return 0;
            default: buf[n++] = *s++;
        }
    }
    if (*s != '"') { free(buf); return 0; }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    *p = s + 1;
    return 1;
}

static inline int jd_parse(const char **p, jd_value *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > JD_MAX_DEPTH) return 0;
    jd_skip(p);
    if (**p == '"') { v->kind = JD_STRING; return jd_parse_string(p, &v->string, &v->length); }
    if (**p == '[' || **p == '{') {
        int object = **p == '{';
        size_t cap = 4;
        v->kind = object ? JD_OBJECT : JD_ARRAY;
        v->items = (jd_value *)calloc(cap, sizeof(jd_value));
        v->keys = object ? (char **)calloc(cap, sizeof(char *)) : NULL;
        (*p)++;
        jd_skip(p);
        if (**p == (object ? '}' : ']')) { (*p)++; return 1; }
        for (;;) {
            if (v->length == cap) {
                cap *= 2;
                v->items = (jd_value *)realloc(v->items, cap * sizeof(jd_value));
                if (object) v->keys = (char **)realloc(v->keys, cap * sizeof(char *));
            }
            if (object) {
                size_t klen;
                jd_skip(p);
                if (**p != '"' || !jd_parse_string(p, &v->keys[v->length], &klen)) return 0;
                jd_skip(p);
                if (**p != ':') return 0;
                (*p)++;
            }
            if (!jd_parse(p, &v->items[v->length], depth + 1)) return 0;
            v->length++;
            jd_skip(p);
            if (**p == ',') { (*p)++; continue; }
            if (**p == (object ? '}' : ']')) { (*p)++; return 1; }
            return 0;
        }
    }
    if (strncmp(*p, "true", 4) == 0) { v->kind = JD_BOOL; v->boolean = 1; *p += 4; return 1; }
    if (strncmp(*p, "false", 5) == 0) { v->kind = JD_BOOL; *p += 5; return 1; }
    if (strncmp(*p, "null", 4) == 0) { v->kind = JD_NULL; *p += 4; return 1; }
    {
        char *end;
        v->kind = JD_NUMBER;
        v->number = strtod(*p, &end);
        if (end == *p) return 0;
        *p = end;
        return 1;
    }
}

/* -- answers --------------------------------------------------------------------------------- */

static inline void jd_write_string(FILE *f, const char *s, size_t n) {
    size_t i;
    fputc('"', f);
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* {"ok": <value>}: the value is written between jd_begin() and jd_end(). */
static inline void jd_begin(void) { fputs("{\"ok\":", jd_answers); }
static inline void jd_end(void) { fputs("}\n", jd_answers); fflush(jd_answers); }

static inline void jd_ok_null(void) { jd_begin(); fputs("null", jd_answers); jd_end(); }
static inline void jd_ok_int(long long v) { jd_begin(); fprintf(jd_answers, "%lld", v); jd_end(); }
static inline void jd_ok_bool(int v) { jd_begin(); fputs(v ? "true" : "false", jd_answers); jd_end(); }
static inline void jd_ok_string(const char *s, size_t n) { jd_begin(); jd_write_string(jd_answers, s, n); jd_end(); }
/* An answer whose value the driver writes itself: jd_begin(), jd_w_* calls, jd_end(). */
static inline void jd_w_string(const char *s, size_t n) { jd_write_string(jd_answers, s, n); }
static inline void jd_w_raw(const char *text) { fputs(text, jd_answers); }
static inline void jd_w_int(long long v) { fprintf(jd_answers, "%lld", v); }

static inline void jd_err(const char *type, const char *message) {
    fputs("{\"err\":{\"$t\":\"exc\",\"type\":", jd_answers);
    jd_write_string(jd_answers, type, strlen(type));
    fputs(",\"chain\":[],\"builtin\":null,\"message\":", jd_answers);
    jd_write_string(jd_answers, message, strlen(message));
    fputs("}}\n", jd_answers);
    fflush(jd_answers);
}

/* -- requests -------------------------------------------------------------------------------- */

static inline void jd_release(jd_request *r) {
    jd_free_value(&r->doc);
    free(r->line);
    memset(r, 0, sizeof *r);
}

/* The next request (1), or 0 at the end of the input. A malformed one is answered with an
 * error and skipped. */
static inline int jd_next(jd_request *r) {
    size_t cap = 0;
    ssize_t got;
    if (jd_answers == NULL) {
        const char *fd = getenv("IDEGYM_ANSWER_FD");
        jd_answers = fdopen(fd ? atoi(fd) : 3, "w");
        if (jd_answers == NULL) { perror("judge driver: answer descriptor"); exit(2); }
    }
    if (r->line) jd_release(r);
    for (;;) {
        const char *p;
        size_t i;
        r->line = NULL;
        cap = 0;
        got = getline(&r->line, &cap, stdin);
        if (got < 0) { free(r->line); r->line = NULL; return 0; }
        p = r->line;
        if (!jd_parse(&p, &r->doc, 0) || r->doc.kind != JD_OBJECT) {
            jd_err("ProtocolError", "a request must be a JSON object");
            jd_release(r);
            continue;
        }
        for (i = 0; i < r->doc.length; i++) {
            if (strcmp(r->doc.keys[i], "op") == 0 && r->doc.items[i].kind == JD_STRING) r->op = r->doc.items[i].string;
            if (strcmp(r->doc.keys[i], "args") == 0 && r->doc.items[i].kind == JD_ARRAY) {
                r->args = r->doc.items[i].items;
                r->nargs = r->doc.items[i].length;
            }
        }
        if (r->op == NULL) { jd_err("ProtocolError", "a request needs an \"op\""); jd_release(r); continue; }
        return 1;
    }
}

static inline int jd_op(const jd_request *r, const char *name) { return strcmp(r->op, name) == 0; }

static inline const jd_value *jd_arg(const jd_request *r, size_t i, jd_kind kind) {
    static jd_value none;
    if (i >= r->nargs || r->args[i].kind != kind) return &none;
    return &r->args[i];
}

/* Argument i as an int (0 when missing or not a number), a string ("" when not one), an array. */
static inline long long jd_int(const jd_request *r, size_t i) { return (long long)jd_arg(r, i, JD_NUMBER)->number; }
static inline const char *jd_str(const jd_request *r, size_t i) {
    const jd_value *v = jd_arg(r, i, JD_STRING);
    return v->string ? v->string : "";
}
static inline size_t jd_strlen(const jd_request *r, size_t i) { return jd_arg(r, i, JD_STRING)->length; }
static inline const jd_value *jd_array(const jd_request *r, size_t i) { return jd_arg(r, i, JD_ARRAY); }

static inline void jd_unknown(const jd_request *r) {
    char message[256];
    snprintf(message, sizeof message, "the driver has no operation \"%.200s\"", r->op);
    jd_err("ProtocolError", message);
}

#endif
