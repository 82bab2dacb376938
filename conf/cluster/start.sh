#!/bin/sh
# `make cluster`: etcd and the three members of conf/cluster/ on loopback, until Ctrl-C.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$root/.venv/bin"
data="$here/data"
mkdir -p "$data"
pids=""
stop() {
    trap - EXIT INT TERM
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "stopped; data and logs are in $data"
}
trap stop EXIT INT TERM
"$bin/etcd" --name demo --data-dir "$data/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster demo=http://127.0.0.1:2380 >"$data/etcd.log" 2>&1 &
pids="$!"
for i in 1 2 3; do
    "$bin/boxqueue" serve --config "$here/n$i.toml" >"$data/n$i.log" 2>&1 &
    pids="$pids $!"
done
sleep 3
cat <<TEXT
A replica set of three on loopback (etcd at 127.0.0.1:2379; logs in $data):
  member  iproto          console         Zaqar                  Sonya                  Deckard          metrics and /health
  n1      127.0.0.1:3301  127.0.0.1:3311  http://127.0.0.1:8881  http://127.0.0.1:8081  127.0.0.1:8181   http://127.0.0.1:9101
  n2      127.0.0.1:3302  127.0.0.1:3312  http://127.0.0.1:8882  http://127.0.0.1:8082  127.0.0.1:8182   http://127.0.0.1:9102
  n3      127.0.0.1:3303  127.0.0.1:3313  http://127.0.0.1:8883  http://127.0.0.1:8083  127.0.0.1:8183   http://127.0.0.1:9103
Who leads:   curl -s http://127.0.0.1:9101/health     (or /health/leader: 200 on the leader only)
A client that follows the leader:
  tarantool.MeshConnection(addrs=[{"host": "127.0.0.1", "port": p} for p in (3301, 3302, 3303)],
                           cluster_discovery_function="boxqueue.leader_uris")
Ctrl-C stops everything.
TEXT
wait
