-- Drives a server with Tarantool's own net.box (run by the `tarantool` binary as a plain client:
-- no box.cfg) and prints one JSON object, a field per step; tests/integration/test_netbox_connector.py
-- checks them. Usage: tarantool client.lua PORT dml|boxqueue (box.queue, tarantool/queue, DDL as admin)
local net_box = require('net.box')
local json = require('json')
local fiber = require('fiber')

local port, part = arg[1], arg[2]

-- Tuples become plain arrays so that json can print them.
local function plain(value)
    if box.tuple.is(value) then
        return value:totable()
    end
    if type(value) == 'table' then
        local copy = {}
        for k, v in pairs(value) do
            copy[k] = plain(v)
        end
        return setmetatable(copy, getmetatable(value))
    end
    return value
end

local out = {}

-- Each step's answer as {ok = [values...]}, or {error = message, code = code}.
local function step(name, fn)
    local answer = {pcall(fn)}
    if answer[1] then
        local values = {}
        for i = 2, table.maxn(answer) do
            values[i - 1] = plain(answer[i])
        end
        out[name] = {ok = setmetatable(values, json.array_mt)}
    else
        local err = answer[2]
        if type(err) == 'cdata' or type(err) == 'table' then
            out[name] = {error = err.message, code = err.code}
        else
            out[name] = {error = tostring(err)}
        end
    end
end

local function wait_for(predicate, timeout)
    local deadline = fiber.clock() + timeout
    while not predicate() do
        if fiber.clock() > deadline then
            return false
        end
        fiber.sleep(0.02)
    end
    return true
end

local conn = net_box.connect('127.0.0.1:' .. port, {wait_connected = 10})
step('connected', function() return conn:is_connected(), conn.error end)

if part == 'dml' then
    -- the schema net.box loaded at connect (_vspace, _vindex)
    step('schema', function()
        local test = conn.space.test
        local names = {}
        for _, field in ipairs(test:format()) do
            table.insert(names, field.name)
        end
        local pair = conn.space.multi.index.pair
        return test.id, test.index.primary.id, test.index.name.id, test.index.name.unique,
               names, pair.parts[1].fieldno, pair.parts[2].type, conn.space[513].name
    end)
    step('ping', function() return conn:ping() end)
    step('insert', function() return conn.space.test:insert({900, 'netbox'}) end)
    step('insert_by_id', function() return conn.space[512]:insert({902, 'by id'}) end)
    step('select', function() return conn.space.test:select({900}) end)
    step('select_by_name_index', function() return conn.space.test.index.name:select({'netbox'}) end)
    step('select_ge_limit', function()
        return conn.space.test:select({900}, {iterator = 'GE', limit = 2})
    end)
    step('get', function() return conn.space.test:get({900}) end)
    step('get_missing', function() return conn.space.test:get({999}) end)
    step('update', function() return conn.space.test:update({900}, {{'=', 2, 'netbox2'}, {'=', 3, 7}}) end)
    step('upsert', function() return conn.space.test:upsert({901, 'up'}, {{'=', 2, 'x'}}) end)
    step('upsert_again', function() return conn.space.test:upsert({901, 'up'}, {{'=', 2, 'x'}}) end)
    step('replace', function() return conn.space.test:replace({902, 'replaced'}) end)
    step('count', function() return conn.space.test.index.primary:count({900}, {iterator = 'GE'}) end)
    step('duplicate', function() return conn.space.test:insert({900, 'dup'}) end)
    step('delete', function() return conn.space.test:delete({900}) end)
    step('after_delete', function() return conn.space.test:select({}, {iterator = 'ALL'}) end)
    step('call', function() return conn:call('box.session.user') end)
    step('call_args', function() return conn:call('box.space.test:get', {901}) end)
    step('call_missing', function() return conn:call('no_such_function') end)
    step('eval', function() return conn:eval('return 1 + ..., "two"', {41}) end)
    step('no_space', function() return conn.space.nosuch end)
    step('cleanup', function() return conn:call('box.space.test:truncate') end)
    local alice = net_box.connect('127.0.0.1:' .. port, {user = 'alice', password = 'secret', wait_connected = 10})
    step('auth_user', function() return alice:call('box.session.user') end)
    alice:close()
    local wrong = net_box.connect('127.0.0.1:' .. port, {user = 'alice', password = 'wrong', wait_connected = 10})
    step('auth_refused', function() return wrong:ping(), wrong.error end)
    wrong:close()
