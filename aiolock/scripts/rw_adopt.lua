-- rw_adopt: hand a write hold to another owner (client.adopt), or give it
-- back (the undo of an adopt whose reply was lost).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}          (layout: _rw_common.lua)
-- KEYS[2]  handed hash  <prefix>:{<name>}:handed   fields: "w|<owner handed over>" -> token
-- ARGV[1]  from         the writer as the handle names it "<client id>:<task serial>"
-- ARGV[2]  token        fencing token of the write hold (unchanged by the handoff)
-- ARGV[3]  to           the new writer
-- ARGV[4]  lease_ms     the hold is made to last at least this long (0: its expiry
--                       is kept: a fixed lease)
-- ARGV[5]  handed_ms    how long the handed hash keeps a record past the hold's expiry
-- ARGV[6]  mode         "adopt", or "back" (give it back: from <- to, as undone)
--
-- Returns {1, ms left} when `to` is the writer after the call with `token`
--   (moved from `from`, its acquire nonce dropped; the record "w|from -> token"
--   written in the handed hash, read by handed.lua), or already was (a retry).
-- Returns {0, 0} when `from` is not the live writer with `token` (expired,
--   released, force-released, adopted already): nothing changed.
-- A read hold of `from` (a writer that also reads) stays with `from`.
-- Mode "back": {1, ms left} if the hold went back from `to` to `from` and the
--   record was removed (the Client of `from` had not read it yet); else {0, 0}.
-- Refused (WRONGTYPE, nothing changed) if a key holds a value of another type.
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash')
local key, handed = KEYS[1], KEYS[2]
local from, token, to = ARGV[1], ARGV[2], ARGV[3]
if not rw_kind_ok(key) or redis.call('HGET', key, 'wt') ~= token then
    return {0, 0}
end
local now = clock_ms()
local left = tonumber(redis.call('HGET', key, 'wx') or '0') - now
if left <= 0 then
    return {0, 0}
end
local writer = redis.call('HGET', key, 'w')
local record = 'w|' .. from
if ARGV[6] == 'back' then
    if writer ~= to or redis.call('HGET', handed, record) ~= token then
        return {0, 0}
    end
    redis.call('HSET', key, 'w', from)
    redis.call('HDEL', handed, record)
    return {1, left}
end
if writer == to then
    return {1, left} -- adopted already by this very call
end
if writer ~= from then
    return {0, 0}
end
redis.call('HSET', key, 'w', to)
redis.call('HDEL', key, 'wn')
local lease_ms = tonumber(ARGV[4])
if lease_ms > left then
    rw_extend(key, 'wx', now, lease_ms)
    left = lease_ms
end
redis.call('HSET', handed, record, token)
local keep = left + tonumber(ARGV[5])
if redis.call('PTTL', handed) < keep then
    redis.call('PEXPIRE', handed, keep)
end
return {1, left}
