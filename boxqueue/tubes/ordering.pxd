# C declarations of ordering.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cdef class Ordering:
    cdef list _lists
    cdef list _maxes
    cdef Py_ssize_t _len
