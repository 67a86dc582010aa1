#ifndef RINGBUF_H
#define RINGBUF_H

#include <stddef.h>

/* A bounded FIFO queue of ints stored in a fixed array that wraps around. */
typedef struct {
    int *items;
    size_t capacity;
    size_t head;  /* index of the oldest item */
    size_t count; /* number of items stored */
} ringbuf;

/* 0 on success; -1 if capacity is 0 or memory is exhausted. */
int rb_init(ringbuf *rb, size_t capacity);
void rb_free(ringbuf *rb);

/* Append value. 0 on success; -1 (and no change) when the buffer is full. */
int rb_push(ringbuf *rb, int value);
/* Remove the oldest value into *out. 0 on success; -1 when the buffer is empty. */
int rb_pop(ringbuf *rb, int *out);
/* Read the oldest value without removing it. 0 on success; -1 when empty. */
int rb_peek(const ringbuf *rb, int *out);

size_t rb_size(const ringbuf *rb);
int rb_is_full(const ringbuf *rb);

#endif
