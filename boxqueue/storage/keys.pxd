# C declarations of keys.py for Cython (compiled from its .py; see boxqueue/compiled.py).

cpdef bytes uint_key(unsigned long long v)
cpdef bytes encode_part(object value)
cpdef object encode_unsigned_key(object value)
cpdef object encode_string_key(object value)
cpdef bytes encode(object parts)
cpdef bytes stored_form(bytes key)
