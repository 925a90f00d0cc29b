-- rw_renew: the watchdog's batch renewal of read and write holds; also extend().
--
-- KEYS[i]      lock hash of the i-th hold   <prefix>:{<name>}  (layout: _rw_common.lua)
-- ARGV[1]      lease_ms: each hold still ours is made to last at least this long
--              (0: only check, extend nothing: the watchdog checking a fixed lease)
-- ARGV[3i-1]   kind of the i-th hold: "r" (read) or "w" (write)
-- ARGV[3i]     owner of the i-th hold
-- ARGV[3i+1]   fencing token of the i-th hold
--
-- Returns one integer per key: 1 if the hold is still this owner's (same
-- token, not expired) and now lasts at least lease_ms (never shortened), 0 if
-- it is gone (expired, force-released): lost.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@runner renewal allow-oom  (a watchdog batch: one key per item of many names;
--           cross-slot; as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
--@include _renew.lua
local now = clock_ms()
local lease = tonumber(ARGV[1])
return renew_each(function(i, key)
    local kind, owner, token = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
    local ours, field = false, 'wx'
    if not is_type(key, 'hash') then -- missing, or overwritten: gone
        ours = false
    elseif kind == 'w' then
        ours = redis.call('HGET', key, 'w') == owner and redis.call('HGET', key, 'wt') == token
    else
        field = 'x:' .. owner
        ours = redis.call('HGET', key, 'r:' .. owner) == token
    end
    if ours and tonumber(redis.call('HGET', key, field) or '0') > now then
        if lease > 0 then
            rw_extend(key, field, now, lease)
        end
        return true
    end
    return false
end)
