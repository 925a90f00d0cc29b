-- rw_renew_wait: the watchdog's batch renewal of waiting-writer entries.
--
-- KEYS[i]      waiting writers of the i-th entry   <prefix>:{<name>}:wq
--              (zset "<owner>#<nonce>" -> expiry ms)
-- ARGV[1]      wait_ms: each entry still there is made to last at least this long
-- ARGV[i+1]    the i-th entry, "<owner>#<nonce>"
--
-- Returns one integer per key: 1 if the entry was still there (not expired)
-- and now lasts at least wait_ms (never shortened), 0 if it is gone.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@runner renewal allow-oom  (a watchdog batch: one key per item of many names;
--           cross-slot; as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
--@include _renew.lua
local now = clock_ms()
local ms = tonumber(ARGV[1])
return renew_each(function(i, key)
    local owner = ARGV[i + 1]
    local expiry = 0
    if is_type(key, 'zset') then
        expiry = tonumber(redis.call('ZSCORE', key, owner) or '0')
    end
    if expiry > now then
        rw_zkeep(key, owner, now + ms, now)
        return true
    end
    return false
end)
