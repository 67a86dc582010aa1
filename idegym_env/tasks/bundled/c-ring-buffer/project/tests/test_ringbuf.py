import unittest

from idegym_judge import subject

# src/ringbuf.c runs in the driver's process (tests/driver.c), not in this one: the judge.
DRIVER = "build/driver"


class RingBuffer:
    """One ring buffer in the driver."""

    def __init__(self, driver, capacity):
        self.driver = driver
        self.rc, self.id = driver.call("new", capacity)

    def __getattr__(self, op):
        return lambda *args: self.driver.call(op, self.id, *args)


class RingBufferTest(unittest.TestCase):
    def setUp(self):
        self.driver = subject.process([DRIVER])  # a fresh process for every test
        self.addCleanup(self.driver.close)

    def buffer(self, capacity):
        rb = RingBuffer(self.driver, capacity)
        self.assertEqual(rb.rc, 0, f"rb_init(capacity={capacity}) failed")
        return rb

    def test_new_buffer_is_empty(self):
        rb = self.buffer(4)
        self.assertEqual(rb.size(), 0)
        self.assertEqual(rb.pop()[0], -1)
        self.assertEqual(rb.peek()[0], -1)

    def test_zero_capacity_is_rejected(self):
        self.assertEqual(RingBuffer(self.driver, 0).rc, -1)

    def test_pops_in_fifo_order(self):
        rb = self.buffer(4)
        for i in range(1, 4):
            self.assertEqual(rb.push(i * 10), 0)
        for i in range(1, 4):
            self.assertEqual(rb.pop(), [0, i * 10])
        self.assertEqual(rb.size(), 0)

    def test_wraps_around(self):
        rb = self.buffer(3)
        rb.push(1)
        rb.push(2)
        rb.pop()
        rb.pop()
        for i in range(3, 6):
            self.assertEqual(rb.push(i), 0)
        for i in range(3, 6):
            self.assertEqual(rb.pop(), [0, i])

    def test_peek_does_not_remove(self):
        rb = self.buffer(2)
        rb.push(7)
        self.assertEqual(rb.peek(), [0, 7])
        self.assertEqual(rb.size(), 1)

    def test_push_on_full_fails(self):
        rb = self.buffer(2)
        self.assertEqual(rb.push(1), 0)
        self.assertEqual(rb.push(2), 0)
        self.assertIs(rb.is_full(), True)
        self.assertEqual(rb.push(3), -1)

    def test_size_never_exceeds_capacity(self):
        rb = self.buffer(3)
        for i in range(10):
            rb.push(i)
        self.assertEqual(rb.size(), 3)
        self.assertIs(rb.is_full(), True)

    def test_full_buffer_keeps_oldest_items(self):
        rb = self.buffer(2)
        for i in (1, 2, 3):
            rb.push(i)
        self.assertEqual(rb.pop(), [0, 1])
        self.assertEqual(rb.pop(), [0, 2])
        self.assertEqual(rb.pop()[0], -1)
