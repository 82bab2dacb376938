# C declarations of write_gate.py for Cython (compiled from its .py; see boxqueue/compiled.py).

from boxqueue.spaces.space cimport Space


cdef class WriteGate:
    cdef public object access
    cdef public object committer
    cdef public object read_only_reason

    cpdef void check_writable(self, bint session_read_only)
    cpdef void check_space_write(self, object user, Space space, bint session_read_only)
