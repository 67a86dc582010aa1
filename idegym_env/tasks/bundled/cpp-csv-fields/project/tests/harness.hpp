// A minimal unit-test harness that writes a JUnit XML report.
//
// Each test runs in a forked child, so a crash or an endless loop (killed after 10 s) fails that
// test only. A failed CHECK or an escaping exception fails the test with a message.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace harness {

struct Failure {
    std::string message;
};

template <typename A, typename B>
void check_equal(const A& expected, const B& actual, const char* expr, const char* file, int line) {
    if (!(expected == actual)) {
        std::ostringstream out;
        out << file << ":" << line << ": " << expr << ": expected " << expected << ", got " << actual;
        throw Failure{out.str()};
    }
}

inline std::string escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default:
                if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
        }
    }
    return out;
}

// Returns an empty string if the test passed, else why it failed.
inline std::string run_one(const std::function<void()>& test) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    std::cout.flush();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        alarm(10);
        std::string message;
        try {
            test();
        } catch (const Failure& f) {
            message = f.message;
        } catch (const std::exception& e) {
            message = std::string("unexpected exception: ") + e.what();
        } catch (...) {
            message = "unexpected non-standard exception";
        }
        if (!message.empty() && write(fds[1], message.data(), message.size()) < 0) _exit(3);
        _exit(message.empty() ? 0 : 1);
    }
    close(fds[1]);
    std::string message;
    char buffer[512];
    ssize_t n;
    while ((n = read(fds[0], buffer, sizeof buffer)) > 0) message.append(buffer, static_cast<std::size_t>(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        message += "killed by signal " + std::to_string(sig) + (sig == SIGALRM ? " (timeout)" : "");
    }
    return message.empty() ? "failed" : message;
}

inline int run(const std::string& suite, const std::vector<std::pair<std::string, std::function<void()>>>& tests,
               const std::string& report) {
    std::ostringstream cases;
    int failures = 0;
    for (const auto& [name, test] : tests) {
        std::string why = run_one(test);
        std::cout << (why.empty() ? "PASS " : "FAIL ") << name << (why.empty() ? "" : "\n    " + why) << "\n";
        cases << "  <testcase classname=\"" << suite << "\" name=\"" << escape(name) << "\"";
        if (why.empty()) {
            cases << "/>\n";
        } else {
            ++failures;
            cases << ">\n    <failure message=\"" << escape(why) << "\">" << escape(why) << "</failure>\n  </testcase>\n";
        }
    }
    std::cout << tests.size() << " tests, " << tests.size() - failures << " passed, " << failures << " failed\n";
    std::ofstream out(report);
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"" << suite << "\" tests=\"" << tests.size()
        << "\" failures=\"" << failures << "\" errors=\"0\" skipped=\"0\">\n" << cases.str() << "</testsuite>\n";
    if (!out) {
        std::perror(report.c_str());
        return 2;
    }
    return failures == 0 ? 0 : 1;
}

}  // namespace harness

#define CHECK_EQ(expected, actual) harness::check_equal((expected), (actual), #actual, __FILE__, __LINE__)
