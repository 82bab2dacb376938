# C declarations of outbox.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cdef class Outbox:
    cdef public bytearray out
    cdef public Py_ssize_t inflight
    cdef public Py_ssize_t max_inflight
    cdef public object sender_waiting
    cdef public object reader_waiting
    cdef public unsigned long long answers
    cdef public object sends
    cdef public object send_now
    cdef public bint send_queued

    cpdef void reply_later(self, bytes packet)
    cpdef void answered(self)
    cpdef void wake_sender(self)
    cpdef bytearray take(self)
