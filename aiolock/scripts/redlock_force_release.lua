-- redlock_force_release: delete one master's part of a Redlock lock, whoever holds it.
--
-- KEYS[1]  lock key     <prefix>:{<name>}:rl
-- ARGV[1]  channel      the name's Redlock channel: "*" is published if it was held
--
-- Returns 1 if the key existed (deleted, waiters woken), else 0. The fence
-- hash is kept: tokens keep increasing.
--@include _types.lua
check_types(KEYS, 'string')
if redis.call('DEL', KEYS[1]) == 0 then
    return 0
end
redis.call('PUBLISH', ARGV[1], '*')
return 1
