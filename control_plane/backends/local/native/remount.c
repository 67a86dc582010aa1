/* idegym-remount < REQUEST
 *
 * Remounts warm-pool sandboxes onto a fork's layers: what control_plane/backends/local/adopt.py's
 * Python remount does for one sandbox, for every child of a fork at once, each in a process of its
 * own (forked from this one: 2 cores serve them side by side). The control plane (root) runs it;
 * nothing of a sandbox runs it or writes its request. The 8 remounts of a fork into 8 took 8 jobs
 * of about 2 ms of Python each, on threads that joined the sandboxes' namespaces and took turns on
 * the interpreter lock (docs/fork.md). It lives with the control plane, not with the sandbox
 * server's helpers, which every sandbox's runtime holds.
 *
 * The request (stdin) is NUL-terminated fields, numbers in decimal:
 *   "idegym-remount/1", STATE_DIR (absolute; the overlays' paths are relative to it, so a
 *   sandbox's /proc/mounts shows no host path), RECORD (the file name of the project's fork layers
 *   list, written in each project layer), then N (1..64) and N jobs:
 *     PID START (the sandbox's server and its start time, as /proc/PID/stat's 22nd field gives it:
 *       a pid reused by another process is refused), LAYERS (the sandbox's layer directory,
 *       relative to STATE_DIR where it is below it), PROJECT_DIR (absolute, in the sandbox), RECORD_TEXT (what RECORD
 *       holds), LIKE (a path whose owner, mode and times the project's new upper takes, or ""),
 *     T (0..8) trees: NAME (one path component: /NAME in the sandbox, LAYERS/NAME on the host),
 *       L (1..500) and L lower directories, top first,
 *     L and L project lower directories,
 *     B (0..64) read-only binds of the project's levels: SOURCE, TARGET (absolute, in the sandbox).
 * A malformed request is refused as a whole (exit 2, the reason on stderr, nothing changed).
 *
 * Each job, as the Python remount: a fresh upper and work directory per tree and for the project
 * (the old ones renamed .warm-upper and .warm-work: the overlays being covered still use them);
 * RECORD written; the overlays (trees nosuid,nodev; the project with userxattr) and the binds made
 * here, with paths resolved on the host; the mounts directly inside the trees to be covered (the
 * server's runtime, /etc/resolv.conf; read from the server's mountinfo, the project's own mount
 * excepted) cloned in the sandbox's mount namespace and attached again on the new trees, the
 * trees, binds and project attached on top of the old ones (nothing unmounted: an unmount waits
 * for an RCU grace period). The sandbox's /proc entries are opened once, from one descriptor of
 * /proc/PID, after its start time is checked: every step acts on that process.
 *
 * Output (stdout): one line per job that failed, "INDEX ERRNO WHAT"; exit 0 when all succeeded,
 * 1 when some failed (the others are remounted), 2 when the request was refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAGIC "idegym-remount/1"
#define MAX_REQUEST (4 << 20)
#define MAX_JOBS 64
#define MAX_TREES 8
#define MAX_LOWERS 500
#define MAX_BINDS 64
#define MAX_KEEP 256

/* Linux's mount API (x86-64 and aarch64 share these numbers). */
#define SYS_open_tree_ 428
#define SYS_move_mount_ 429
#define SYS_fsopen_ 430
#define SYS_fsconfig_ 431
#define SYS_fsmount_ 432
#define SYS_mount_setattr_ 442
#define FSOPEN_CLOEXEC_ 1
#define FSCONFIG_SET_FLAG_ 0
#define FSCONFIG_SET_STRING_ 1
#define FSCONFIG_CMD_CREATE_ 6
#define FSMOUNT_CLOEXEC_ 1
#define MOUNT_ATTR_RDONLY_ 0x1
#define MOUNT_ATTR_NOSUID_ 0x2
#define MOUNT_ATTR_NODEV_ 0x4
#define OPEN_TREE_CLONE_ 1
#define AT_RECURSIVE_ 0x8000
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4

struct mount_attr_ {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
};

struct tree {
    const char *name;
    unsigned long nlowers;
    const char **lowers;
};

