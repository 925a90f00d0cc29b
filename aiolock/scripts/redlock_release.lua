-- redlock_release: release one master's part of a Redlock hold, or undo an
-- attempt (by its value: safe whether or not the attempt ran here). Idempotent.
--
-- KEYS[1]  lock key     <prefix>:{<name>}:rl
-- ARGV[1]  value        "<owner>|<attempt id>" of the hold or attempt
-- ARGV[2]  channel      the name's Redlock channel: "*" is published on a release
--
-- Returns 1 if the key held `value` and was deleted (waiters woken), else 0.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _types.lua
if not is_type(KEYS[1], 'string') or redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '*')
return 1
