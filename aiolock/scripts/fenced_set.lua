-- fenced_set: write a value only if the writer's fencing token is not lower
-- than the newest token the key has accepted (Client.fenced_set).
--
-- KEYS[1]  value key    <key>, the caller's own key: a plain string (GET reads it)
-- KEYS[2]  fence key    <prefix>:fenced:{<slot tag>}:<key>: a plain string, the
--                       newest accepted token in decimal; in the slot of KEYS[1]
--                       (the tag is that slot's, see _primitives/fenced.py)
-- ARGV[1]  value        what to write at KEYS[1]
-- ARGV[2]  token        the writer's fencing token: decimal digits, no sign, no
--                       leading zeros (compared as such: exact beyond 2^53)
-- ARGV[3]  ttl_ms       the TTL of the value and its fence, in ms; "0": none
--
-- Returns 1 if it wrote: there was no fence, or the token is >= the fence
--   (equal: the same holder writing again). The value is ARGV[1], the fence
--   the token, and both have the TTL ttl_ms (or none: both persist), so the
--   fence lives as long as the value it guards.
-- Returns 0 if the token is lower than the fence: nothing changes.
-- Refused (WRONGTYPE, nothing changed) if either key holds a value that is not
-- a string.
--@include _types.lua
check_types(KEYS, 'string', 'string')
local token, fence = ARGV[2], redis.call('GET', KEYS[2])
-- Decimal strings without leading zeros: the shorter is the lower.
if fence and (#token < #fence or (#token == #fence and token < fence)) then
    return 0
end
local ttl_ms = tonumber(ARGV[3])
if ttl_ms > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl_ms)
    redis.call('SET', KEYS[2], token, 'PX', ttl_ms)
else
    redis.call('SET', KEYS[1], ARGV[1])
    redis.call('SET', KEYS[2], token)
end
return 1
