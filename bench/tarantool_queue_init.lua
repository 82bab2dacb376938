-- Reference server for bench/queue_cycle.py: a real Tarantool running tarantool/queue (the
-- module is loaded from BENCH_QUEUE_DIR through package.path, never copied here) with a
-- `fifottl` tube `t`, called as queue.tube.t:put/take/ack. Space 512 "bench" is there for the
-- readiness probe iproto_load's Server makes.
--
-- Settings from the environment (queue_cycle.py sets them): BENCH_PORT, BENCH_WAL_MODE,
-- BENCH_WORK_DIR, BENCH_MEMTX_MEMORY as in tarantool_init.lua, and BENCH_QUEUE_DIR, the folder
-- holding queue/init.lua.

local port = os.getenv('BENCH_PORT')
assert(port ~= nil and port ~= '', 'BENCH_PORT is not set')
local queue_dir = os.getenv('BENCH_QUEUE_DIR')
assert(queue_dir ~= nil and queue_dir ~= '', 'BENCH_QUEUE_DIR is not set')

box.cfg{
    work_dir = os.getenv('BENCH_WORK_DIR') or '.',
    wal_mode = os.getenv('BENCH_WAL_MODE') or 'write',
    memtx_memory = tonumber(os.getenv('BENCH_MEMTX_MEMORY') or 256 * 1024 * 1024),
    checkpoint_interval = 0,
    log_level = 5,
}

-- First, so it gets id 512 before the queue module makes its own spaces (an explicit id would
-- not move 2.6's id counter, and the module's next space would collide with it).
local space = box.schema.space.create('bench', {if_not_exists = true})
assert(space.id == 512, 'the probe space must be 512')
space:create_index('primary', {type = 'TREE', parts = {{field = 1, type = 'unsigned'}}, if_not_exists = true})

package.path = queue_dir .. '/?.lua;' .. queue_dir .. '/?/init.lua;' .. package.path
queue = require('queue')  -- global: CALL reaches queue.tube.t:put and friends
queue.create_tube('t', 'fifottl', {if_not_exists = true})

box.schema.user.grant('guest', 'read,write,execute', 'universe', nil, {if_not_exists = true})

box.cfg{listen = '127.0.0.1:' .. port}
