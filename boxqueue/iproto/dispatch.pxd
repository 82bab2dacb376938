# C declarations of dispatch.py for Cython (compiled from its .py; see boxqueue/compiled.py).

from boxqueue.iproto.outbox cimport Outbox
from boxqueue.iproto.codec cimport BadRequest, Request, RequestDecoder, write_response, write_tuples_response
from boxqueue.iproto.session cimport Session
from boxqueue.spaces.procedures cimport ProcedureEntry, Procedures
from boxqueue.spaces.space cimport Space
from boxqueue.spaces.write_gate cimport WriteGate


cdef class Dispatcher


cdef class _WriteReply:
    cdef Dispatcher dispatcher
    cdef unsigned long long sync
    cdef Outbox outbox
    cdef bint returns_tuple
    cdef unsigned long long rtype


cdef class _CallReply:
    cdef Dispatcher dispatcher
    cdef unsigned long long sync
    cdef Outbox outbox
    cdef str name
    cdef bint call16


cdef class Dispatcher:
    cdef public object catalog
    cdef public object stats
    cdef public object access
    cdef public WriteGate writes
    cdef public object replication
    cdef public Procedures procedures
    cdef public object eval_handler
    cdef list _by_type
    cdef dict _spaces

    cpdef object handle(self, Session session, Request request, Outbox outbox)
    cpdef tuple handle_all(self, Session session, RequestDecoder decoder, Outbox outbox, Py_ssize_t room)
    cdef void _reply_later(self, unsigned long long sync, object later, Outbox outbox, str name, bint call16)
    cdef void _submit(self, object write, unsigned long long sync, Outbox outbox, unsigned long long rtype)
    cdef object _space_of(self, dict body)
    cdef object _index_id(self, object space, dict body)
    cdef object _writable(self, Session session, Request request)
    cdef bytes _auth(self, Session session, Request request)
    cdef object _select(self, Session session, Request request)
    cdef bytes _select_checked(self, Session session, dict body)
    cdef void _put(self, Session session, Request request, str mode, unsigned long long sync, Outbox outbox)
    cdef list _ops(self, Space space, dict body, int key)
    cdef void _update(self, Session session, Request request, unsigned long long sync, Outbox outbox)
    cdef void _delete(self, Session session, Request request, unsigned long long sync, Outbox outbox)
    cdef void _upsert(self, Session session, Request request, unsigned long long sync, Outbox outbox)
    cdef object _procedure_call(self, Session session, Request request, bint call16,
                                unsigned long long sync, Outbox outbox)
    cdef object _eval(self, Session session, Request request)
    cdef void _replication_request(self, Session session, Request request)
