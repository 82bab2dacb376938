# C declarations for Cython (see boxqueue/compiled.py): box.queue's procedures as an extension
# type, so that a call's checks and conversions are C calls.

from boxqueue.tubes.engine_base cimport EngineBase
from boxqueue.tubes.task cimport rettask


cdef class BoxQueue:
    cdef public EngineBase engine
    cdef public object kind
    cdef public object _bound_sessions
    cdef public object max_waiting_takes
    cdef public object _waiting
    cdef public object _restart_checked
    cdef public object standby
    cdef dict __dict__

    cpdef object _space(self, object value, str fn)
    cpdef object _returned(self, object space_id)
    cpdef tuple _put_args(self, str fn, object delay, object ttl, object ttr, object pri)
