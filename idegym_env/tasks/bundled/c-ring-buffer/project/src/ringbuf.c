#include "ringbuf.h"

#include <stdlib.h>

int rb_init(ringbuf *rb, size_t capacity) {
    if (capacity == 0) {
        return -1;
    }
    rb->items = malloc(capacity * sizeof *rb->items);
    if (rb->items == NULL) {
        return -1;
    }
    rb->capacity = capacity;
    rb->head = 0;
    rb->count = 0;
    return 0;
}

void rb_free(ringbuf *rb) {
    free(rb->items);
    rb->items = NULL;
    rb->capacity = rb->head = rb->count = 0;
}

int rb_push(ringbuf *rb, int value) {
    if (rb->count > rb->capacity) {
        return -1;
    }
    rb->items[(rb->head + rb->count) % rb->capacity] = value;
    rb->count++;
    return 0;
}

int rb_pop(ringbuf *rb, int *out) {
    if (rb->count == 0) {
        return -1;
    }
    *out = rb->items[rb->head];
    rb->head = (rb->head + 1) % rb->capacity;
    rb->count--;
    return 0;
}

int rb_peek(const ringbuf *rb, int *out) {
    if (rb->count == 0) {
        return -1;
    }
    *out = rb->items[rb->head];
    return 0;
}

size_t rb_size(const ringbuf *rb) {
    return rb->count;
}

int rb_is_full(const ringbuf *rb) {
    return rb->count == rb->capacity;
}
