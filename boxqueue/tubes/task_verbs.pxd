# C declarations for Cython (see boxqueue/compiled.py): the engine's parts are one chain of
# extension types, so that each part's methods read the shared fields as C fields.

from boxqueue.tubes.consumers cimport Consumers


cdef class TaskVerbs(Consumers):
    pass
