-- redlock_acquire: one master's part of a Redlock acquisition attempt: take the
-- lock key, read what choosing a fencing token needs, and accept a proposed
-- token at once if this master can (see aiolock/_redlock.py).
--
-- KEYS[1]  lock key     <prefix>:{<name>}:rl         string "<owner>|<attempt id>", with a TTL
-- KEYS[2]  fence hash   <prefix>:{<name>}:rl:fence   t -> highest token accepted here, g -> its generation id
-- KEYS[3]  generation   <prefix>:redlock:gen         "<random id>/<created, server clock us>/<run_id>", no TTL
-- KEYS[4]  roster       <prefix>:redlock:roster      set: the founding generation ids
-- ARGV[1]  value        "<owner>|<attempt id>" (unique per attempt)
-- ARGV[2]  lease_ms     TTL of the lock key
-- ARGV[3]  new_gen      a random id: this master's generation id if it has none yet
-- ARGV[4]  proposed     a proposed token (decimal), or "0": none
-- ARGV[5]  retention_ms TTL of the fence hash
-- ARGV[6]  trust_us     how old a generation must be for its missing counters to be trusted
-- ARGV[7..] roster      the founding generation ids the caller knows
--
-- If the lock is granted here and a token is proposed that is not below the
-- server clock, it is offered to fence_accept (_redlock_fence.lua) after the
-- counter was read.
--
-- Returns {granted, pttl, counter, clock_us, generation, roster, accepted}:
--   granted  1 if the lock key now holds `value` (set now, or already ours:
--            a retried attempt; its TTL is reset to lease_ms), else 0;
--   pttl     the holder's remaining TTL in ms when not granted (-1: no TTL), else 0;
--   counter  the fence counter before this call (decimal string), or "" if
--            absent (never accepted a token in this master's current
--            generation: a counter of an older one is absent; or expired);
--   clock_us the server clock in microseconds (decimal string);
--   generation  "<id>/<created us>/<run_id>";
--   roster   the founding generation ids this master knows (maybe empty);
--   accepted the proposed token's fate: fence_accept's 1, 0 or -1; 0 also when
--            nothing was proposed, the lock was not granted, or the token is
--            below the server clock.
-- Writes the lock key, the fence counter (an accepted token), and once per
-- master life its generation; the roster if it has none.
--@include _redlock_fence.lua
--@include _types.lua
check_types(KEYS, 'string', 'hash', 'string', 'set')
local clock = server_clock_us()
local gen, id, created = generation(KEYS[3], ARGV[3], clock)
add_roster(KEYS[4], 7)
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
local read = counter(KEYS[2], id) or ''
local accepted = 0
local proposed = tonumber(ARGV[4])
if granted == 1 and proposed > 0 and proposed >= clock then
    accepted = fence_accept(KEYS[2], id, created, clock, ARGV[4], ARGV[5], ARGV[6], 7)
end
return {granted, pttl, read, string.format('%d', clock), gen,
    redis.call('SMEMBERS', KEYS[4]), accepted}
