/* The judge's driver for the ring buffer: the tests (test_ringbuf.py) call the functions of
 * src/ringbuf.c through it, one request a line. Buffers are named by their index. */
#include "judge_driver.h"
#include "ringbuf.h"

#define MAX_BUFFERS 64

static ringbuf buffers[MAX_BUFFERS];
static int used[MAX_BUFFERS];

static ringbuf *buffer(const jd_request *r) {
    long long i = jd_int(r, 0);
    if (i < 0 || i >= MAX_BUFFERS || !used[i]) {
        jd_err("ValueError", "no such buffer");
        return NULL;
    }
    return &buffers[i];
}

static void pair(int rc, int value) {
    jd_begin();
    jd_w_raw("[");
    jd_w_int(rc);
    jd_w_raw(",");
    jd_w_int(value);
    jd_w_raw("]");
    jd_end();
}

int main(void) {
    jd_request req = {0};
    while (jd_next(&req)) {
        ringbuf *rb;
        int out = 0;
        if (jd_op(&req, "new")) {
            int i = 0;
            while (i < MAX_BUFFERS && used[i]) i++;
            if (i == MAX_BUFFERS) { jd_err("ValueError", "too many buffers"); continue; }
            int rc = rb_init(&buffers[i], (size_t)jd_int(&req, 0));
            used[i] = rc == 0;
            pair(rc, rc == 0 ? i : -1);
            continue;
        }
        if (!(rb = buffer(&req))) continue;
        if (jd_op(&req, "push")) jd_ok_int(rb_push(rb, (int)jd_int(&req, 1)));
        else if (jd_op(&req, "pop")) { int rc = rb_pop(rb, &out); pair(rc, out); }
        else if (jd_op(&req, "peek")) { int rc = rb_peek(rb, &out); pair(rc, out); }
        else if (jd_op(&req, "size")) jd_ok_int((long long)rb_size(rb));
        else if (jd_op(&req, "is_full")) jd_ok_bool(rb_is_full(rb));
        else if (jd_op(&req, "free")) { rb_free(rb); used[jd_int(&req, 0)] = 0; jd_ok_null(); }
        else jd_unknown(&req);
    }
    jd_release(&req);
    return 0;
}
