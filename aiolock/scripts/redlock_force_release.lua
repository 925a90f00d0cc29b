-- redlock_force_release: delete one master's part of a Redlock lock, whoever holds it.
--
-- KEYS[1]  lock key     <prefix>:{<name>}:rl
-- ARGV[1]  channel      the name's Redlock channel: "*" is published if it was held
-- ARGV[2]  lost_prefix  template of a Client's eviction channel, "<prefix>:lost:"
--                       (+ client id: _evict.lua)
--
-- Returns 1 if the key existed (deleted, waiters woken), else 0. The fence
-- hash is kept: tokens keep increasing. The holder is told on the eviction
-- channel of the Client its owner id names (its Redlock's first Client: each
-- of its Clients listens there on its own master): "v <value>", the value
-- deleted ("<owner>|<attempt id>", unique to the hold).
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _types.lua
check_types(KEYS, 'string')
local value = redis.call('GET', KEYS[1])
if not value then
    return 0
end
redis.call('DEL', KEYS[1])
local cid = string.match(value, '^(%x+):')
if cid and ARGV[2] and ARGV[2] ~= '' then
    redis.call('PUBLISH', ARGV[2] .. cid, 'v ' .. value)
end
redis.call('PUBLISH', ARGV[1], '*')
return 1
