# C declarations for Cython (see boxqueue/compiled.py): the engine's parts are one chain of
# extension types, so that each part's methods read the shared fields as C fields.

from boxqueue.tubes.engine_base cimport EngineBase
from boxqueue.tubes.task cimport Task
from boxqueue.tubes.tube cimport Tube


cdef class Producers(EngineBase):
    cpdef Task _new_task(self, object queue_space, Tube tube, long long delay, object ttl, object ttr, object ipri,
                         object pri, object task_id, object attrs)
    cpdef list new_puts(self, object queue_space, Tube tube, list items)


cdef class _Inserted:
    cdef Producers engine
    cdef object queue_space
    cdef Tube tube
    cdef Task task
    cdef bytes raw
    cdef object counter
    cdef object later
