# C declarations of tube.py for Cython (compiled from its .py; see boxqueue/compiled.py).
# A tube and a task are C structs for the engine's compiled modules: code typed with them reads
# and writes their fields directly.

from boxqueue.tubes.task cimport Task


cdef class Tube:
    cdef public object space_id
    cdef public object name
    cdef public object kind
    cdef public object tasks
    cdef public object ready
    cdef public object buried
    cdef public object timeline
    cdef public object counts
    cdef public object stats
    cdef public object waiters
    cdef public object claims
    cdef public object claim_times
    cdef public object options
    cdef public object limit
    cdef public object by_expiry
    cdef public object monitor_wakeup
    cdef public object monitor_until
    cdef public object monitor_running
    cdef public object unique_lock
    cdef public object pending
    cdef public object dropped
    cdef public object tally
    cdef public object busy
    cdef public object last_number
