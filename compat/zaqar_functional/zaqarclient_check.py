"""python-zaqarclient 3.0.1 (the last with the v1.1 client) through a whole queue's life.

Run with a venv holding ``python-zaqarclient==3.0.1`` against a running facade:
``python compat/zaqar_functional/zaqarclient_check.py http://127.0.0.1:8888``. Exits non-zero on
the first mismatch.
"""

import sys

from zaqarclient.queues import client

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8888"
c = client.Client(url, version=1.1, conf={"auth_opts": {"backend": "noauth", "options": {"os_project_id": "cli"}}})
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
