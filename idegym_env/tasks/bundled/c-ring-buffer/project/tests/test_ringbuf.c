#include "harness.h"
#include "ringbuf.h"

static void new_buffer_is_empty(void) {
    ringbuf rb;
    int out;
    CHECK_EQ(0, rb_init(&rb, 4));
    CHECK_EQ(0, rb_size(&rb));
    CHECK_EQ(-1, rb_pop(&rb, &out));
    CHECK_EQ(-1, rb_peek(&rb, &out));
    rb_free(&rb);
}

static void zero_capacity_is_rejected(void) {
    ringbuf rb;
    CHECK_EQ(-1, rb_init(&rb, 0));
}

static void pops_in_fifo_order(void) {
    ringbuf rb;
    int out;
    rb_init(&rb, 4);
    for (int i = 1; i <= 3; i++) CHECK_EQ(0, rb_push(&rb, i * 10));
    for (int i = 1; i <= 3; i++) {
        CHECK_EQ(0, rb_pop(&rb, &out));
        CHECK_EQ(i * 10, out);
    }
    CHECK_EQ(0, rb_size(&rb));
    rb_free(&rb);
}

static void wraps_around(void) {
    ringbuf rb;
    int out;
    rb_init(&rb, 3);
    rb_push(&rb, 1);
    rb_push(&rb, 2);
    rb_pop(&rb, &out);
    rb_pop(&rb, &out);
    for (int i = 3; i <= 5; i++) CHECK_EQ(0, rb_push(&rb, i));
    for (int i = 3; i <= 5; i++) {
        CHECK_EQ(0, rb_pop(&rb, &out));
        CHECK_EQ(i, out);
    }
    rb_free(&rb);
}

static void peek_does_not_remove(void) {
    ringbuf rb;
    int out = 0;
    rb_init(&rb, 2);
    rb_push(&rb, 7);
    CHECK_EQ(0, rb_peek(&rb, &out));
    CHECK_EQ(7, out);
    CHECK_EQ(1, rb_size(&rb));
    rb_free(&rb);
}

static void push_on_full_fails(void) {
    ringbuf rb;
    rb_init(&rb, 2);
    CHECK_EQ(0, rb_push(&rb, 1));
    CHECK_EQ(0, rb_push(&rb, 2));
    CHECK(rb_is_full(&rb));
    CHECK_EQ(-1, rb_push(&rb, 3));
    rb_free(&rb);
}

static void size_never_exceeds_capacity(void) {
    ringbuf rb;
    rb_init(&rb, 3);
    for (int i = 0; i < 10; i++) rb_push(&rb, i);
    CHECK_EQ(3, rb_size(&rb));
    CHECK(rb_is_full(&rb));
    rb_free(&rb);
}

static void full_buffer_keeps_oldest_items(void) {
    ringbuf rb;
    int out;
    rb_init(&rb, 2);
    rb_push(&rb, 1);
    rb_push(&rb, 2);
    rb_push(&rb, 3);
    CHECK_EQ(0, rb_pop(&rb, &out));
    CHECK_EQ(1, out);
    CHECK_EQ(0, rb_pop(&rb, &out));
    CHECK_EQ(2, out);
    CHECK_EQ(-1, rb_pop(&rb, &out));
    rb_free(&rb);
}

int main(int argc, char **argv) {
    static const struct test_case cases[] = {
        {"new_buffer_is_empty", new_buffer_is_empty},
        {"zero_capacity_is_rejected", zero_capacity_is_rejected},
        {"pops_in_fifo_order", pops_in_fifo_order},
        {"wraps_around", wraps_around},
        {"peek_does_not_remove", peek_does_not_remove},
        {"push_on_full_fails", push_on_full_fails},
        {"size_never_exceeds_capacity", size_never_exceeds_capacity},
        {"full_buffer_keeps_oldest_items", full_buffer_keeps_oldest_items},
    };
    return run_tests("ringbuf", cases, sizeof cases / sizeof cases[0], argc > 1 ? argv[1] : "test-results.xml");
}