struct job {
    unsigned long pid, start;
    const char *layers, *project_dir, *record_text, *like;
    unsigned long ntrees, nproject, nbinds;
    struct tree trees[MAX_TREES];
    const char **project;
    const char *bind_source[MAX_BINDS], *bind_target[MAX_BINDS];
};

static const char *record_name;

/* ---- the request ---- */

static char *cursor, *end_of_request;

static const char *field(void) {
    if (cursor >= end_of_request) return NULL;
    char *nul = memchr(cursor, '\0', (size_t)(end_of_request - cursor));
    if (!nul) return NULL;
    char *out = cursor;
    cursor = nul + 1;
    return out;
}

static int refuse(const char *why, const char *what) {
    fprintf(stderr, "idegym-remount: refused: %s%s%s\n", why, what ? ": " : "", what ? what : "");
    return 0;
}

static int number(unsigned long *out, unsigned long lo, unsigned long hi, const char *what) {
    const char *text = field();
    char *end;
    if (!text) return refuse("the request ends early", what);
    errno = 0;
    *out = strtoul(text, &end, 10);
    if (!*text || *end || errno || *text == '-' || *text == '+' || *out < lo || *out > hi)
        return refuse("not a number in range", what);
    return 1;
}

static int has_dotdot(const char *path) {
    for (const char *p = path; *p; ) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') return 1;
        if (!slash) break;
        p = slash + 1;
    }
    return 0;
}

static int absolute(const char **out, const char *what) {
    if (!(*out = field())) return refuse("the request ends early", what);
    if ((*out)[0] != '/' || has_dotdot(*out)) return refuse("not an absolute path without '..'", *out);
    return 1;
}

static int path(const char **out, const char *what) {
    if (!(*out = field())) return refuse("the request ends early", what);
    if (!(*out)[0] || has_dotdot(*out)) return refuse("not a path without '..'", *out);
    return 1;
}

static int component(const char **out, const char *what) {
    if (!(*out = field())) return refuse("the request ends early", what);
    if (!(*out)[0] || strchr(*out, '/') || !strcmp(*out, ".") || !strcmp(*out, ".."))
        return refuse("not a single name", *out);
    return 1;
}

static int any(const char **out, const char *what) {
    return (*out = field()) ? 1 : refuse("the request ends early", what);
}

static int lowers(const char ***out, unsigned long *n, const char *what) {
    if (!number(n, 1, MAX_LOWERS, what)) return 0;
    if (!(*out = calloc(*n, sizeof **out))) return refuse("out of memory", what);
    for (unsigned long i = 0; i < *n; i++) {
        if (!any(&(*out)[i], what)) return 0;
        if (!(*out)[i][0]) return refuse("an empty lower directory", what);
    }
    return 1;
}

static int parse_job(struct job *j) {
    const char *like;
    if (!number(&j->pid, 2, 0x7fffffff, "pid") || !number(&j->start, 0, (unsigned long)-1 - 1, "start time") ||
        !path(&j->layers, "layers") || !absolute(&j->project_dir, "project directory") ||
        !any(&j->record_text, "record") || !any(&like, "like"))
        return 0;
    if (like[0] && (like[0] != '/' || has_dotdot(like))) return refuse("not an absolute path without '..'", like);
    j->like = like[0] ? like : NULL;
    if (!number(&j->ntrees, 0, MAX_TREES, "trees")) return 0;
    for (unsigned long t = 0; t < j->ntrees; t++) {
        if (!component(&j->trees[t].name, "tree") || !lowers(&j->trees[t].lowers, &j->trees[t].nlowers, "tree lowers"))
            return 0;
        if (!strcmp(j->trees[t].name, "project")) return refuse("a tree named project", NULL);
    }
    if (!lowers(&j->project, &j->nproject, "project lowers") || !number(&j->nbinds, 0, MAX_BINDS, "binds")) return 0;
    for (unsigned long b = 0; b < j->nbinds; b++)
        if (!absolute(&j->bind_source[b], "bind source") || !absolute(&j->bind_target[b], "bind target")) return 0;
    return 1;
}

/* ---- one job (in a process of its own) ---- */

static unsigned long job_index;

