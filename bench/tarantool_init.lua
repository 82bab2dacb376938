-- Reference server for bench/iproto_load.py: a real Tarantool with the same
-- schema as the boxqueue bench config (space 512 "bench", TREE primary key on
-- an unsigned field).
--
-- Settings come from the environment (iproto_load.py sets them):
--   BENCH_PORT          iproto port on 127.0.0.1 (required)
--   BENCH_WAL_MODE      fsync | write | none (default: write)
--   BENCH_WORK_DIR      snapshots, xlogs and the log go here (default: .)
--   BENCH_MEMTX_MEMORY  bytes of memtx arena (default: 256 MiB)
--
-- The listen socket is opened last, so a client that gets a greeting can use
-- the space and the guest grants straight away.

local port = os.getenv('BENCH_PORT')
assert(port ~= nil and port ~= '', 'BENCH_PORT is not set')

box.cfg{
    work_dir = os.getenv('BENCH_WORK_DIR') or '.',
    wal_mode = os.getenv('BENCH_WAL_MODE') or 'write',
    memtx_memory = tonumber(os.getenv('BENCH_MEMTX_MEMORY') or 256 * 1024 * 1024),
    checkpoint_interval = 0,
    log_level = 5,
}

local space = box.schema.space.create('bench', {
    id = 512,
    if_not_exists = true,
    format = {
        {name = 'id', type = 'unsigned'},
        {name = 'payload', type = 'string'},
    },
})
space:create_index('primary', {
    type = 'TREE',
    unique = true,
    parts = {{field = 1, type = 'unsigned'}},
    if_not_exists = true,
})

box.schema.user.grant('guest', 'read,write,execute', 'universe', nil, {if_not_exists = true})

box.cfg{listen = '127.0.0.1:' .. port}
