# C declarations of write_queue.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cdef class Write:
    cdef public object fn
    cdef public object after_commit
    cdef public bint exclusive
    cdef public object result
    cdef public object error
    cdef public object done
    cdef public unsigned long long lsn
    cdef public unsigned long long term
    cdef public bint local

cdef class WriteQueue:
    cdef public list pending
    cdef public bint closed
    cdef public object wakeup
    cdef public object rejections

    cpdef list next_batch(self, Py_ssize_t max_batch)
    cpdef bint apply(self, object txn, list batch)
    cpdef void finish(self, list batch)
