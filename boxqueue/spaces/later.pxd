# C declarations of later.py for Cython (compiled from its .py; see boxqueue/compiled.py): a
# Later's fields are C fields (one is made and settled for every write).

cdef class _Later:
    cdef bint _settled
    cdef object _value
    cdef object _error
    cdef object _callback
    cdef list _maps
    cdef bint _consumed
