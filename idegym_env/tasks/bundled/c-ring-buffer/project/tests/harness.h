/* A minimal unit-test harness that writes a JUnit XML report.
 *
 * Each test runs in a forked child, so a crash or an endless loop (killed after
 * TEST_TIMEOUT_SECONDS) fails that test only. A failed CHECK prints where and why and ends the
 * child with exit code 1.
 */
#ifndef HARNESS_H
#define HARNESS_H

#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_TIMEOUT_SECONDS 10

typedef void (*test_fn)(void);
struct test_case {
    const char *name;
    test_fn fn;
};

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CHECK_EQ(expected, actual)                                                           \
    do {                                                                                     \
        long long e_ = (long long)(expected), a_ = (long long)(actual);                      \
        if (e_ != a_) {                                                                      \
            fprintf(stderr, "%s:%d: %s: expected %lld, got %lld\n", __FILE__, __LINE__, #actual, \
                    e_, a_);                                                                 \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static void xml_escaped(FILE *out, const char *text) {
    for (; *text; text++) {
        switch (*text) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default:
            if ((unsigned char)*text >= 0x20 || *text == '\n' || *text == '\t') fputc(*text, out);
        }
    }
}

/* Run one test in a child; capture its stderr into message. Returns 1 if it passed. */
static int run_one(const struct test_case *tc, char *message, size_t size) {
    int pipefd[2];
    message[0] = '\0';
    if (pipe(pipefd) != 0) {
        snprintf(message, size, "pipe failed");
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        dup2(pipefd[1], STDERR_FILENO);
        alarm(TEST_TIMEOUT_SECONDS);
        tc->fn();
        exit(0);
    }
    close(pipefd[1]);
    size_t used = 0;
    ssize_t n;
    while ((n = read(pipefd[0], message + used, size - 1 - used)) > 0) {
        used += (size_t)n;
        if (used >= size - 1) break;
    }
    message[used] = '\0';
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
    if (WIFSIGNALED(status)) {
        size_t len = strlen(message);
        snprintf(message + len, size - len, "killed by signal %d (%s)\n", WTERMSIG(status),
                 WTERMSIG(status) == SIGALRM ? "timeout" : strsignal(WTERMSIG(status)));
    }
    return 0;
}

static int run_tests(const char *suite, const struct test_case *cases, size_t n, const char *report) {
    static char messages[64][2048];
    int passed[64];
    double seconds[64];
    size_t failures = 0;
    if (n > 64) n = 64;
    for (size_t i = 0; i < n; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        passed[i] = run_one(&cases[i], messages[i], sizeof messages[i]);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        seconds[i] = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        failures += !passed[i];
        printf("%s %s\n%s", passed[i] ? "PASS" : "FAIL", cases[i].name, passed[i] ? "" : messages[i]);
    }
    printf("%zu tests, %zu passed, %zu failed\n", n, n - failures, failures);
    FILE *out = fopen(report, "w");
    if (out == NULL) {
        perror(report);
        return 2;
    }
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out, "<testsuite name=\"%s\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"0\">\n", suite,
            n, failures);
    for (size_t i = 0; i < n; i++) {
        fprintf(out, "  <testcase classname=\"%s\" name=\"%s\" time=\"%.4f\"", suite, cases[i].name, seconds[i]);
        if (passed[i]) {
            fprintf(out, "/>\n");
        } else {
            fprintf(out, ">\n    <failure message=\"test failed\">");
            xml_escaped(out, messages[i]);
            fprintf(out, "</failure>\n  </testcase>\n");
        }
    }
    fprintf(out, "</testsuite>\n");
    fclose(out);
    return failures == 0 ? 0 : 1;
}

#endif
