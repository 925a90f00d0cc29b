-- rw_owned: does this owner still have this read or write hold? Read-only.
--
-- KEYS[1]  lock hash   <prefix>:{<name>}   (layout: _rw_common.lua)
-- ARGV[1]  kind        "r" (read) or "w" (write)
-- ARGV[2]  owner
-- ARGV[3]  token
--
-- Returns the ms left of the hold when it is still this owner's with this
-- token and not expired, or -2 when it is not.
--@runner no-writes  (it only reads: its Redis Function is flagged no-writes)
--@include _rw_common.lua
local key, kind, owner, token = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local field, ours
if kind == 'w' then
    field = 'wx'
    ours = redis.call('HGET', key, 'w') == owner and redis.call('HGET', key, 'wt') == token
else
    field = 'x:' .. owner
    ours = redis.call('HGET', key, 'r:' .. owner) == token
end
if not ours then
    return -2
end
local left = tonumber(redis.call('HGET', key, field) or '0') - clock_ms()
if left <= 0 then
    return -2
end
return left
