-- Shared snippet: the batch loop of the watchdog's renewal scripts (renew,
-- fair_renew, fair_live, rw_renew, rw_renew_wait, sem_renew), and the renewal
-- of a hold kept as a field of a lock hash (renew, fair_renew).
--
-- renew_each(renew_one)   calls renew_one(i, KEYS[i]) for every key, in order,
--   and returns one integer per key: 1 where it returned true (still there,
--   renewed), 0 where it returned false (gone). renew_one must not fail on a
--   key of another type (it asks is_type or read_typed, _types.lua): one
--   stray key must not stop the renewal of every other item of the batch.
-- renew_field(key, field, token, lease_ms)   whether the lock hash `key`
--   still has the holder `field` with fencing token `token`; if so its TTL
--   is made at least lease_ms (never shortened; lease_ms 0: only checked,
--   as the watchdog checks a fixed lease).
local function renew_each(renew_one)
    local result = {}
    for i, key in ipairs(KEYS) do
        result[i] = renew_one(i, key) and 1 or 0
    end
    return result
end

local function renew_field(key, field, token, lease_ms)
    if read_typed('HEXISTS', key, field) == 1 -- nil on a key of another type
        and redis.call('HGET', key, '~fence') == token then
        if lease_ms > 0 and redis.call('PTTL', key) < lease_ms then
            redis.call('PEXPIRE', key, lease_ms)
        end
        return true
    end
    return false
end