static void failed(const char *fmt, ...) {
    int err = errno;
    char what[1024], line[1200];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    int n = snprintf(line, sizeof line, "%lu %d %s: %s\n", job_index, err, what, strerror(err));
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    if (write(STDOUT_FILENO, line, (size_t)n) < 0) { /* the exit status says it failed */ }
    _exit(1);
}

static void path_of(char *out, size_t size, const char *a, const char *b, const char *c) {
    if ((size_t)snprintf(out, size, "%s/%s%s%s", a, b, c ? "/" : "", c ? c : "") >= size) {
        errno = ENAMETOOLONG;
        failed("%s/%s", a, b);
    }
}

/* A fresh upper and work directory in LAYERS/NAME, the old ones kept under other names. */
static void fresh_layer(const struct job *j, const char *name, const char *like) {
    char layer[4096], from[4200], to[4200];
    path_of(layer, sizeof layer, j->layers, name, NULL);
    static const char *const parts[] = {"upper", "work"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", layer, parts[i]);
        snprintf(to, sizeof to, "%s/.warm-%s", layer, parts[i]);
        if (rename(from, to) != 0 && errno != ENOENT) failed("keeping %s", from);
    }
    snprintf(from, sizeof from, "%s/upper", layer);
    if (mkdir(from, 0755) != 0) failed("mkdir %s", from);
    if (like) {
        struct stat st;
        if (stat(like, &st) != 0) failed("stat %s", like);
        if (chown(from, st.st_uid, st.st_gid) != 0) failed("chown %s", from);
        if (chmod(from, st.st_mode & 07777) != 0) failed("chmod %s", from);
        struct timespec times[2] = {st.st_atim, st.st_mtim};
        if (utimensat(AT_FDCWD, from, times, 0) != 0) failed("utimes %s", from);
    }
    snprintf(to, sizeof to, "%s/work", layer);
    if (mkdir(to, 0700) != 0) failed("mkdir %s", to);
}

static void option(int fs, const char *key, const char *value) {
    if (syscall(SYS_fsconfig_, fs, value ? FSCONFIG_SET_STRING_ : FSCONFIG_SET_FLAG_, key, value, 0) != 0)
        failed("overlay option %s=%s", key, value ? value : "");
}

/* A detached overlay of LOWERS (top first) under LAYERS/NAME's upper. */
static int overlay(const struct job *j, const char *name, const char **lowers, unsigned long n, unsigned attrs,
                   int userxattr) {
    char upper[4200], work[4200];
    path_of(upper, sizeof upper, j->layers, name, "upper");
    path_of(work, sizeof work, j->layers, name, "work");
    int fs = (int)syscall(SYS_fsopen_, "overlay", FSOPEN_CLOEXEC_);
    if (fs < 0) failed("fsopen(overlay)");
    for (unsigned long i = 0; i < n; i++) option(fs, "lowerdir+", lowers[i]);
    option(fs, "upperdir", upper);
    option(fs, "workdir", work);
    if (userxattr) option(fs, "userxattr", NULL);
    if (syscall(SYS_fsconfig_, fs, FSCONFIG_CMD_CREATE_, NULL, NULL, 0) != 0) failed("overlay over %s...", lowers[0]);
    int mnt = (int)syscall(SYS_fsmount_, fs, FSMOUNT_CLOEXEC_, attrs);
    if (mnt < 0) failed("fsmount(overlay %s)", name);
    close(fs);
    return mnt;
}

static int clone_tree(const char *path, int recursive, int readonly) {
    int fd = (int)syscall(SYS_open_tree_, AT_FDCWD, path, OPEN_TREE_CLONE_ | O_CLOEXEC | (recursive ? AT_RECURSIVE_ : 0));
    if (fd < 0) failed("open_tree(%s)", path);
    if (readonly) {
        struct mount_attr_ attr = {MOUNT_ATTR_RDONLY_ | MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_, 0, 0, 0};
        if (syscall(SYS_mount_setattr_, fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE_ : 0), &attr, sizeof attr) != 0)
            failed("read-only %s", path);
    }
    return fd;
}

static void attach(int fd, const char *target) {
    if (syscall(SYS_move_mount_, fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH_) != 0) failed("move_mount to %s", target);
}

