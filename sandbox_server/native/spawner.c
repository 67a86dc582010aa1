/* idegym-spawner UID GID GROUPS OOM_SCORE_ADJ      (its socket: descriptor 3)
 *
 * The tool user's spawner: the process that starts the tools of one user of a sandbox, being that
 * user already (sandbox_server/spawner.py is the server's side, and says why). The root server
 * starts it with posix_spawn from its thread that lives in the tools' cgroups, so it is born in
 * them (a move would cost the host an RCU grace period of stalled forks), its end of a
 * SOCK_SEQPACKET socket pair as descriptor 3. Still root, it takes the tools' OOM_SCORE_ADJ, then
 * becomes UID:GID with the supplementary GROUPS (comma-separated gids, or "-" for none): real,
 * effective and saved ids alike, no capability left. Then, and not before (a change of uid clears
 * both), it dies with its parent (PR_SET_PDEATHSIG) and is made non-dumpable: the user's own
 * processes can neither ptrace it nor read its environment, memory or descriptors. It keeps no
 * descriptor but 0-2 (/dev/null, /dev/null, the server's stderr), its socket, a signalfd and
 * its running tools' stdout and stderr.
 *
 * Each message it sends is int32 kind, int32 pid, int32 value, then a short text. It first says
 * it is ready (or why it could not be: an answer of pid 0, an errno, a text) and exits on a failed
 * step. Then, per request, in order:
 *
 *   request: uint32 argc, uint32 envc, uint32 hold (microseconds, at most MAX_HOLD_US), then
 *            cwd, argv[0..argc) and envp[0..envc) ("NAME=value"), each NUL-terminated, nothing
 *            after; with exactly three descriptors (SCM_RIGHTS): the tool's stdin, stdout and
 *            stderr;
 *   answer:  kind ANSWER, the tool's pid and errno 0, or pid 0 with an errno and why not. A
 *            started tool's answer may wait up to its hold for the tool's end, and then goes
 *            just before it: a quick tool's answer and end reach the server together, in one
 *            wake-up of it, not two. Answers keep their requests' order (one that goes takes
 *            those held before it along).
 *
 * A tool is started with posix_spawn (vfork and exec) in a new session, every signal at its
 * default, an empty signal mask, only the three descriptors, in cwd, with envp; a bare program
 * name is looked up on envp's PATH as execvp would (as the tool user: its access rights). When a
 * tool exits (after its answer: it is reaped only between requests), the spawner says so on the
 * same socket: kind EXITED, its pid and its wait status (native int). It keeps its own copies of
 * a running tool's stdout and stderr and closes them just before that message, so the pipes end
 * with it, not a wake-up of the server before, and a server told a tool's end finds its pipes
 * at their end (but for what a background child of the tool holds). A tool is reaped only once
 * its end is sent: a spawner killed in between leaves a zombie, re-parented to the server, that
 * the server reaps with the same status. A malformed request is answered with an error (EINVAL, EMSGSIZE)
 * and changes nothing. The spawner exits when the server closes the socket; its tools go on,
 * re-parented to the server.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SOCK 3
#define MAX_REQUEST (2 << 20)       /* the server sends nothing longer (spawner.py: MAX_REQUEST) */
#define KEEP_RESIDENT (64 << 10)    /* of the request buffer: returned to the kernel beyond this */
#define MAX_GROUPS 1024
#define MAX_TEXT 200
#define MAX_HOLD_US 1000000         /* the longest an answer waits for its tool's end */
#define MAX_HELD 64                 /* answers held back at once; past that, they go at once */
#define DEFAULT_PATH "/bin:/usr/bin" /* Python's os.defpath, as the server's own lookup */

enum { ANSWER = 0, EXITED = 1 }; /* spawner.py: ANSWERED, EXITED */

struct message {
    int32_t kind;
    int32_t pid;
    int32_t value; /* an answer's errno, an exit's wait status */
    char text[MAX_TEXT];
};

/* A running tool and the spawner's copies of its stdout and stderr, closed just before its end is
 * told: the pipes end with the message, not a wake-up of the server earlier. */
struct tool {
    pid_t pid;
    int out, err;
};

static char *request;               /* MAX_REQUEST bytes, touched only as far as requests go */
/* Answers held back (the pids of their tools, in request order) until their tools end or the
 * earliest hold is over: a quick tool's answer and end then reach the server in one wake-up. */
