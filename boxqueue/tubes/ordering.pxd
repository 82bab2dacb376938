# C declarations of ordering.py for Cython (compiled from its .py; see boxqueue/compiled.py).

from boxqueue.tubes.task cimport Task

cdef class Ordering:
    cdef readonly int kind
    cdef list _lists
    cdef list _maxes
    cdef Py_ssize_t _len

    cpdef add(self, object key)
    cpdef extend(self, list keys)
    cpdef remove(self, object key)
    cpdef remove_many(self, list keys)
