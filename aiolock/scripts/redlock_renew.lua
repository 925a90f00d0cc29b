-- redlock_renew: renew many Redlock holds on one master (a watchdog round; extend()).
--
-- KEYS[i]    lock key of the i-th hold   <prefix>:{<name>}:rl
-- ARGV[1]    lease_ms  each hold still ours is made to last at least this long
--            (0: only check, extend nothing: the watchdog checking a fixed lease)
-- ARGV[i+1]  value of the i-th hold ("<owner>|<attempt id>")
--
-- Returns one integer per key: 1 if the key still holds that value (its TTL
-- is now at least lease_ms, never shortened), 0 if it is gone or taken.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _types.lua
local lease_ms = tonumber(ARGV[1])
local result = {}
for i, key in ipairs(KEYS) do
    if is_type(key, 'string') and redis.call('GET', key) == ARGV[i + 1] then
        if lease_ms > 0 and redis.call('PTTL', key) < lease_ms then
            redis.call('PEXPIRE', key, lease_ms)
        end
        result[i] = 1
    else
        result[i] = 0
    end
end
return result
