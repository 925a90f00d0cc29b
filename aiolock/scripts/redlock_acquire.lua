-- redlock_acquire: one master's part of a Redlock acquisition attempt; also
-- reads what the attempt needs to choose a fencing token (see aiolock/_redlock.py).
--
-- KEYS[1]  lock key     <prefix>:{<name>}:rl         string "<owner>|<attempt id>", with a TTL
-- KEYS[2]  fence hash   <prefix>:{<name>}:rl:fence   field t -> highest token written back here
-- KEYS[3]  generation   <prefix>:redlock:gen         "<random id>:<created, server clock us>", no TTL
-- KEYS[4]  roster       <prefix>:redlock:roster      set: the founding generations (see _redlock.py)
-- ARGV[1]  value        "<owner>|<attempt id>" (unique per attempt)
-- ARGV[2]  lease_ms     TTL of the lock key
-- ARGV[3]  new_gen      a random id: this master's generation id if it has none yet
--
-- Returns {granted, pttl, counter, clock_us, generation, roster}:
--   granted  1 if the lock key now holds `value` (set now, or already ours:
--            a retried attempt; its TTL is reset to lease_ms), else 0;
--   pttl     the holder's remaining TTL in ms when not granted (-1: no TTL), else 0;
--   counter  the fence counter as a decimal string, or "" if the fence hash
--            is absent (never written in this master's current generation, or expired);
--   clock_us the server clock in microseconds (decimal string);
--   generation  "<id>:<created us>" (created now, without a TTL, if absent);
--   roster   the founding generation ids this master knows (an array, maybe empty).
-- Writes nothing but the lock key and, once per master life, the generation
-- (the fence counter is written only by redlock_fence.lua).
--@include _types.lua
check_types(KEYS, 'string', 'hash', 'string', 'set')
local now = redis.call('TIME')
local clock = string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]))
local gen = redis.call('GET', KEYS[3])
if not gen then
    gen = ARGV[3] .. ':' .. clock
    redis.call('SET', KEYS[3], gen)
end
local granted, pttl = 0, 0
local current = redis.call('GET', KEYS[1])
if not current then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    granted = 1
elseif current == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    granted = 1
else
    pttl = redis.call('PTTL', KEYS[1])
end
local counter = redis.call('HGET', KEYS[2], 't') or ''
return {granted, pttl, counter, clock, gen, redis.call('SMEMBERS', KEYS[4])}
