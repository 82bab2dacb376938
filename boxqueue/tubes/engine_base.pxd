# C declarations for Cython (see boxqueue/compiled.py): the engine's task and tube types, so that
# this module's code typed with them reads their fields directly.

from boxqueue.tubes.task cimport Task
from boxqueue.tubes.tube cimport Tube


cdef class EngineBase:
    # Every field the engine's parts share (see EngineBase.__init__): EngineBase's own methods
    # read them as C fields. The parts (Producers, Consumers, ...) and QueueEngine, which composes
    # them, stay Python classes over it; what they set beyond these goes to the __dict__.
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
    cdef public object _last_created
    cdef public object _nursery
    cdef public object _recovered
    cdef public object hooks
    cdef public object _random
    cdef public object _upserting
    cdef public object tallies
    cdef public object forgotten
    cdef dict __dict__