/* mkdir -p (as os.makedirs(exist_ok=True)). */
static void directories(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) {
        errno = ENAMETOOLONG;
        failed("mkdir %s", path);
    }
    strcpy(buf, path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || !*p) {
            char was = *p;
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) failed("mkdir %s", buf);
            if (!was) break;
            *p = was;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0) failed("stat %s", path);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        failed("mkdir %s", path);
    }
}

static char *read_at(int dir, const char *name, size_t *size) {
    int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) failed("open /proc/PID/%s", name);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) failed("reading %s", name);
        ssize_t got = read(fd, buf + len, cap - len - 1);
        if (got < 0) failed("reading %s", name);
        if (got == 0) break;
        len += (size_t)got;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = '\0';
    *size = len;
    return buf;
}

/* mountinfo escapes a space, tab, newline and backslash in octal. */
static void unescape(char *s) {
    char *out = s;
    for (char *in = s; *in; ) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '3' && in[2] >= '0' && in[2] <= '7' && in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 4;
        } else {
            *out++ = *in++;
        }
    }
    *out = '\0';
}

/* The mount points directly inside the trees about to be covered (the topmost mount of each),
 * the project's own excepted, in mountinfo's order (later lines are mounted later). */
static unsigned long submounts(const struct job *j, int proc, char *keep[MAX_KEEP]) {
    size_t size;
    char *text = read_at(proc, "mountinfo", &size);
    unsigned long n = 0, lines = 0;
    for (char *p = text; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) lines++;
    unsigned long *ids = calloc(lines + 1, sizeof *ids), *parents = calloc(lines + 1, sizeof *parents);
    char **points = calloc(lines + 1, sizeof *points);
    unsigned long tops[MAX_TREES] = {0};
    int found[MAX_TREES] = {0};
    if (!ids || !parents || !points) failed("reading mountinfo");
    unsigned long count = 0;
    for (char *line = text; *line; ) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        else next = line + strlen(line);
        char *fields[5];
        char *p = line;
        int k = 0;
        for (; k < 5 && p; k++) {
            fields[k] = p;
            p = strchr(p, ' ');
            if (p) *p++ = '\0';
        }
        if (k == 5) {
            unescape(fields[4]);
            ids[count] = strtoul(fields[0], NULL, 10);
            parents[count] = strtoul(fields[1], NULL, 10);
            points[count] = fields[4];
            for (unsigned long t = 0; t < j->ntrees; t++)
                if (points[count][0] == '/' && !strcmp(points[count] + 1, j->trees[t].name)) {
                    tops[t] = ids[count];
                    found[t] = 1;
                }
            count++;
        }
        line = next;
    }
    for (unsigned long i = 0; i < count; i++) {
        int inside = 0;
        for (unsigned long t = 0; t < j->ntrees; t++) inside |= found[t] && parents[i] == tops[t];
        if (!inside || !strcmp(points[i], j->project_dir)) continue;
        if (n == MAX_KEEP) {
            errno = E2BIG;
            failed("mounts inside the trees");
        }
        keep[n++] = points[i];
    }
    return n;
}

static int server_is(int proc, unsigned long start) {
    size_t size;
    char *text = read_at(proc, "stat", &size);
    char *p = strrchr(text, ')');
    if (!p) return 0;
    char state = 0;
    unsigned long long value = 0;
    p++;
    for (int k = 0; k < 20; k++) {
        while (*p == ' ') p++;
        if (!*p) return 0;
        if (k == 0) state = *p;
        if (k == 19) value = strtoull(p, NULL, 10);
        while (*p && *p != ' ') p++;
    }
    return state != 'Z' && state != 'X' && value == start;
}

