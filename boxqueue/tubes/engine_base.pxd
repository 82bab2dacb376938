# C declarations for Cython (see boxqueue/compiled.py): the engine's task and tube types, so that
# this module's code typed with them reads their fields directly.

from boxqueue.spaces cimport msgpack_scan
from boxqueue.tubes.task cimport Layout, Task
from boxqueue.tubes.tube cimport Tube


cdef class QueueSpace:
    cdef public object space
    cdef public Layout layout
    cdef public object kind
    cdef public bint owned


cdef class EngineBase:
    # Every field the engine's parts share (see EngineBase.__init__), read as C fields. The parts
    # are one chain over it: Producers, Consumers, TaskVerbs and TubeRecords extension types (their
    # .pxd files), then Monitors and Streams (Python classes), then QueueEngine; what they set
    # beyond these goes to the __dict__.
    cdef public object catalog
    cdef public object committer
    cdef public object kinds
    cdef public object tubes
    cdef public object _where
    cdef public object _held
    cdef public object _owned
    cdef public object _checked
    cdef public object _known
    cdef public object _records
    cdef public long long _last_created
    cdef public object _nursery
    cdef public object _recovered
    cdef public object hooks
    cdef public object _random
    cdef bytes _random_pool
    cdef Py_ssize_t _random_at
    cdef public object _upserting
    cdef public object tallies
    cdef public object forgotten
    cdef dict __dict__

    # The calls the parts make on every request: C calls from compiled code (still callable, and
    # overridable, from Python).
    cpdef QueueSpace queue_space(self, object space_id)
    cpdef Tube _tube(self, object queue_space, object name)
    cpdef Tube existing_tube(self, object space_id, object name)
    cpdef tuple find(self, object space_id, object task_id)
    cpdef tuple owned(self, object space_id, object task_id, object consumer, object verb)
    cpdef _add(self, Tube tube, Task task)
    cpdef dict _where_in(self, object space_id)
    cpdef _remove(self, Tube tube, Task task)
    cpdef _enter(self, Tube tube, Task task)
    cpdef _enter_many(self, Tube tube, list tasks)
    cpdef _leave_many(self, Tube tube, list tasks)
    cpdef _remove_many(self, Tube tube, list tasks)
    cpdef _leave(self, Tube tube, Task task)
    cpdef long long _next_created(self)
    cpdef str new_id(self, long long created)
    cdef object _random_bits(self)
    cpdef _delete(self, object queue_space, Tube tube, Task task, tuple counters=*)
    cpdef _place_inserted(self, object queue_space, Tube tube, list tasks, list raws)
    cpdef _tally(self, Tube tube, object old, object new, bint expired=*)
    cpdef _count_tally(self, Tube tube, Py_ssize_t which, Py_ssize_t count)
    cpdef _tally_changed(self, Tube tube, list done_changes)
    cpdef _tally_deleted(self, Tube tube, list deleted, bint expired)
    cpdef _notify(self, Tube tube, object task_id, object old, object new, object raw)


cdef class _Deleted:
    cdef EngineBase engine
    cdef Tube tube
    cdef Task task
    cdef tuple counters
    cdef object later


cdef class _Changed:
    cdef EngineBase engine
    cdef Tube tube
    cdef Task task
    cdef object counter
    cdef object before
    cdef object header
    cdef object old_status
    cdef object new_status
    cdef object after
    cdef object later
