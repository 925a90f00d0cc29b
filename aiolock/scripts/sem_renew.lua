-- sem_renew: the watchdog's batch renewal of semaphore holds; also extend().
--
-- KEYS[i]    holder zset of the i-th hold   <prefix>:{<name>}:h   (see _sem.lua)
-- ARGV[1]    lease_ms  each hold still alive is made to last at least this long
--            (0: only check, extend nothing: the watchdog checking a fixed lease)
-- ARGV[i+1]  member of the i-th hold        "<permits>|<holder id>"
--
-- Returns one integer per key: 1 if the member still holds (its expiry is now
-- at least now + lease_ms, never shortened, and the zset lives at least as
-- long), 0 if it is gone or already expired (lost; never revived).
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@runner renewal allow-oom  (a watchdog batch: one key per item of many names;
--           cross-slot; as a Redis Function it runs out of memory too)
--@include _clock.lua
--@include _types.lua
--@include _renew.lua
local lease_ms = tonumber(ARGV[1])
local now = clock_ms()
return renew_each(function(i, key)
    local member = ARGV[i + 1]
    local score = is_type(key, 'zset') and tonumber(redis.call('ZSCORE', key, member))
    if score and score > now then
        local want = now + lease_ms
        if lease_ms > 0 and score < want then
            redis.call('ZADD', key, 'XX', want, member)
            score = want
        end
        local pttl = redis.call('PTTL', key)
        if lease_ms > 0 and pttl >= 0 and pttl < score - now + 1000 then
            redis.call('PEXPIRE', key, score - now + 1000)
        end
        return true
    end
    return false
end)
