-- The Lua side of the embedded console: the sandboxed global table user code runs in, the `box`
-- table, and the job driver the Python side steps through (see lua_box/engine.py).
--
-- Every call into Python goes through `op(name, ...)`: the job's coroutine yields the request
-- to the Python driver, which runs it on the trio event loop (awaiting it when it waits for a
-- commit or a queue take) and resumes the coroutine with `true, results` or `false, error`.
-- Lua code itself runs in a worker thread; a count hook enforces the job's time budget.

local py = ...                       -- clock, limit message, memory limit message
local OP, DONE = {}, {}              -- yield tokens only this file can produce
local raw_yield, raw_resume, raw_create = coroutine.yield, coroutine.resume, coroutine.create
local raw_status, raw_pcall, raw_xpcall = coroutine.status, pcall, xpcall
local pack = function(...) return {n = select('#', ...), ...} end
local unpack, type, setmetatable, getmetatable, tostring = unpack, type, setmetatable, getmetatable, tostring
local rawget, rawset, pairs, ipairs, error, select = rawget, rawset, pairs, ipairs, error, select
local clock = py.clock
local string_format = string.format

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

local deadline = nil
debug.sethook(function()
    if deadline ~= nil and clock() > deadline then
        error(LIMIT, 0)
    end
end, '', 10000)

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

-- What a value is, for the Python converter: 'tuple', 'array' (with its length), 'map', 'null',
-- 'error', or Lua's type name; a table whose metatable names a `__serialize` table stands for it.
function internal.kind(v)
    local t = type(v)
    if t ~= 'table' then return t, 0, tostring(v) end
    if v == NULL then return 'null', 0 end
    local mt = getmetatable(v)
    if mt ~= nil and type(rawget(mt, '__serialize')) == 'function' then
        return 'proxy', 0, mt.__serialize(v)
    end
    if mt == tuple_mt then return 'tuple', #v end
    if mt == error_mt then return 'error', 0 end
    local count, max = 0, 0
    for k in pairs(v) do
        if type(k) ~= 'number' or k < 1 or k % 1 ~= 0 then return 'map', 0 end
        count = count + 1
        if k > max then max = k end
    end
    -- Tarantool's serializer: a table with only positive integer keys is an array unless it is
    -- too sparse (more than half holes past the first ten).
    if max > 10 and max > 2 * count then return 'map', 0 end
    return 'array', max
end

-- Calls into Python -------------------------------------------------------------------------

local function op(name, ...)
    local r = pack(raw_yield(OP, name, pack(...)))
    if r[1] then
        local results = r[2]
        return unpack(results, 1, results.n)
    end
    error(r[2], 0)
end

-- Jobs: one coroutine per chunk or function call --------------------------------------------

local jobs = {}

local function job_body(fn, ...)
    return DONE, pack(raw_pcall(fn, ...))
end

function internal.start(id, budget, version, fn, args)
    jobs[id] = raw_create(job_body)
    return internal.resume(id, budget, version, fn, unpack(args, 1, args.n))
end

-- The schema version as of the last resume: space objects are cached until it changes.
local schema_version = nil

-- Resume job `id` for at most `budget` seconds. Returns 'op', name, args; or 'done', ok,
-- results (an error object when not ok); the job is forgotten once done.
function internal.resume(id, budget, version, ...)
    schema_version = version
    local co = jobs[id]
    deadline = clock() + budget
    local r = pack(raw_resume(co, ...))
    deadline = nil
    if r[1] and r[2] == OP then
        return 'op', r[3], r[4]
    end
    jobs[id] = nil
    if not r[1] then return 'done', false, r[2] end
    if r[2] ~= DONE then
        return 'done', false, 'unexpected yield from a coroutine outside any coroutine.wrap'
    end
    local result = r[3]
    if result[1] then
        return 'done', true, pack(unpack(result, 2, result.n))
    end
    return 'done', false, result[2]
end

function internal.forget(id)
    jobs[id] = nil
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
G.xpcall = function(f, handler, ...)
    return rethrow_fatal(pack(raw_xpcall(f, function(e)
        if is_fatal(e) then return e end
        return handler(e)
    end, ...)))
end

-- User coroutines pass our operation requests through to the driver.
local function user_resume(co, ...)
    local r = pack(raw_resume(co, ...))
    while r[1] and r[2] == OP and raw_status(co) == 'suspended' do
        local answer = pack(raw_yield(unpack(r, 2, r.n)))
        r = pack(raw_resume(co, unpack(answer, 1, answer.n)))
    end
    if not r[1] and is_fatal(r[2]) then error(r[2], 0) end
    return unpack(r, 1, r.n)
end
G.coroutine = {
    create = coroutine.create, status = coroutine.status, yield = coroutine.yield,
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
        if message ~= nil and select('#', ...) > 0 then message = string_format(message, ...) end
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
G.queue = queue

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
        if space_cache_version ~= schema_version then
            space_cache, space_cache_version = {}, schema_version
        end
        local cached = space_cache[ref]
        if cached ~= nil then return cached end
        local info = op('space_info', ref)
        if info == nil then return nil end
        local object = space_object(info)
        if space_cache_version == schema_version then space_cache[ref] = object end
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

-- What user code defined that CALL may reach: names of globals holding functions, and of
-- globals holding tables (for `app.handler` and `app:method`).
local builtin = {}
for k in pairs(G) do builtin[k] = true end
function internal.user_functions()
    local functions, tables = {}, {}
    for k, v in pairs(G) do
        if type(k) == 'string' and not builtin[k] then
            if type(v) == 'function' then
                functions[#functions + 1] = k
            elseif type(v) == 'table' then
                tables[#tables + 1] = k
            end
        end
    end
    return functions, tables
end

-- Compile a chunk in the sandbox; nil and the message when it does not compile.
function internal.compile(code, chunkname)
    if code:byte(1) == 27 then return nil, 'bytecode is not accepted' end
    local fn, err = loadstring(code, chunkname)
    if not fn then return nil, err end
    return setfenv(fn, G), nil
end

-- A global function by name, for CALL: `f`, `app.handler`, or `app:method` (called with `app`
-- as its first argument, as Tarantool does). Returns the function and the object, if any.
local function lookup(path)
    local v = G
    for part in string.gmatch(path, '[^.]+') do
        if type(v) ~= 'table' then return nil end
        v = v[part]
    end
    return v
end
function internal.global_function(name)
    local object_path, method = string.match(name, '^(.+):([^.:]+)$')
    if object_path then
        local object = lookup(object_path)
        if type(object) ~= 'table' then return nil, nil end
        local fn = object[method]
        if type(fn) == 'function' then return fn, object end
        return nil, nil
    end
    local v = lookup(name)
    if type(v) == 'function' then return v, nil end
    return nil, nil
end

function internal.collect()
    collectgarbage('collect')
end

return internal
