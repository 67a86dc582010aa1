/* idegym-as-user UID GID GROUPS PROGRAM [ARG...]
 *
 * Become UID:GID with the supplementary GROUPS (comma-separated gids, or "-" for none) — real,
 * effective and saved ids alike, so no capability is left — then execute PROGRAM (a path: no
 * PATH search) with the environment as given. What `setpriv --reuid --regid --groups` does for the
 * sandbox server's tools, as a small static binary: ~0.3 ms a call where setpriv's exec, dynamic
 * linking and option handling take ~1.3 (benchmarks/bash_roundtrip.py, "as-user helper" rows).
 * Exit 126 when a step fails (127 when PROGRAM does not exist), with the reason on stderr.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_GROUPS 1024

static int fail(const char *what) {
    fprintf(stderr, "idegym-as-user: %s: %s\n", what, strerror(errno));
    return 126;
}

static int number(const char *text, unsigned long *out) {
    char *end;
    errno = 0;
    *out = strtoul(text, &end, 10);
    return *text && !*end && !errno && *out <= 0xfffffffeUL;
}

int main(int argc, char **argv) {
    unsigned long uid, gid, one;
    gid_t groups[MAX_GROUPS];
    size_t n = 0;

    if (argc < 5 || !argv[4][0]) {
        fprintf(stderr, "usage: idegym-as-user UID GID GROUPS|- PROGRAM [ARG...]\n");
        return 126;
    }
    if (!number(argv[1], &uid) || !number(argv[2], &gid)) {
        errno = EINVAL;
        return fail("uid or gid");
    }
    if (strcmp(argv[3], "-") != 0) {
        for (char *item = strtok(argv[3], ","); item; item = strtok(NULL, ",")) {
            if (n == MAX_GROUPS || !number(item, &one)) {
                errno = EINVAL;
                return fail("groups");
            }
            groups[n++] = (gid_t)one;
        }
    }
    if (setgroups(n, groups) != 0) return fail("setgroups");
    if (setresgid(gid, gid, gid) != 0) return fail("setresgid");
    if (setresuid(uid, uid, uid) != 0) return fail("setresuid");
    execv(argv[4], argv + 4);
    int code = errno == ENOENT ? 127 : 126;
    fail(argv[4]);
    return code;
}
