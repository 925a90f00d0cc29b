-- sem_adopt: hand a semaphore permit (one acquisition) to another holder
-- (client.adopt), or give it back (the undo of an adopt whose reply was lost).
--
-- KEYS[1]  holder zset   <prefix>:{<name>}:h        (layout: see _sem.lua)
-- KEYS[2]  handed hash   <prefix>:{<name>}:handed   fields: <member handed over> -> token
-- ARGV[1]  from          the acquisition's member "<permits>|<holder id>", as the
--                        handle names it
-- ARGV[2]  token         its fencing token (recorded; the holder zset keeps none)
-- ARGV[3]  to            the new member (same permits, the adopter's holder id)
-- ARGV[4]  lease_ms      the permit is made to last at least this long (0: its
--                        expiry is kept: a fixed lease)
-- ARGV[5]  handed_ms     how long the handed hash keeps a record past the expiry
-- ARGV[6]  mode          "adopt", or "back" (give it back: from <- to, as undone)
--
-- Returns {1, ms left} when `to` holds the permits after the call (moved from
--   `from` with its expiry; the record "from -> token" written in the handed
--   hash, read by handed.lua), or already did (a retry).
-- Returns {0, 0} when `from` holds nothing live (expired, released,
--   force-released, adopted already): nothing changed.
-- Mode "back": {1, ms left} if the permits went back from `to` to `from` and
--   the record was removed (the Client of `from` had not read it yet); else {0, 0}.
-- The permits in use do not change: no waiter is woken.
-- Refused (WRONGTYPE, nothing changed) if a key holds a value of another type.
--@include _clock.lua
--@include _types.lua
check_types(KEYS, 'zset', 'hash')
local holders, handed = KEYS[1], KEYS[2]
local from, token, to = ARGV[1], ARGV[2], ARGV[3]
local now = clock_ms()
if ARGV[6] == 'back' then
    local score = tonumber(redis.call('ZSCORE', holders, to))
    if not score or score <= now or redis.call('HGET', handed, from) ~= token then
        return {0, 0}
    end
    redis.call('ZREM', holders, to)
    redis.call('ZADD', holders, score, from)
    redis.call('HDEL', handed, from)
    return {1, score - now}
end
local mine = tonumber(redis.call('ZSCORE', holders, to))
if mine and mine > now then
    return {1, mine - now} -- adopted already by this very call
end
local score = tonumber(redis.call('ZSCORE', holders, from))
if not score or score <= now then
    return {0, 0}
end
local lease_ms = tonumber(ARGV[4])
if lease_ms > 0 and score < now + lease_ms then
    score = now + lease_ms
end
redis.call('ZREM', holders, from)
redis.call('ZADD', holders, score, to)
local pttl = redis.call('PTTL', holders)
if pttl >= 0 and pttl < score - now + 1000 then
    redis.call('PEXPIRE', holders, score - now + 1000)
end
redis.call('HSET', handed, from, token)
local keep = score - now + tonumber(ARGV[5])
if redis.call('PTTL', handed) < keep then
    redis.call('PEXPIRE', handed, keep)
end
return {1, score - now}
