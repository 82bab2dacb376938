# C declarations of msgpack_scan.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cpdef Py_ssize_t skip(bytes buf, Py_ssize_t p, Py_ssize_t end) except -2
cpdef tuple array_start(bytes buf)
cpdef tuple fields_at(bytes buf, Py_ssize_t upto)
cpdef tuple head_replaced(bytes buf, Py_ssize_t upto, bytes head)
cpdef list leading_items(bytes buf, Py_ssize_t upto, object decode)
