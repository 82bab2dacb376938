# C declarations of queue_module.py for Cython (compiled from its .py; see boxqueue/compiled.py):
# the module's calls reach its tubes, sessions and the engine in C, and its task is made from a
# stored tuple's bytes in C, on every answer.

from boxqueue.spaces cimport msgpack_scan
from boxqueue.tubes.box_queue cimport BoxQueue
from boxqueue.tubes.engine_base cimport EngineBase
from boxqueue.tubes.task cimport Task


cdef class ModuleTube:
    cdef public str name
    cdef public object space_id
    cdef public str type
    cdef public object ttl
    cdef public object ttr
    cdef public object pri
    cdef public object capacity


cdef class QueueModule:
    cdef public EngineBase engine
    cdef public BoxQueue box_queue
    cdef public object _give
    cdef public object _task_changed
    cdef public set _watched
    cdef public set _quiet
    cdef public object _changes
    cdef public object _changes_wakeup
    cdef public object kind
    cdef public dict _tubes
    cdef public dict _entries
    cdef public dict config
    cdef public object _session_ids
    cdef public dict _sessions
    cdef public dict _of_connection
    cdef public object _kept
    cdef public set _bound
    cdef dict __dict__

    cpdef object _session(self, object ctx)
    cpdef ModuleTube tube_named(self, str name)
    cpdef ModuleTube _tube(self, str name)
    cpdef Task _stored_task(self, ModuleTube mt, str key)
    cpdef Task _check_taken(self, ModuleTube mt, object task_id, object ctx)
    cpdef object _put_now(self, ModuleTube mt, object data, object options)


cpdef object module_task(bytes raw, object status=*)
cdef bytes _module_id(bytes packed)
cdef str _task_key(object task_id, int part)
cdef object _lua_or(object value, object default)
cdef object _seconds_us(object seconds)
cdef object _options(object opts)
cdef object _number_option(object opts, str name)
