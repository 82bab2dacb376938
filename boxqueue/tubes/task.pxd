# C declarations of task.py for Cython (compiled from its .py; see boxqueue/compiled.py).
# A task is a C struct for the engine's compiled modules: they read and write its fields directly.

from boxqueue.spaces cimport msgpack_scan


cdef class Task:
    cdef public object id
    cdef public object tube
    cdef public object status
    cdef public long long event  # C integers: a queued task's times are its own (no int objects)
    cdef public object ipri
    cdef public object pri
    cdef public object cid
    cdef public long long created
    cdef public object ttl
    cdef public object ttr
    cdef public object cbury
    cdef public object ctaken
    cdef public object attrs

    cpdef list header(self)
    cpdef list snapshot(self)


cdef class Layout:
    cdef public str name
    cdef public int header
    cdef public int data_at
    cdef public bint by_tube

    cpdef list key(self, Task task)


cpdef object rettask(bytes raw, Py_ssize_t data_at=*)
