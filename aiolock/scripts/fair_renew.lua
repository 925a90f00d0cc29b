-- fair_renew: the watchdog's batch renewal of fair-lock holds; also extend().
--
-- KEYS[i]      lock hash of the i-th hold   <prefix>:{<name>}
-- ARGV[1]      lease_ms  each hold still ours is made to last at least this long
-- ARGV[2i]     wid of the i-th hold
-- ARGV[2i+1]   fencing token of the i-th hold
--
-- Returns one integer per key: 1 if the hold is still this wid's with this
-- token and now lasts at least lease_ms (never shortened), 0 if it is gone.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@include _types.lua
local result = {}
local lease_ms = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
    if is_type(key, 'hash') and redis.call('HEXISTS', key, ARGV[2 * i]) == 1
        and redis.call('HGET', key, '~fence') == ARGV[2 * i + 1] then
        if redis.call('PTTL', key) < lease_ms then
            redis.call('PEXPIRE', key, lease_ms)
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
