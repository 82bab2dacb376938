# C declarations of space.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cimport boxqueue.storage.keys as keys
from boxqueue.spaces cimport msgpack_scan
cdef class Index:
    cdef public object defn
    cdef public object space
    cdef public object iid
    cdef public object name
    cdef public bint is_hash
    cdef public bint unique
    cdef public object parts
    cdef public tuple fieldnos
    cdef Py_ssize_t _last_field
    cdef public Py_ssize_t part_count
    cdef public bint has_nullable
    cdef tuple _accepts
    cdef public object fast_key
    cdef public object db
    cdef public bint in_memory

    cpdef list key_of(self, object fields)
    cpdef tuple entry_key(self, object fields, object pk_encoded)
    cpdef check_key(self, object key, object exact)


cdef class Space


cdef class _FieldCheck:
    cdef Py_ssize_t fieldno
    cdef int code
    cdef object accepts
    cdef str tname
    cdef bint nullable


cdef class _ReplaceOnly:
    cdef Space space
    cdef bytes pk_stored
    cdef bytes raw


cdef class _ReplaceMany:
    cdef Space space
    cdef list pks
    cdef list raws


cdef class _DeleteMany:
    cdef Space space
    cdef list pks


cdef class Space:
    cdef public object storage
    cdef public object committer
    cdef public dict indexes
    cdef public dict index_by_name
    cdef public bint dropped
    cdef public object defn
    cdef public object id
    cdef public object name
    cdef public dict field_names
    cdef public Index primary
    cdef public list secondaries
    cdef public object owned_by
    cdef public bint memory_indexes
    cdef public object views
    cdef list _checks
    cdef Py_ssize_t _field_count

    cpdef list select(self, object iid, object iterator, object key, object offset=*, object limit=*, object txn=*)
    cpdef Index _primary(self)
    cpdef Index index(self, object iid)
    cpdef _check_alive(self)
    cpdef object _find(self, object txn, Index index, object encoded)
    cpdef object _locate(self, object txn, Index index, object encoded)
    cpdef check_tuple(self, object fields, Py_ssize_t count=*)
    cpdef object _rewrite_head(self, object txn, bytes encoded, list key, list head, object head_key)
    cpdef list _entries(self, object fields, object pk)
    cpdef _check_unique(self, object txn, list entries, object pk_stored, object old_entries=*)
    cpdef _store(self, object txn, object raw, list new_entries, object old_entries)
    cpdef tuple _changed_entries(self, list old_fields, list new_fields, object pk, object pk_stored)
    cpdef bytes _rewrite(self, object txn, object pk_stored, list fields, list new_fields, object new_raw)