static void run(const struct job *j) {
    char proc_path[64], target[4200];
    snprintf(proc_path, sizeof proc_path, "/proc/%lu", j->pid);
    int proc = open(proc_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0) failed("the sandbox's server (pid %lu) is gone", j->pid);
    if (!server_is(proc, j->start)) {
        errno = ESRCH;
        failed("the sandbox's server (pid %lu) is gone", j->pid);
    }
    int fds[MAX_TREES];
    for (unsigned long t = 0; t < j->ntrees; t++) {
        fresh_layer(j, j->trees[t].name, NULL);
        fds[t] = overlay(j, j->trees[t].name, j->trees[t].lowers, j->trees[t].nlowers,
                         MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_, 0);
    }
    fresh_layer(j, "project", j->like);
    path_of(target, sizeof target, j->layers, "project", record_name);
    int out = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
    size_t len = strlen(j->record_text);
    if (out < 0 || write(out, j->record_text, len) != (ssize_t)len || close(out) != 0) failed("writing %s", target);
    int project = overlay(j, "project", j->project, j->nproject, 0, 1);
    int binds[MAX_BINDS];
    for (unsigned long b = 0; b < j->nbinds; b++) binds[b] = clone_tree(j->bind_source[b], 0, 1);
    char *keep[MAX_KEEP];
    unsigned long nkeep = submounts(j, proc, keep);
    int ns = openat(proc, "ns/mnt", O_RDONLY | O_CLOEXEC);
    if (ns < 0) failed("open /proc/%lu/ns/mnt", j->pid);
    if (setns(ns, CLONE_NEWNS) != 0) failed("setns(mnt)");  /* from here on, paths are the sandbox's */
    int moved[MAX_KEEP];
    for (unsigned long k = 0; k < nkeep; k++) moved[k] = clone_tree(keep[k], 1, 0);
    for (unsigned long t = 0; t < j->ntrees; t++) {
        snprintf(target, sizeof target, "/%s", j->trees[t].name);
        attach(fds[t], target);
    }
    for (unsigned long k = 0; k < nkeep; k++) {
        directories(keep[k]);
        attach(moved[k], keep[k]);
    }
    for (unsigned long b = 0; b < j->nbinds; b++) {
        directories(j->bind_target[b]);
        attach(binds[b], j->bind_target[b]);
    }
    attach(project, j->project_dir);
    _exit(0);
}

int main(void) {
    static struct job jobs[MAX_JOBS];
    char *request = malloc(MAX_REQUEST);
    size_t len = 0;
    if (!request) return refuse("out of memory", NULL), 2;
    for (;;) {
        ssize_t got = read(STDIN_FILENO, request + len, MAX_REQUEST - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return refuse("reading the request", strerror(errno)), 2;
        if (got == 0) break;
        len += (size_t)got;
        if (len == MAX_REQUEST) return refuse("the request is too long", NULL), 2;
    }
    cursor = request;
    end_of_request = request + len;
    const char *magic, *state_dir;
    unsigned long n;
    if (!any(&magic, "magic")) return 2;
    if (strcmp(magic, MAGIC) != 0) return refuse("not a request of " MAGIC, NULL), 2;
    if (!absolute(&state_dir, "state directory") || !component(&record_name, "record name") ||
        !number(&n, 1, MAX_JOBS, "jobs"))
        return 2;
    for (unsigned long i = 0; i < n; i++)
        if (!parse_job(&jobs[i])) return 2;
    if (cursor != end_of_request) return refuse("bytes after the last job", NULL), 2;
    if (chdir(state_dir) != 0) return refuse("the state directory", strerror(errno)), 2;

    pid_t pids[MAX_JOBS];
    int status = 0;
    for (unsigned long i = 0; i < n; i++) {
        job_index = i;
        pids[i] = fork();
        if (pids[i] == 0) run(&jobs[i]);
        if (pids[i] < 0) {
            char line[128];
            int k = snprintf(line, sizeof line, "%lu %d fork: %s\n", i, errno, strerror(errno));
            if (write(STDOUT_FILENO, line, (size_t)k) < 0) { /* the exit status says it failed */ }
            status = 1;
        }
    }
    for (unsigned long i = 0; i < n; i++) {
        int st;
        if (pids[i] <= 0) continue;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        status = 1;
        if (WIFSIGNALED(st)) {
            char line[128];
            int k = snprintf(line, sizeof line, "%lu 0 killed by signal %d\n", i, WTERMSIG(st));
            if (write(STDOUT_FILENO, line, (size_t)k) < 0) { /* the exit status says it failed */ }
        }
    }
    return status;
}
