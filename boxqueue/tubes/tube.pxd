# C declarations of tube.py for Cython (compiled from its .py; see boxqueue/compiled.py).
# A tube and a task are C structs for the engine's compiled modules: code typed with them reads
# and writes their fields directly.

from boxqueue.tubes.ordering cimport Ordering
from boxqueue.tubes.task cimport Task


cdef class Tube:
    cdef public object space_id
    cdef public object name
    cdef public object kind
    cdef public dict tasks
    cdef public Ordering ready
    cdef public Ordering buried
    cdef public Ordering timeline
    cdef public dict counts
    cdef public dict stats
    cdef public object waiters
    cdef public dict claims
    cdef public Ordering claim_times
    cdef public object options
    cdef public object limit
    cdef public Ordering by_expiry
    cdef public object monitor_wakeup
    cdef public object monitor_until
    cdef public object monitor_running
    cdef public object unique_lock
    cdef public object pending
    cdef public object dropped
    cdef public object tally
    cdef public object busy
    cdef public object last_number

    # What the engine calls on every change of a task: C calls from its compiled modules.
    cpdef enter(self, Task task)
    cpdef enter_many(self, list tasks)
    cpdef leave_many(self, list tasks)
    cpdef leave(self, Task task)
    cpdef count(self, str counter, by=*)
