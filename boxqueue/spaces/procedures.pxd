# C declarations of procedures.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cdef class ProcedureEntry:
    cdef public str name
    cdef public object fn
    cdef public bint is_async
    cdef public bint writes
    cdef public object id
    cdef public Py_ssize_t max_args

    cpdef object invoke(self, object ctx, object args)


cdef class Procedures:
    cdef dict _entries
    cdef list _resolvers
    cdef dict _function_ids

    cpdef ProcedureEntry resolve(self, str name)
