-- The spaces of tests/integration/conftest.py on a real Tarantool, so the same tests can be run
-- against it (BOXQUEUE_TEST_TARGET=tarantool) to check that their expectations are Tarantool's.
local port, dir = os.getenv('TT_PORT'), os.getenv('TT_DIR')
box.cfg{work_dir = dir, log = dir .. '/tarantool.log'}
box.once('init', function()
  box.schema.user.grant('guest', 'read,write,execute', 'universe')
  local t = box.schema.space.create('test', {id = 512, format = {
    {name = 'id', type = 'unsigned'}, {name = 'name', type = 'string'},
    {name = 'val', type = 'any', is_nullable = true}}})
  t:create_index('primary', {parts = {{1, 'unsigned'}}})
  t:create_index('name', {unique = false, parts = {{2, 'string'}}})
  local h = box.schema.space.create('hsh', {id = 513})
  h:create_index('pk', {type = 'hash', parts = {{1, 'string'}}})
  local m = box.schema.space.create('multi', {id = 514})
  m:create_index('primary', {parts = {{1, 'unsigned'}}})
  m:create_index('pair', {unique = false, parts = {{2, 'unsigned'}, {3, 'string'}}})
  local s = box.schema.space.create('scalars', {id = 515})
  s:create_index('primary', {parts = {{1, 'scalar'}}})
  local ty = box.schema.space.create('typed', {id = 516, format = {
    {name = 'id', type = 'unsigned'}, {name = 'i', type = 'integer'}, {name = 'n', type = 'number'},
    {name = 'd', type = 'double'}, {name = 's', type = 'string'}, {name = 'b', type = 'boolean'},
    {name = 'v', type = 'varbinary'}, {name = 'sc', type = 'scalar'}, {name = 'u', type = 'uuid'},
    {name = 'dec', type = 'decimal'}, {name = 'dt', type = 'any'}, {name = 'a', type = 'any'},
    {name = 'opt', type = 'string', is_nullable = true}}})
  ty:create_index('primary', {parts = {{1, 'unsigned'}}})
  ty:create_index('by_uuid', {parts = {{9, 'uuid'}}})
  ty:create_index('by_opt', {parts = {{13, 'string', is_nullable = true}}})
  local l = box.schema.space.create('longkeys', {id = 517})
  l:create_index('primary', {parts = {{1, 'string'}}})
  l:create_index('tag', {unique = false, parts = {{2, 'string'}}})
  box.schema.user.create('alice', {password = 'secret'})
  box.schema.user.grant('alice', 'read,write,execute', 'universe')
  box.schema.user.create('reader', {password = 'r'})
  box.schema.user.grant('reader', 'read', 'space', 'test')
end)
-- listen only once everything exists, so a client never sees a half-made schema
box.cfg{listen = '127.0.0.1:' .. port}
