-- rw_state: who holds a read-write lock right now. Read-only.
--
-- KEYS[1]  lock hash   <prefix>:{<name>}   (layout: _rw_common.lua)
--
-- Returns {writer_ms, readers, readers_ms}:
--   writer_ms   ms left of the write hold, or -2 if nobody holds it for writing
--   readers     how many live read holds there are
--   readers_ms  ms until the last live read hold expires unless renewed, or -2 if none
-- Expired holds not yet purged are not counted.
--@runner no-writes  (it only reads: its Redis Function is flagged no-writes)
--@include _rw_common.lua
local key = KEYS[1]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
local writer_ms = -2
local wx = tonumber(redis.call('HGET', key, 'wx') or '0')
if wx > now then
    writer_ms = wx - now
end
local readers, last = 0, 0
local flat = redis.call('HGETALL', key)
for i = 1, #flat, 2 do
    if string.sub(flat[i], 1, 2) == 'x:' then
        local expiry = tonumber(flat[i + 1])
        if expiry > now then
            readers = readers + 1
            if expiry > last then
                last = expiry
            end
        end
    end
end
local readers_ms = -2
if readers > 0 then
    readers_ms = last - now
end
return {writer_ms, readers, readers_ms}