static pid_t held[MAX_HELD];
static size_t held_count;
static struct timespec held_until;
static struct tool *tools;
static size_t tool_count, tool_room;
static sigset_t every_signal; /* a tool's signals: every one at its default (jail.RESET_SIGNALS and more) */

static void send_message(int kind, pid_t pid, int value, const char *what) {
    struct message m = {kind, pid, value, ""};
    int n = !what ? 0 : value ? snprintf(m.text, sizeof m.text, "%s: %s", what, strerror(value))
                              : snprintf(m.text, sizeof m.text, "%s", what);
    size_t len = offsetof(struct message, text) + (n < 0 ? 0 : (size_t)n >= sizeof m.text ? sizeof m.text - 1 : (size_t)n);
    if (send(SOCK, &m, len, MSG_NOSIGNAL) != (ssize_t)len) _exit(0); /* the server is gone */
}

static void say(pid_t pid, int error, const char *what) { send_message(ANSWER, pid, error, what); }

static void send_held(void) {
    for (size_t i = 0; i < held_count; i++) say(held[i], 0, NULL);
    held_count = 0;
}

static void setup_failed(const char *what) {
    say(0, errno ? errno : EINVAL, what);
    _exit(1);
}

static int number(const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (!*text || *end || errno || value < lo || value > hi) return 0;
    *out = value;
    return 1;
}

static void write_file(const char *path, const char *value) { /* as root, in the set-up */
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t len = (ssize_t)strlen(value);
    if (fd < 0) setup_failed(path);
    if (write(fd, value, (size_t)len) != len) setup_failed(path);
    close(fd);
}

static void close_other_descriptors(void) {
    if (syscall(SYS_close_range, SOCK + 1, ~0U, 0) == 0) return; /* Linux 5.9 */
    struct rlimit limit;
    long most = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_max != RLIM_INFINITY ? (long)limit.rlim_max : 1 << 20;
    for (long fd = SOCK + 1; fd < most; fd++) close((int)fd);
}

/* Everything that needs root, then the tool user for good. */
static int become(char **argv) {
    pid_t parent = getppid();
    long uid, gid, one, adj;
    gid_t groups[MAX_GROUPS];
    size_t n = 0;
    char adj_text[16];
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigset_t chld;

    close_other_descriptors();
    for (int sig = 1; sig < NSIG; sig++) sigaction(sig, &dfl, NULL); /* some are refused: fine */
    /* Bit by bit: sigaddset refuses glibc's two internal signals (32, 33), which its posix_spawn
     * would then leave ignored in the tool (Popen's tools have them at their defaults). */
    unsigned long *words = (unsigned long *)&every_signal;
    sigemptyset(&every_signal);
    for (int sig = 1; sig < NSIG; sig++) words[(sig - 1) / (8 * sizeof *words)] |= 1UL << ((sig - 1) % (8 * sizeof *words));
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_SETMASK, &chld, NULL) != 0) setup_failed("sigprocmask");
    int signals = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals < 0) setup_failed("signalfd");
    request = mmap(NULL, MAX_REQUEST, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (request == MAP_FAILED) setup_failed("mmap");

    errno = EINVAL;
    if (!number(argv[1], 1, 0xfffffffeL, &uid)) setup_failed("uid (never 0: no tool of a spawner is root)");
    if (!number(argv[2], 0, 0xfffffffeL, &gid)) setup_failed("gid");
    if (!number(argv[4], -1000, 1000, &adj)) setup_failed("oom_score_adj");
    if (strcmp(argv[3], "-") != 0) {
        for (char *item = strtok(argv[3], ","); item; item = strtok(NULL, ",")) {
            errno = EINVAL;
            if (n == MAX_GROUPS || !number(item, 0, 0xfffffffeL, &one)) setup_failed("groups");
            groups[n++] = (gid_t)one;
        }
    }
    snprintf(adj_text, sizeof adj_text, "%ld", adj);
    write_file("/proc/self/oom_score_adj", adj_text);

    if (setgroups(n, groups) != 0) setup_failed("setgroups");
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) setup_failed("setresgid");
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) setup_failed("setresuid");
    /* No capability left, whatever securebits the server had (a uid change alone would do). */
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2];
    memset(caps, 0, sizeof caps);
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (syscall(SYS_capset, &header, caps) != 0) setup_failed("capset");
    /* After the uid change, which clears both. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) setup_failed("PR_SET_PDEATHSIG");
    if (getppid() != parent) _exit(1); /* the server went before the line above */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) setup_failed("PR_SET_DUMPABLE");
    if (chdir("/") != 0) setup_failed("chdir /");
    say(0, 0, "ready");
    return signals;
}

