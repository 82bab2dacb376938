"""The parts of a running server that the metrics read, filled in as the server starts them.

The metrics listener starts first (so it can say "recovering" while the engine rebuilds its tubes
from LMDB); each part is None until the server has it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from boxqueue.measures import Gauges, RequestMeter

STARTING = "starting"
RECOVERING = "recovering"
READY = "ready"
STOPPING = "stopping"

# The APIs in the order the page shows them.
APIS = ("iproto", "console", "deckard", "zaqar", "sonya")


@dataclass
class Observed:
    started: float = field(default_factory=time.time)  # unix time of the process start
    state: str = STARTING
    storage: Any = None  # storage.environment.Storage
    committer: Any = None  # storage.commit.GroupCommitter
    catalog: Any = None  # spaces.catalog.Catalog
    engine: Any = None  # tubes.engine.QueueEngine
    iproto: Any = None  # boxqueue.iproto.server.IprotoServer
    stats: Any = None  # boxqueue.iproto.request_stats.RequestStats
    lua: Any = None  # lua_box.engine.LuaEngine
    broadcast: Any = None  # tubes.broadcast.Broadcast
    meters: dict[str, RequestMeter] = field(default_factory=dict)  # console, deckard, zaqar, sonya
    gauges: Gauges = field(default_factory=Gauges)  # figures other parts plug in (a WAL's, say)
    replica: Any = None  # replication.node.ReplicaNode, in a replica set

    def meter(self, api: str) -> RequestMeter:
        """The meter of an API, made on first use."""
        found = self.meters.get(api)
        if found is None:
            found = self.meters[api] = RequestMeter(api)
        return found

    @property
    def recovering(self) -> bool:
        return self.state in (STARTING, RECOVERING)
