# C declarations of transitions.py for Cython (compiled from its .py; see boxqueue/compiled.py).

from boxqueue.tubes.task cimport Task


cdef class _HeldBy:
    cdef long long expires
    cdef long long grace
    cdef long long ttl
    cdef object holder
