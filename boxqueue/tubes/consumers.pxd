# C declarations for Cython (see boxqueue/compiled.py): the engine's task and tube types, so that
# this module's code typed with them reads their fields directly.

from boxqueue.tubes.task cimport Task
from boxqueue.tubes.tube cimport Tube

from boxqueue.tubes.producers cimport Producers


cdef class Consumers(Producers):
    pass


cdef class _Taken:
    cdef long long event
    cdef object consumer
