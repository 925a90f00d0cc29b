-- fair_renew: the watchdog's batch renewal of fair-lock holds; also extend().
--
-- KEYS[i]      lock hash of the i-th hold   <prefix>:{<name>}
-- ARGV[1]      lease_ms  each hold still ours is made to last at least this long
-- ARGV[2i]     wid of the i-th hold
-- ARGV[2i+1]   fencing token of the i-th hold
--
-- Returns one integer per key: 1 if the hold is still this wid's with this
-- token and now lasts at least lease_ms (never shortened), 0 if it is gone.
local result = {}
local lease_ms = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
    if redis.call('HEXISTS', key, ARGV[2 * i]) == 1
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
