-- The Lua side of the embedded console: the sandboxed global table user code runs in, the `box`
-- table, and the worker coroutines the Python driver resumes (see boxqueue/lua_box/engine.py).
--
-- A job (an EVAL chunk, a console statement, a CALL of a Lua function) runs in a `worker`
-- coroutine. Every call into Python goes through `op(name, ...)`: the coroutine yields the
-- request to the Python driver, which runs it on the trio event loop (awaiting it when it waits
-- for a commit or a queue take) and resumes the coroutine with the answer (see `resumed`).
-- What a job hands to Python (its results, an error, an operation's arguments) is first turned
-- into plain values by `describe`, inside the coroutine, so no user metamethod ever runs
-- outside a job's time limit, and the driver calls nothing but C functions on the main state.

local py = ...                       -- clock, messages, limits, the path of lupa's LuaJIT library
local OP, DONE = 'op', 'done'        -- what the driver sees first in a yield or a return
local USER_YIELD = {}                -- tags the yields of user coroutines (see user_resume)
local raw_yield, raw_resume, raw_create = coroutine.yield, coroutine.resume, coroutine.create
local raw_status, raw_pcall, raw_isyieldable = coroutine.status, pcall, coroutine.isyieldable
local pack = function(...) return {n = select('#', ...), ...} end
local unpack, type, setmetatable, getmetatable, tostring = unpack, type, setmetatable, getmetatable, tostring
local rawget, rawset, pairs, ipairs, error, select = rawget, rawset, pairs, ipairs, error, select
local clock = py.clock
local string_format = string.format
local debug_sethook = debug.sethook

jit.off()  -- count hooks do not fire inside compiled traces: user code stays interpreted
string.dump = nil  -- no bytecode in or out: crafted bytecode can crash the VM

local internal = {}

-- Errors ------------------------------------------------------------------------------------

local error_mt = {}
error_mt.__index = {
    unpack = function(self) return {code = self.code, message = self.message, type = self.type} end,
    raise = function(self) error(self, 0) end,
}
error_mt.__tostring = function(self) return self.message end
local function new_error(code, message, etype)
    return setmetatable({code = code, message = message, type = etype or 'ClientError'}, error_mt)
end
internal.new_error = new_error

-- The budget errors: user code cannot catch them (pcall and xpcall pass them on).
local LIMIT = setmetatable({}, {__tostring = function() return py.limit_message end})
local function is_fatal(err)
    return err == LIMIT or err == 'not enough memory'
end

-- code, message, type and the value the console prints, for any error value. The budget
-- errors have code -1 (ER_PROC_LUA with their message).
function internal.error_info(err)
    if type(err) == 'table' and getmetatable(err) == error_mt then
        return err.code, err.message, err.type, err.message
    end
    if err == LIMIT then return -1, py.limit_message, nil, py.limit_message end
    if err == 'not enough memory' then return -1, py.memory_message, nil, py.memory_message end
    if type(err) == 'string' then return -1, err, nil, err end
    return -1, tostring(err), nil, err
end

-- Count hooks -------------------------------------------------------------------------------
--
-- The driver shares what it decides through `state`: the schema version (space objects are
-- cached until it changes), whether the job runs on the event loop, and the deadline of the
-- running slice.
local state = {schema_version = nil, on_loop = true, deadline = math.huge}
internal.state = state

-- Lua runs under one of two count hooks, both firing every `py.hook_interval` VM instructions:
--
-- * the yielding hook is LuaJIT's own `lua_yield`, installed with `lua_sethook` through the FFI
--   on the library lupa loaded. LuaJIT lets a count hook yield (it leaves a continuation frame
--   behind, and the next resume goes on where the hook fired), but only a C hook can: a Lua
--   hook set by debug.sethook runs behind a C call and gets "attempt to yield across C-call
--   boundary". The job's coroutine returns to the Python driver with no values, and the driver
--   checks the time limit and the event loop's budget, then resumes it, here or in the Lua thread.
--   It is always set, between jobs too: the driver only calls C functions of Lua's library on
--   the main Lua state (unpack, setmetatable, loadstring...), which run no VM instructions, so
--   the hook only ever fires inside a job. (Walking the globals, which is Lua, is done with the
--   hook off.)
-- * the checking hook is a Lua function (debug.sethook) that raises the time limit error once the
--   slice's deadline has passed. It is the hook while a C function that calls back into Lua runs
--   (a table.sort comparator, a string.gsub callback, a __tostring from string.format): there
--   no yield is possible, and lua_yield would raise "attempt to yield across C-call boundary"
--   in user code. Such calls move the job to the Lua thread first (see enter_c_callbacks), so
--   the checking hook never runs on the event loop; the yielding hook comes back when the job
--   next calls into Python or ends.
local ffi = require('ffi')
ffi.cdef[[
typedef struct lua_State lua_State;
typedef struct lua_Debug lua_Debug;
typedef void (*lua_Hook)(lua_State *L, lua_Debug *ar);
int lua_sethook(lua_State *L, lua_Hook func, int mask, int count);
int lua_yield(lua_State *L, int nresults);
]]
local LUA_MASKCOUNT = 8
local luajit = ffi.load(py.lupa_library)
-- lua_sethook changes the hook of the whole runtime; any of its threads names it, as long as that
-- thread lives (it is kept in `internal`).
local anchor = raw_create(function() end)
internal.anchor = anchor
local anchor_address = tonumber(string.match(tostring(anchor), '0x%x+'))
internal.state_address = anchor_address
local anchor_state = ffi.cast('lua_State *', anchor_address)
local lua_sethook = luajit.lua_sethook
local yield_hook = ffi.cast('lua_Hook', luajit.lua_yield)
local interval = py.hook_interval

local YIELDING, CHECKING = 1, 2
local hook_mode = YIELDING  -- the driver sets the yielding hook once the engine is ready
local function hook_yielding()
    lua_sethook(anchor_state, yield_hook, LUA_MASKCOUNT, interval)
    hook_mode = YIELDING
end
local function check_deadline()
    if clock() > state.deadline then error(LIMIT, 0) end
end
local function hook_checking()
    debug_sethook(check_deadline, '', interval)
    hook_mode = CHECKING
end

-- Values ------------------------------------------------------------------------------------

local NULL = setmetatable({}, {__tostring = function() return 'null' end})
internal.NULL = NULL

local tuple_methods = {}
local tuple_mt = {__index = tuple_methods}
function tuple_methods.unpack(self, i, j) return unpack(self, i or 1, j or #self) end
function tuple_methods.totable(self)
    local t = {}
    for i = 1, #self do t[i] = self[i] end
    return t
end
function tuple_methods.bsize(self) return #self end
tuple_methods.tomap = tuple_methods.totable
local function new_tuple(t) return setmetatable(t, tuple_mt) end
internal.new_tuple = new_tuple

-- Values handed to Python -------------------------------------------------------------------
--
-- `describe` turns a value into one the Python side converts without calling back into Lua:
-- numbers, strings, booleans and nil stay as they are; box.NULL becomes nil; a table becomes a
-- plain table holding its shape ('a' array, 'm' map as key, value, key, value..., 't' tuple)
-- and then its items, described, with `n` its length; an error object becomes its message, a
-- table whose metatable has a `__serialize` function what that returns, anything else its
-- tostring(). It runs inside the job, under its count hook, since user metamethods may run.
-- It also enforces the limits of one result: at most py.max_values values in all (the Python
-- copy is not under the Lua memory limit), at most py.max_depth levels of tables.
local MAX_VALUES, MAX_DEPTH = py.max_values, py.max_depth
local TOO_MANY = string_format('a result of more than %d values is refused', MAX_VALUES)
local TOO_DEEP = 'too deep nesting (a table that contains itself?)'
local SCALAR = {number = true, string = true, boolean = true, ['nil'] = true}
local left = 0   -- values the result being described may still hold

local function spend(count)
    left = left - count
    if left < 0 then error(TOO_MANY, 0) end
end

local describe
local function describe_table(v, depth)
    if v == NULL then return nil end
    if depth > MAX_DEPTH then error(TOO_DEEP, 0) end
    depth = depth + 1
    local mt = getmetatable(v)
    if mt ~= nil then
        if type(rawget(mt, '__serialize')) == 'function' then return describe(mt.__serialize(v), depth) end
        if mt == tuple_mt then
            local size = #v
            spend(size)
            local out = {'t', n = size + 1}
            for i = 1, size do out[i + 1] = describe(rawget(v, i), depth) end
            return out
        end
        if mt == error_mt then return describe(v.message, depth) end
    end
    local count, max = 0, 0
    for k in pairs(v) do
        if type(k) ~= 'number' or k < 1 or k % 1 ~= 0 then max = -1 break end
        count = count + 1
        if k > max then max = k end
    end
    -- Tarantool's serializer: a table with only positive integer keys is an array unless it is
    -- too sparse (more than half holes past the first ten).
    if max >= 0 and not (max > 10 and max > 2 * count) then
        spend(max)
        local out = {'a', n = max + 1}
        for i = 1, max do out[i + 1] = describe(rawget(v, i), depth) end
        return out
    end
    local out, i = {'m'}, 1
    for k, item in pairs(v) do
        spend(1)
        out[i + 1], out[i + 2] = describe(k, depth), describe(item, depth)
        i = i + 2
    end
    out.n = i
    return out
end

describe = function(v, depth)
    local t = type(v)
    if SCALAR[t] then return v end
    if t == 'table' then return describe_table(v, depth) end
    return tostring(v)
end

-- The items of a {n = ...} table, described in place.
local function describe_all(r)
    left = MAX_VALUES
    spend(r.n)
    for i = 1, r.n do
        local v = r[i]
        if not SCALAR[type(v)] then r[i] = describe(v, 0) end
    end
    return r
end

-- Whether all of (a few) values are already plain.
local function all_scalar(...)
    local n = select('#', ...)
    if n > 8 then return false end
    for i = 1, n do
        if not SCALAR[type((select(i, ...)))] then return false end
    end
    return true
end

internal.tuple_mt = tuple_mt
internal.error_mt = error_mt

-- Calls into Python -------------------------------------------------------------------------

-- The driver answers `true, values...`, `false, error`, or for the common results of space
-- methods `TUPLE, fields...` (one tuple) and `TUPLES, count, fields..., count, fields...` (an
-- array of tuples), built into tables here.
local TUPLE, TUPLES = py.answer_tuple, py.answer_tuples
local function tuples(...)
    local out, at, n = {}, 1, select('#', ...)
    local args = {...}
    local k = 0
    while at <= n do
        local count = args[at]
        k = k + 1
        out[k] = setmetatable({unpack(args, at + 1, at + count)}, tuple_mt)
        at = at + count + 1
    end
    return out
end
local function resumed(ok, ...)
    if ok == true then return ... end
    if ok == TUPLE then return setmetatable({...}, tuple_mt) end
    if ok == TUPLES then return tuples(...) end
    error((...), 0)
end

-- Yields `name` and its arguments (described) to the driver; returns what it answers.
local function op(name, ...)
    if not raw_isyieldable() then
        -- inside a C function that called back into Lua (a table.sort comparator...)
        error('attempt to yield across C-call boundary', 0)
    end
    if hook_mode ~= YIELDING then hook_yielding() end
    if all_scalar(...) then return resumed(raw_yield(OP, name, ...)) end
    local args = describe_all(pack(...))
    return resumed(raw_yield(OP, name, unpack(args, 1, args.n)))
end

-- Jobs ----------------------------------------------------------------------------------------
--
-- A job is `fn(...)` run by a `worker` coroutine. A resume yields to the driver:
--   nothing                          the yielding count hook fired;
--   'op', name, arguments...         a call into Python (see op);
--   'done', globals, true, results...
--   'done', globals, false, code, message, type, printable
-- with results and printable described. `globals` counts the global names user code has made
-- (see the end of this file): while it stays the same, no function appeared for CALL to serve.

local count_globals   -- defined with the sandbox

local function failed(err)
    local ok, code, message, etype, printable = raw_pcall(internal.error_info, err)
    if not ok then
        code, message, etype, printable = -1, type(code) == 'string' and code or 'error in error handling', nil, nil
    end
    left = MAX_VALUES
    local described_ok, described = raw_pcall(describe, printable, 0)
    if not described_ok then described = message end
    return DONE, count_globals(), false, code, message, etype, described
end

local function settle(ok, ...)
    if hook_mode ~= YIELDING then hook_yielding() end
    if not ok then return failed((...)) end
    if all_scalar(...) then return DONE, count_globals(), true, ... end
    local described_ok, r = raw_pcall(describe_all, pack(...))
    if not described_ok then return failed(r) end
    return DONE, count_globals(), true, unpack(r, 1, r.n)
end

-- A job's coroutine, kept by the driver for the next job once this one is done: the next
-- function and its arguments come back from the yield.
local job_threads = setmetatable({}, {__mode = 'k'})  -- user code may not resume these
local function worker(fn, ...)
    return worker(raw_yield(settle(raw_pcall(fn, ...))))
end
function internal.worker(...)
    job_threads[coroutine.running()] = true
    return worker(...)
end

-- The sandbox -------------------------------------------------------------------------------

local G = {}
internal.G = G

-- pcall/xpcall that do not swallow the budget errors.
local function rethrow_fatal(r)
    if not r[1] and is_fatal(r[2]) then error(r[2], 0) end
    return unpack(r, 1, r.n)
end
G.pcall = function(f, ...) return rethrow_fatal(pack(raw_pcall(f, ...))) end
-- xpcall as pcall, then the handler: LuaJIT runs the handler before unwinding, behind a C call
-- where the count hook cannot yield; nothing in the sandbox can see the difference (there is no
-- debug library), and here the handler may call box. An error in the handler is "error in
-- error handling", as in LuaJIT.
local c_xpcall = xpcall
G.xpcall = function(f, handler, ...)
    if type(handler) ~= 'function' then
        return c_xpcall(f, handler, ...)  -- LuaJIT's own argument error, named as the caller wrote it
    end
    local r = pack(raw_pcall(f, ...))
    if r[1] then return unpack(r, 1, r.n) end
    if is_fatal(r[2]) then error(r[2], 0) end
    local ok, handled = raw_pcall(handler, r[2])
    if ok then return false, handled end
    if is_fatal(handled) then error(handled, 0) end
    return false, 'error in error handling'
end

-- User coroutines pass our operation requests and the yielding hook's yields (which give no
-- values) through to the driver; their own yields are tagged so the two cannot be confused.
local function user_resume(co, ...)
    if job_threads[co] then return false, 'cannot resume non-suspended coroutine' end
    local r = pack(raw_resume(co, ...))
    while r[1] and r[2] ~= USER_YIELD and raw_status(co) == 'suspended' do
        local answer = pack(raw_yield(unpack(r, 2, r.n)))
        r = pack(raw_resume(co, unpack(answer, 1, answer.n)))
    end
    if not r[1] and is_fatal(r[2]) then error(r[2], 0) end
    if r[1] and r[2] == USER_YIELD then return true, unpack(r, 3, r.n) end
    return unpack(r, 1, r.n)
end
G.coroutine = {
    create = coroutine.create, status = coroutine.status,
    yield = function(...) return raw_yield(USER_YIELD, ...) end,
    running = coroutine.running, resume = user_resume,
    wrap = function(f)
        local co = raw_create(f)
        return function(...)
            local r = pack(user_resume(co, ...))
            if not r[1] then error(r[2], 0) end
            return unpack(r, 2, r.n)
        end
    end,
}

-- C functions that call back into Lua: a job moves to the Lua thread before such a call and
-- runs it under the checking hook (see Count hooks). The wrappers end in a tail call, so the
-- function's own argument errors keep the name and position the caller wrote. They replace the
-- library functions themselves, which `("x"):gsub(...)` reaches through the string metatable.
local c_sort, c_gsub, c_format = table.sort, string.gsub, string.format
local BIG_SORT = 4096   -- longer sorts (all in C, with no hook) move to the Lua thread too
local function enter_c_callbacks()
    if state.on_loop then op('to_thread') end
    hook_checking()
end
table.sort = function(t, cmp)
    if type(t) == 'table' then
        local n = #t
        local calls_back = cmp ~= nil
        if not calls_back then  -- tables and userdata may compare through __lt
            for i = 1, n do
                local item = type(rawget(t, i))
                if item == 'table' or item == 'userdata' then calls_back = true break end
            end
        end
        if calls_back then
            enter_c_callbacks()
        elseif n > BIG_SORT and state.on_loop then
            op('to_thread')
        end
    end
    return c_sort(t, cmp)
end
string.gsub = function(s, pattern, repl, n)
    local kind = type(repl)
    if kind == 'function' or (kind == 'table' and getmetatable(repl) ~= nil) then enter_c_callbacks() end
    return c_gsub(s, pattern, repl, n)
end
string.format = function(fmt, ...)
    for i = 1, select('#', ...) do  -- a __tostring runs for %s
        local v = (select(i, ...))
        local kind = type(v)
        if (kind == 'table' or kind == 'userdata') and getmetatable(v) ~= nil then
            enter_c_callbacks()
            break
        end
    end
    return c_format(fmt, ...)
end

for _, name in ipairs({'assert', 'error', 'ipairs', 'next', 'pairs', 'rawequal', 'rawget',
                       'rawlen', 'rawset', 'select', 'setmetatable', 'getmetatable', 'tonumber',
                       'tostring', 'type', 'unpack', 'print'}) do
    G[name] = _G[name]
end
-- print() goes to the server's log (logger lua_box.print), as Tarantool's goes to its stdout.
G.print = function(...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    py.log(table.concat(parts, '\t'))
end
G.string, G.table, G.math, G.bit = string, table, math, bit
G.os = {time = os.time, clock = os.clock, date = os.date, difftime = os.difftime}
G._VERSION = _VERSION
G._G = G
G.loadstring = function(code, name)
    if type(code) ~= 'string' then return nil, 'loadstring: a string is expected' end
    if code:byte(1) == 27 then return nil, 'loadstring: bytecode is not accepted' end
    local fn, err = loadstring(code, name)
    if fn then setfenv(fn, G) end
    return fn, err
end
G.load = G.loadstring

local modules = {}
G.require = function(name)
    local m = modules[name]
    if m == nil then error(string_format("module '%s' not found", tostring(name)), 2) end
    return m
end
modules.console = {
    delimiter = function(d) return op('console_delimiter', d) end,
}

-- box ---------------------------------------------------------------------------------------

local box = {NULL = NULL}
G.box = box
modules.box = box

box.error = setmetatable({
    new = function(code, message)
        if type(code) == 'table' then
            return new_error(code.code or 0, code.reason or code.message or 'Unknown error')
        end
        return new_error(code, message or 'Unknown error')
    end,
}, {
    __call = function(_, code, message, ...)
        if type(code) == 'table' and getmetatable(code) == error_mt then error(code, 0) end
        if type(code) == 'table' then
            error(new_error(code.code or 0, code.reason or code.message or 'Unknown error'), 0)
        end
        if message ~= nil and select("#", ...) > 0 then message = string.format(message, ...) end
        error(new_error(code, message or 'Unknown error'), 0)
    end,
})

box.tuple = {new = function(...)
    local first = ...
    if select('#', ...) == 1 and type(first) == 'table' then
        local t = {}
        for i = 1, #first do t[i] = first[i] end
        return new_tuple(t)
    end
    return new_tuple({...})
end}

-- Procedures of the Python registry (box.queue.*, queue.*, box.session.*, box.info) by name.
local function procedure(name)
    return function(...) return op('call', name, ...) end
end

local queue = {}
for _, fn in ipairs({'put', 'urgent', 'put_unique', 'take', 'ack', 'touch', 'done', 'bury', 'dig',
                     'unbury', 'kick', 'release', 'requeue', 'delete', 'truncate', 'meta', 'peek',
                     'statistics', 'restart_check'}) do
    queue[fn] = procedure('box.queue.' .. fn)
end
box.queue = queue

-- tarantool/queue's module (boxqueue/tubes/queue_module.py) is the global `queue` and require('queue');
-- box.queue stays the 1.5 API, whose functions `queue` still reaches where the module has no
-- function of that name (queue.put, queue.take...).
local tube_methods = {put = true, take = true, touch = true, ack = true, release = true, peek = true,
                      bury = true, kick = true, delete = true, drop = true, truncate = true,
                      release_all = true, grant = true}
local task_change = {}  -- tube name -> its on_task_change callback (this process's, as the module's)
local function on_task_change(tube, cb)
    local name = rawget(tube, 'name')
    local old = task_change[name]
    task_change[name] = cb
    op('call', 'queue._watch', name, cb ~= nil)
    return old
end
local tube_mt = {__index = function(self, method)
    if method == 'on_task_change' then return on_task_change end
    if tube_methods[method] then
        local name = 'queue.tube.' .. rawget(self, 'name') .. ':' .. method
        return function(_, ...) return op('call', name, ...) end
    end
end}
local tubes = setmetatable({}, {
    __index = function(_, name)
        if type(name) == 'string' and op('call', 'queue._has_tube', name) then
            return setmetatable({name = name}, tube_mt)
        end
    end,
    __call = function(_, name)
        if name == nil then return op('call', 'queue._tube_names') end
        if type(name) ~= 'string' then error('argument #1 should be string or nil', 2) end
        return op('call', 'queue._has_tube', name)
    end,
})
local modern = setmetatable({
    tube = tubes,
    create_tube = function(name, tube_type, opts)
        local cb = type(opts) == 'table' and opts.on_task_change or nil
        if cb ~= nil then
            local copy = {}
            for k, v in pairs(opts) do if k ~= 'on_task_change' then copy[k] = v end end
            opts = copy
        end
        op('call', 'queue._create_tube', name, tube_type, opts)
        local tube = tubes[name]
        if cb ~= nil and tube ~= nil then on_task_change(tube, cb) end
        return tube
    end,
    -- called by boxqueue/tubes/queue_module.py, once a change of a watched tube's task is durable
    _task_changed = function(name, task, what)
        if what == 'dropped' then task_change[name] = nil return end  -- its callback goes with it
        local cb = task_change[name]
        if cb ~= nil then cb(task, what) end
    end,
    statistics = procedure('queue.statistics'),
    stats = procedure('queue.statistics'),
    state = procedure('queue.state'),
    identify = procedure('queue.identify'),
    cfg = setmetatable({}, {__call = function(_, opts) return op('call', 'queue.cfg', opts) end}),
    _VERSION = '1.5.0',
}, {__index = queue})
G.queue = modern
modules.queue = modern

box.session = {
    id = procedure('box.session.id'),
    user = procedure('box.session.user'),
}
box.info = setmetatable({}, {
    __call = function() return op('call', 'box.info') end,
    __index = function(_, key) return (op('call', 'box.info'))[key] end,
})
box.stat = function() return op('stat') end

-- A read-only view of the configuration (given once: it does not change while running).
box.cfg = setmetatable({}, {
    __index = function(_, key) return py.cfg[key] end,
    __newindex = function() error('box.cfg is read-only in boxqueue', 2) end,
    __call = function() error('box.cfg{} cannot change a running boxqueue', 2) end,
    __serialize = function() return py.cfg end,
})

-- Spaces ------------------------------------------------------------------------------------

local space_methods, index_methods = {}, {}
local space_mt = {__index = space_methods}
local index_mt = {__index = index_methods}

local function space_ref(self) return rawget(self, 'id') end

local function index_object(space, info)
    return setmetatable({
        id = info.id, name = info.name, type = info.type, unique = info.unique,
        parts = info.parts, space_id = space.id,
    }, index_mt)
end

local function space_object(info)
    local s = setmetatable({
        id = info.id, name = info.name, engine = info.engine, field_count = info.field_count,
        temporary = info.temporary, enabled = true, index = {},
    }, space_mt)
    for _, i in ipairs(info.indexes) do
        local idx = index_object(s, i)
        s.index[i.id] = idx
        s.index[i.name] = idx
    end
    return s
end

-- `box.space.x` is looked up afresh on each access: DDL from any session shows at once.
-- `box.space.x` shows DDL from any session at once: objects are cached per schema version.
local space_cache, space_cache_version = {}, nil
box.space = setmetatable({}, {
    __index = function(_, ref)
        if space_cache_version ~= state.schema_version then
            space_cache, space_cache_version = {}, state.schema_version
        end
        local cached = space_cache[ref]
        if cached ~= nil then return cached end
        local info = op('space_info', ref)
        if info == nil then return nil end
        local object = space_object(info)
        if space_cache_version == state.schema_version then space_cache[ref] = object end
        return object
    end,
})

local function call_space(self, iid, method, ...)
    return op('space', space_ref(self), iid, method, ...)
end

for _, m in ipairs({'select', 'get', 'insert', 'replace', 'update', 'upsert', 'delete', 'len',
                    'count', 'truncate'}) do
    space_methods[m] = function(self, ...) return call_space(self, 0, m, ...) end
end
function space_methods.put(self, ...) return call_space(self, 0, 'replace', ...) end
function space_methods.pairs(self, key, opts)
    local rows = call_space(self, 0, 'select', key, opts)
    return ipairs(rows)
end
function space_methods.create_index(self, name, opts)
    return index_object(self, op('create_index', space_ref(self), name, opts))
end
function space_methods.drop(self) return op('drop_space', space_ref(self)) end
function space_methods.rename(self, name) return op('alter_space', space_ref(self), {name = name}) end
function space_methods.format(self, fmt)
    if fmt == nil then return op('space_format', space_ref(self)) end
    return op('alter_space', space_ref(self), {format = fmt})
end
function space_methods.bsize(self) return 0 end

for _, m in ipairs({'select', 'get', 'update', 'delete', 'count'}) do
    index_methods[m] = function(self, ...)
        return op('space', rawget(self, 'space_id'), rawget(self, 'id'), m, ...)
    end
end
function index_methods.len(self) return op('space', rawget(self, 'space_id'), 0, 'len') end
function index_methods.pairs(self, key, opts)
    local rows = op('space', rawget(self, 'space_id'), rawget(self, 'id'), 'select', key, opts)
    return ipairs(rows)
end
function index_methods.min(self, key)
    return (op('space', rawget(self, 'space_id'), rawget(self, 'id'), 'select', key,
               {iterator = 'GE', limit = 1}))[1]
end
function index_methods.max(self, key)
    return (op('space', rawget(self, 'space_id'), rawget(self, 'id'), 'select', key,
               {iterator = 'LE', limit = 1}))[1]
end
function index_methods.drop(self)
    return op('drop_index', rawget(self, 'space_id'), rawget(self, 'id'))
end

-- box.schema --------------------------------------------------------------------------------

-- A function from the source of a function expression, as `box.schema.func.create` takes it.
local function compile_body(name, body)
    local function fail(why)
        error(new_error(50, string_format("Failed to create function '%s': %s", tostring(name), why)), 0)
    end
    if type(name) ~= 'string' then fail('name must be a string') end
    if type(body) ~= 'string' then fail('body must be a string') end
    local chunk, err = internal.compile('return ' .. body, '=' .. name)
    if not chunk then fail(err) end
    local ok, fn = raw_pcall(chunk)
    if not ok or type(fn) ~= 'function' then fail('body must be a function expression') end
    return fn
end

-- Defines a persisted function at start; false and the reason when its body no longer compiles.
function internal.define(name, body)
    local ok, fn = raw_pcall(compile_body, name, body)
    if not ok then return false, tostring(fn) end
    G[name] = fn
    return true, nil
end

local function create_space(name, opts)
    return space_object(op('create_space', name, opts))
end
box.schema = {
    space = {create = create_space},
    create_space = create_space,
    user = {
        create = function(name, opts) return op('user_create', name, opts) end,
        grant = function(name, privileges, otype, oname, opts)
            return op('user_grant', name, privileges, otype, oname, opts)
        end,
        exists = function(name) return op('user_exists', name) end,
        passwd = function() error('box.schema.user.passwd is not supported by boxqueue', 2) end,
    },
    func = {
        create = function(name, opts)
            opts = opts or {}
            local fn = nil
            if opts.body ~= nil then fn = compile_body(name, opts.body) end
            if op('func_create', name, opts.body, opts.if_not_exists) and fn then G[name] = fn end
        end,
        drop = function(name, opts)
            local dropped, had_body = op('func_drop', name, (opts or {}).if_exists)
            if dropped and had_body then G[name] = nil end
        end,
        exists = function(name) return op('func_exists', name) end,
    },
}

-- The global names user code made, as those holding functions (callable over CALL), those
-- holding tables (for `app.handler` and `app:method`) and the rest.
local builtin = {}
for k in pairs(G) do builtin[k] = true end
function internal.user_functions()
    local functions, tables, others = {}, {}, {}
    for k, v in pairs(G) do
        if type(k) == 'string' and not builtin[k] then
            local kind = type(v)
            local list = kind == 'function' and functions or kind == 'table' and tables or others
            list[#list + 1] = k
        end
    end
    return functions, tables, others
end

-- Compile a chunk in the sandbox; nil and the message when it does not compile.
function internal.compile(code, chunkname)
    if code:byte(1) == 27 then return nil, 'bytecode is not accepted' end
    local fn, err = loadstring(code, chunkname)
    if not fn then return nil, err end
    return setfenv(fn, G), nil
end

-- CALL of a global function by name: `f`, `app.handler`, or `app:method` (called with `app`
-- as its first argument, as Tarantool does). Looked up inside the job, as user metamethods
-- may run.
local function lookup(path)
    local v = G
    for part in string.gmatch(path, '[^.]+') do
        if type(v) ~= 'table' then return nil end
        v = v[part]
    end
    return v
end
local function not_defined(name)
    error(new_error(py.no_such_proc_code, string_format(py.no_such_proc_format, name)), 0)
end
local find = string.find
function internal.call_global(name, ...)
    if not find(name, '[.:]') then  -- a plain global, the common case
        local fn = G[name]
        if type(fn) ~= 'function' then not_defined(name) end
        return fn(...)
    end
    local object_path, method = string.match(name, '^(.+):([^.:]+)$')
    if object_path then
        local object = lookup(object_path)
        local fn = type(object) == 'table' and object[method] or nil
        if type(fn) ~= 'function' then not_defined(name) end
        return fn(object, ...)
    end
    local fn = lookup(name)
    if type(fn) ~= 'function' then not_defined(name) end
    return fn(...)
end

-- New global names are counted as user code makes them (a metatable on the sandbox table), so
-- the driver walks the globals (user_functions) only when the count moved. Should user code
-- take that metatable away, the count is -1 and the driver walks them after every job.
local made = 0
local globals_mt = {}
local function new_global(t, k, v)
    made = made + 1
    rawset(t, k, v)
end
globals_mt.__newindex = new_global
count_globals = function()
    if getmetatable(G) ~= globals_mt or globals_mt.__newindex ~= new_global then return -1 end
    return made
end
G.rawset = function(t, k, v)
    if t == G and rawget(t, k) == nil then made = made + 1 end
    return rawset(t, k, v)
end
setmetatable(G, globals_mt)

return internal
