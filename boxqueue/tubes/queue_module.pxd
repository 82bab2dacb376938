# C declarations of queue_module.py for Cython (compiled from its .py; see boxqueue/compiled.py):
# the module's task is made from a stored tuple's bytes in C, on every answer of the module's calls.

from boxqueue.spaces cimport msgpack_scan


cpdef object module_task(bytes raw, object status=*)
cdef bytes _module_id(bytes packed)