/* A bare name looked up on the request's PATH, as execvp would in cwd (an empty entry is cwd). */
static const char *executable(const char *name, const char *cwd, char *const *envp, char *path, size_t size) {
    if (strchr(name, '/')) return name; /* a relative one: from cwd, where posix_spawn has gone */
    const char *dirs = DEFAULT_PATH;
    for (char *const *e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) dirs = *e + 5;
    size_t name_len = strlen(name);
    for (const char *dir = dirs;; dir++) {
        const char *end = strchrnul(dir, ':');
        size_t len = (size_t)(end - dir), base = *dir == '/' ? 0 : strlen(cwd) + 1;
        struct stat st;
        if (base + len + 1 + name_len < size) {
            if (base) {
                memcpy(path, cwd, base - 1);
                path[base - 1] = '/';
            }
            memcpy(path + base, dir, len);
            path[base + len] = '/';
            memcpy(path + base + len + 1, name, name_len + 1);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0) return path;
        }
        if (!*end) break;
        dir = end;
    }
    errno = ENOENT;
    return NULL;
}

/* Room for one more tool in the table (made before it starts: a started tool is never lost). */
static int room_for_one(void) {
    if (tool_count < tool_room) return 1;
    size_t room = tool_room ? tool_room * 2 : 16;
    struct tool *more = realloc(tools, room * sizeof *tools);
    if (!more) return 0;
    tools = more;
    tool_room = room;
    return 1;
}

/* The tool of a request of `size` bytes: its pid, or 0 with *error and *why saying why not. */
static pid_t start(size_t size, const int fds[3], int *error, const char **why, long *hold_us) {
    uint32_t counts[3];
    size_t strings = 0;
    *why = "malformed request";
    *error = EINVAL;
    if (size < sizeof counts + 1 || request[size - 1] != '\0') return 0;
    memcpy(counts, request, sizeof counts);
    size_t argc = counts[0], envc = counts[1];
    *hold_us = counts[2] > MAX_HOLD_US ? MAX_HOLD_US : counts[2];
    if (argc < 1 || argc > size || envc > size) return 0;
    for (const char *p = request + sizeof counts, *end = request + size; p < end;
         p = (const char *)memchr(p, '\0', (size_t)(end - p)) + 1)
        strings++;
    if (strings != 1 + argc + envc) return 0;
    char *cwd = request + sizeof counts, *p = cwd + strlen(cwd) + 1;
    if (cwd[0] != '/' || p[0] == '\0') return 0; /* cwd absolute, argv[0] not empty */
    char **argv = malloc((argc + envc + 2) * sizeof *argv);
    if (!argv || !room_for_one()) {
        free(argv);
        *why = "out of memory";
        *error = ENOMEM;
        return 0;
    }
    char **envp = argv + argc + 1;
    for (size_t i = 0; i < argc; i++, p += strlen(p) + 1) argv[i] = p;
    argv[argc] = NULL;
    for (size_t i = 0; i < envc; i++, p += strlen(p) + 1) envp[i] = p;
    envp[envc] = NULL;
    pid_t pid = 0;
    int well_formed = 1;
    for (size_t i = 0; well_formed && i < envc; i++) well_formed = envp[i][0] != '=' && strchr(envp[i], '=') != NULL;
    char found[PATH_MAX];
    const char *program = well_formed ? executable(argv[0], cwd, envp, found, sizeof found) : NULL;
    if (!well_formed) {
        *why = "malformed environment";
    } else if (!program) {
        *why = argv[0];
        *error = ENOENT;
    } else {
        posix_spawn_file_actions_t actions;
        posix_spawnattr_t attr;
        sigset_t none;
        sigemptyset(&none);
        posix_spawn_file_actions_init(&actions);
        posix_spawnattr_init(&attr);
        int failed = posix_spawn_file_actions_addchdir_np(&actions, cwd);
        for (int fd = 0; fd < 3 && !failed; fd++) failed = posix_spawn_file_actions_adddup2(&actions, fds[fd], fd);
        if (!failed)
            failed = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
        if (!failed) failed = posix_spawnattr_setsigdefault(&attr, &every_signal);
        if (!failed) failed = posix_spawnattr_setsigmask(&attr, &none);
        if (!failed) failed = posix_spawn(&pid, program, &actions, &attr, argv, envp);
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attr);
        if (failed) {
            pid = 0;
            *why = program;
            *error = failed;
        }
    }
    free(argv);
    return pid;
}

