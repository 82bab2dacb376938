"""python-zaqarclient 3.0.1 (the last with the v1.1 client) through a whole queue's life.

Run with a venv holding ``python-zaqarclient==3.0.1`` (``make install`` makes one in
``.venv/zaqarclient``) against a running facade:
``python compat/zaqar_functional/zaqarclient_check.py http://127.0.0.1:8888 [TOKEN]``. With a
token the client is configured as for Zaqar behind Keystone (``backend = "keystone"``,
``os_auth_token``, no project: the token fixes it); for an ``https`` URL the CA comes from
``REQUESTS_CA_BUNDLE``. Exits non-zero on the first mismatch.
"""

import sys

from zaqarclient.queues import client

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8888"
token = sys.argv[2] if len(sys.argv) > 2 else None
if token is None:
    auth = {"backend": "noauth", "options": {"os_project_id": "cli"}}
else:
    auth = {"backend": "keystone", "options": {"os_auth_token": token}}
c = client.Client(url, version=1.1, conf={"auth_opts": auth})
q = c.queue("zaqarclient_check", metadata={"m": 1})
q.post([{"body": {"n": i}, "ttl": 120} for i in range(5)])
assert "zaqarclient_check" in [x.name for x in c.queues()]
assert q.metadata() == {"m": 1}
assert [m.body for m in q.messages(echo=True)] == [{"n": i} for i in range(5)]
claim = q.claim(ttl=60, grace=60, limit=2)
claimed = list(claim)
assert [m.body for m in claimed] == [{"n": 0}, {"n": 1}]
for m in claimed:
    m.delete()
claim.update(ttl=120)
claim.delete()
assert q.stats["messages"]["total"] == 3
assert [m.body for m in q.pop(2)] == [{"n": 2}, {"n": 3}]
left = [m._id for m in q.messages(echo=True)]
assert [m.body for m in q.messages(*left)] == [{"n": 4}]
q.delete()
print("python-zaqarclient: queue, metadata, post, list, claim, delete with claim, renew, release, stats, pop, "
      "get by ids, queue delete: all as expected")
