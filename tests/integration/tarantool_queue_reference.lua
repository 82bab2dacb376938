-- A real Tarantool with the tarantool/queue module (the folder in TT_QUEUE_MODULE), so that
-- tests/integration/test_queue_module.py can be run against it (BOXQUEUE_TEST_TARGET=tarantool):
-- a check that its expectations are the module's.
local port, dir, module = os.getenv('TT_PORT'), os.getenv('TT_DIR'), os.getenv('TT_QUEUE_MODULE')
package.path = module .. '/?.lua;' .. module .. '/?/init.lua;' .. package.path
box.cfg{work_dir = dir, log = dir .. '/tarantool.log'}
box.once('init', function()
  box.schema.user.grant('guest', 'read,write,execute,create,drop,alter', 'universe')
  box.schema.user.passwd('admin', 'adminpw')
end)
queue = require('queue')
box.cfg{listen = '127.0.0.1:' .. port}