/* One request read and answered: 1, or 0 when there is none, or -1 when the server is gone. */
static int serve_one(void) {
    char control[CMSG_SPACE(8 * sizeof(int))];
    struct iovec iov = {request, MAX_REQUEST};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t size = recvmsg(SOCK, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (size < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (size == 0) return -1;
    int fds[3], count = 0, extra = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof fd, sizeof fd);
            if (count < 3) fds[count++] = fd;
            else {
                close(fd);
                extra = 1;
            }
        }
    }
    pid_t pid = 0;
    int error;
    const char *why;
    long hold_us = 0;
    if (msg.msg_flags & MSG_TRUNC) {
        why = "request too long";
        error = EMSGSIZE;
    } else if (count != 3 || extra || (msg.msg_flags & MSG_CTRUNC)) {
        why = "a tool needs stdin, stdout and stderr, nothing else";
        error = EINVAL;
    } else {
        pid = start((size_t)size, fds, &error, &why, &hold_us);
    }
    for (int i = 0; i < count; i++)
        if (!pid || i == 0) close(fds[i]);
    if (pid) tools[tool_count++] = (struct tool){pid, fds[1], fds[2]};
    if (size > KEEP_RESIDENT) madvise(request + KEEP_RESIDENT, (size_t)size - KEEP_RESIDENT, MADV_DONTNEED);
    if (pid && hold_us > 0 && held_count < MAX_HELD) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += hold_us * 1000;
        until.tv_sec += until.tv_nsec / 1000000000;
        until.tv_nsec %= 1000000000;
        if (!held_count || until.tv_sec < held_until.tv_sec ||
            (until.tv_sec == held_until.tv_sec && until.tv_nsec < held_until.tv_nsec))
            held_until = until;
        held[held_count++] = pid;
        return 1;
    }
    send_held(); /* answers go in request order */
    if (pid) say(pid, 0, NULL);
    else say(0, error, why);
    return 1;
}

/* Ended tools: each one's wait status said, its output's copies closed, then it is reaped (every
 * child is a tool). */
static void reap(void) {
    siginfo_t info;
    for (;;) {
        info.si_pid = 0;
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
        int status = info.si_code == CLD_EXITED ? (info.si_status & 0xff) << 8
                   : info.si_code == CLD_DUMPED ? info.si_status | 0x80 : info.si_status;
        for (size_t i = 0; i < held_count; i++)
            if (held[i] == info.si_pid) send_held(); /* its answer before its end */
        for (size_t i = 0; i < tool_count; i++) {
            if (tools[i].pid != info.si_pid) continue;
            close(tools[i].out);
            close(tools[i].err);
            tools[i] = tools[--tool_count];
            break;
        }
        send_message(EXITED, info.si_pid, status, NULL);
        waitpid(info.si_pid, &status, 0);
    }
}

int main(int argc, char **argv) {
    struct stat st;
    if (argc != 5) {
        fprintf(stderr, "usage: idegym-spawner UID GID GROUPS|- OOM_SCORE_ADJ (its socket at descriptor 3)\n");
        return 2;
    }
    if (fstat(SOCK, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        fprintf(stderr, "idegym-spawner: descriptor %d is not its socket\n", SOCK);
        return 2;
    }
    for (int fd = 0; fd < 3; fd++) /* a received descriptor must never land on 0-2 */
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd) return 2;
    if (fcntl(SOCK, F_SETFD, FD_CLOEXEC) != 0) return 2;
    int signals = become(argv);
    struct pollfd ready[2] = {{SOCK, POLLIN, 0}, {signals, POLLIN, 0}};
    for (;;) {
        struct timespec left, now;
        if (held_count) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            left.tv_sec = held_until.tv_sec - now.tv_sec;
            left.tv_nsec = held_until.tv_nsec - now.tv_nsec;
            if (left.tv_nsec < 0) {
                left.tv_sec--;
                left.tv_nsec += 1000000000;
            }
            if (left.tv_sec < 0) send_held(); /* the hold is over: the answers of tools that still run */
        }
        if (ppoll(ready, 2, held_count ? &left : NULL, NULL) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (ready[1].revents) {
            struct signalfd_siginfo info;
            while (read(signals, &info, sizeof info) > 0) {}
            reap();
        }
        if (ready[0].revents) {
            int served;
            while ((served = serve_one()) > 0) {}
            if (served < 0) return 0;
        }
    }
}