elseif part == 'boxqueue' then
    -- A space made by another session after connecting: net.box reloads its schema when an answer
    -- carries a newer schema version.
    local admin = net_box.connect('127.0.0.1:' .. port, {user = 'admin', password = 'adminpw', wait_connected = 10})
    step('ddl', function()
        admin:eval("box.schema.space.create('netbox_new', {id = 700}):create_index('pk')")
        return wait_for(function()
            conn:ping()
            return conn.space.netbox_new ~= nil
        end, 5)
    end)
    step('new_space_insert', function() return conn.space.netbox_new:insert({1, 'fresh'}) end)
    step('drop', function() return admin:eval("box.space.netbox_new:drop()") end)
    step('dropped', function()
        return wait_for(function()
            conn:ping()
            return conn.space.netbox_new == nil
        end, 5)
    end)
    admin:close()
    -- box.queue over CALL, as a 1.5 application calls it
    step('put', function() return conn:call('box.queue.put', {0, 'netbox', 0, 0, 0, 0, 'hello', 'world'}) end)
    local id = out.put.ok and out.put.ok[1] and out.put.ok[1][1]
    step('queue_space_select', function() return conn.space.queue.index.tube_status:select({'netbox'}) end)
    step('take', function() return conn:call('box.queue.take', {0, 'netbox', 5}) end)
    step('take_nothing', function() return conn:call('box.queue.take', {0, 'netbox', 0.1}) end)
    step('ack', function() return conn:call('box.queue.ack', {0, id}) end)
    step('statistics', function() return conn:call('box.queue.statistics', {0, 'netbox'}) end)
    -- A take that waits in one connection is answered by a put from another.
    step('waiting_take', function()
        local other = net_box.connect('127.0.0.1:' .. port, {wait_connected = 10})
        local taken
        local waiter = fiber.create(function() taken = conn:call('box.queue.take', {0, 'netbox', 5}) end)
        waiter:set_joinable(true)
        fiber.sleep(0.2)
        other:call('box.queue.put', {0, 'netbox', 0, 0, 0, 0, 'late'})
        waiter:join()
        other:close()
        return taken
    end)
    step('no_queue_space', function() return conn:call('box.queue.put', {77, 'netbox', 0, 0, 0, 0, 'x'}) end)
    -- tarantool/queue: the tube made with EVAL (over CALL its answer, the tube object, cannot be
    -- encoded), then its methods over CALL as applications call them
    step('create_tube', function()
        return conn:eval("queue.create_tube('netbox_jobs', 'fifottl', {if_not_exists = true})")
    end)
    step('tube_put', function() return conn:call('queue.tube.netbox_jobs:put', {'job', {pri = 2}}) end)
    step('tube_take', function() return conn:call('queue.tube.netbox_jobs:take', {1}) end)
    step('tube_ack', function() return conn:call('queue.tube.netbox_jobs:ack', {0}) end)
    step('tube_statistics', function() return conn:call('queue.statistics', {'netbox_jobs'}) end)
    step('tube_from_eval', function()
        return conn:eval("local t = queue.tube.netbox_jobs:put('via eval') return t[3]")
    end)
    step('tube_drop', function()
        conn:call('queue.tube.netbox_jobs:truncate')
        return conn:call('queue.tube.netbox_jobs:drop')
    end)
    step('tube_missing', function() return conn:call('queue.tube.netbox_jobs:put', {'gone'}) end)
end

conn:close()
io.stdout:write(json.encode(out), '\n')
os.exit(0)
