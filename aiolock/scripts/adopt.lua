-- adopt: hand a lock or fair-lock hold to another owner (client.adopt), or
-- give it back (the undo of an adopt whose reply was lost).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}          fields: <holder> -> count, "~fence" -> token
-- KEYS[2]  handed hash  <prefix>:{<name>}:handed   fields: <holder handed over> -> its token
-- ARGV[1]  from         the holder field of the hold (the owner of a lock, the
--                       waiter id of a fair lock) as the handle names it
-- ARGV[2]  token        fencing token of the hold (unchanged by the handoff)
-- ARGV[3]  to           the new holder field
-- ARGV[4]  lease_ms     the hold is made to last at least this long (0: its TTL is
--                       kept: a fixed lease)
-- ARGV[5]  handed_ms    how long the handed hash keeps a record past the hold's TTL
-- ARGV[6]  mode         "adopt", or "back" (give it back: from <- to, as undone)
--
-- Returns {1, pttl} when `to` holds the lock after the call with `token`:
--   the field moved from `from` (same count, same token), the record
--   "from -> token" written in the handed hash (the Client of `from` reads it
--   when it finds the hold gone: handed over, not lost; see handed.lua), or
--   `to` held it already (a retried adopt). pttl: the hold's TTL in ms.
-- Returns {0, 0} when `from` does not hold it with `token` (expired,
--   released, force-released, or adopted already): nothing changed.
-- Mode "back": returns {1, pttl} if the hold went back from `to` to `from`
--   and the record was removed (the Client of `from` had not read it yet:
--   it still renews the hold); {0, 0} otherwise (nothing changed).
-- Refused (WRONGTYPE, nothing changed) if a key holds a value of another type.
--@include _types.lua
local lock, handed = KEYS[1], KEYS[2]
check_types(KEYS, 'hash', 'hash')
local from, token, to = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', lock, '~fence') ~= token then
    return {0, 0}
end
if ARGV[6] == 'back' then
    if redis.call('HEXISTS', lock, to) == 0 or redis.call('HGET', handed, from) ~= token then
        return {0, 0}
    end
    local count = redis.call('HGET', lock, to)
    redis.call('HDEL', lock, to)
    redis.call('HSET', lock, from, count)
    redis.call('HDEL', handed, from)
    return {1, redis.call('PTTL', lock)}
end
if redis.call('HEXISTS', lock, to) == 1 then
    return {1, redis.call('PTTL', lock)} -- adopted already by this very call
end
local count = redis.call('HGET', lock, from)
if not count then
    return {0, 0}
end
redis.call('HDEL', lock, from)
redis.call('HSET', lock, to, count)
local lease_ms = tonumber(ARGV[4])
local pttl = redis.call('PTTL', lock)
if lease_ms > 0 and pttl >= 0 and pttl < lease_ms then
    redis.call('PEXPIRE', lock, lease_ms)
    pttl = lease_ms
end
redis.call('HSET', handed, from, token)
local keep = math.max(pttl, 0) + tonumber(ARGV[5])
if redis.call('PTTL', handed) < keep then
    redis.call('PEXPIRE', handed, keep)
end
return {1, pttl}
