# C declarations of codec.py for Cython (the module is compiled from its .py; see
# boxqueue/compiled.py). Other compiled modules cimport these to reach the fields directly.

cimport boxqueue.spaces.msgpack_scan as msgpack_scan

cdef class Request:
    cdef public unsigned long long type
    cdef public unsigned long long sync
    cdef public unsigned long long schema_version
    cdef public unsigned long long stream_id
    cdef public object tuple_raw
    cdef public bint typed
    cdef public unsigned long long present
    cdef public long long space_id
    cdef public long long index_id
    cdef public long long limit
    cdef public long long offset
    cdef public long long iterator
    cdef public long long index_base
    cdef public object key
    cdef public object tuple
    cdef public object ops
    cdef public object function_name
    cdef public object expr
    cdef object _body


cdef class BadRequest:
    cdef public unsigned long long sync
    cdef public object error


cdef class RequestDecoder:
    cdef public Py_ssize_t max_packet
    cdef bytes _buf
    cdef Py_ssize_t _pos
    cdef list _more
    cdef Py_ssize_t _more_len
    cdef Py_ssize_t _p
    cdef Py_ssize_t _end
    cdef public unsigned long long packets

    cdef bint _gather(self, Py_ssize_t size)
    cpdef object next_event(self)
    cdef Request _decode_simple(self, Py_ssize_t start)
    cdef bint _decode_body(self, Request request)
    cdef list _array(self)
    cdef object _value(self)


cpdef void write_response(bytearray out, unsigned long long sync, unsigned long long schema_version,
                          bytes body, unsigned long long code=*)
cpdef void write_tuples_response(bytearray out, unsigned long long sync,
                                 unsigned long long schema_version, list tuples)
