-- latch_check: a waiter's look at a latch; keeps a counting latch alive while waited on.
--
-- KEYS[1]  latch hash  <prefix>:{<name>}   (fields: see latch_set.lua)
-- ARGV[1]  retention_ms
--
-- Returns {count, generation} (0 for absent fields). A counting latch's TTL
-- is raised to retention_ms if it was shorter: a latch somebody waits on
-- does not expire.
--@include _types.lua
check_types(KEYS, 'hash')
local v = redis.call('HMGET', KEYS[1], 'c', 'g')
local c = tonumber(v[1]) or 0
if c > 0 and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {c, tonumber(v[2]) or 0}
