"""The fault-injection suite (issue 34), in the manner of Jepsen: a replica set in network
namespaces, clients recording every answer, nemeses one at a time, checkers over the history.

Run it as root on a machine with ``ip netns``, ``nft``, ``tc`` and tmpfs mounts: ``make test``
runs the short form (``test_short_form.py``: a fixed seed, a random one, the negative control),
``make faults`` the long one (``runner.py``; ``FAULTS_RUNS``, ``FAULTS_SEED``, ``FAULTS_CONTROL``,
``FAULTS_DIR``). Elsewhere both skip, saying why.

The pieces: ``netns.py`` (namespaces, partitions, slow links), ``disk.py`` (a member's small
disk), ``cluster.py`` (etcd and the members in their namespaces), ``workloads/`` (the clients),
``outcomes.py`` (what each answer means: ok, fail or unknown), ``history.py``, ``checkers.py`` and
``linearizability.py`` (the checkers), ``nemeses.py``, ``failover.py`` (failover times) and
``runner.py`` (a run, start to verdicts). A run keeps each process's log and the history
(``history.jsonl``, one operation a line) in its directory.
"""
