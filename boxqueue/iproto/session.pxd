# C declarations of session.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cdef class Session:
    cdef public object id
    cdef public object user
    cdef public str peer
    cdef public bint read_only
    cdef public bytes salt
    cdef list _on_disconnect
    cdef public bint closed
    cdef public object context
    cdef public object takeover
