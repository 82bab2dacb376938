# C declarations for Cython (see boxqueue/compiled.py): the engine's parts are one chain of
# extension types, so that each part's methods read the shared fields as C fields.

from boxqueue.tubes.engine_base cimport EngineBase


cdef class Producers(EngineBase):
    pass
