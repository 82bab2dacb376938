#!/usr/bin/env bash
# Real OpenStack Zaqar 21.0.3 (v1.1 API enabled, Redis message and management stores, no auth)
# under gunicorn, for bench/zaqar_cycle.py --url. Runs in the foreground; SIGTERM or Ctrl-C stops
# gunicorn and redis-server and removes the temporary directory.
#
#   bench/real_zaqar.sh [PORT [REDIS_PORT]]     # defaults: 8888, a free loopback port
#
# Environment: ZAQAR_VENV (default .venv-zaqar beside bench/, created with zaqar==21.0.3, redis
# and gunicorn if missing), WORKERS (2), REDIS_ARGS (extra redis-server arguments; Redis keeps
# its built-in defaults otherwise: RDB snapshots, no append-only file).
# Needs redis-server on PATH (Debian: apt-get install -y redis-server).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
port=${1:-8888}
venv=${ZAQAR_VENV:-$root/.venv-zaqar}
if [ ! -x "$venv/bin/gunicorn" ] || ! "$venv/bin/python" -c 'import zaqar, redis' 2>/dev/null; then
    [ -x "$venv/bin/python" ] || python3.11 -m venv "$venv"
    "$venv/bin/pip" install -q 'zaqar==21.0.3' redis gunicorn
fi
redis_port=${2:-$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
tmp=$(mktemp -d)
# wsgi/app.py reads only oslo.config's default files; the first one looked for is ~/.zaqar/zaqar.conf.
mkdir "$tmp/.zaqar"
cat > "$tmp/.zaqar/zaqar.conf" <<EOF
[DEFAULT]
enable_deprecated_api_versions = 1.1
auth_strategy =
pooling = False

[drivers]
transport = wsgi
message_store = redis
management_store = redis

[drivers:message_store:redis]
uri = redis://127.0.0.1:$redis_port

[drivers:management_store:redis]
uri = redis://127.0.0.1:$redis_port
EOF

pids=()
stop() {
    trap - INT TERM EXIT
    [ ${#pids[@]} -gt 0 ] && kill -TERM "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap 'stop; exit 0' INT TERM
trap stop EXIT

# shellcheck disable=SC2086
redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$tmp" --logfile "$tmp/redis.log" ${REDIS_ARGS:-} &
pids+=($!)
for _ in $(seq 50); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
done
cd "$tmp"
HOME=$tmp "$venv/bin/gunicorn" --workers "${WORKERS:-2}" --bind "127.0.0.1:$port" \
    zaqar.transport.wsgi.app:app &
pids+=($!)
echo "real_zaqar: redis on 127.0.0.1:$redis_port, zaqar on http://127.0.0.1:$port (config $tmp/.zaqar/zaqar.conf)" >&2
wait -n   # either one exiting by itself stops the other
