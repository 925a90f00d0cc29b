-- Shared snippet (included by every script that writes): refuse a key that
-- holds a value of another type than aiolock keeps there, BEFORE the first
-- write, so a refused script changes nothing (Redis does not roll back the
-- writes a script made before an error).
--
-- check_types(keys, t1, t2, ...)   keys[i] must be missing or of type ti
-- check_all(keys, t)               every key must be missing or of type t
--   t: 'hash', 'zset', 'list' (as TYPE answers). One TYPE per key.
--   Raises "WRONGTYPE aiolock: key <key> holds a <type>, not the <t> ...":
--   the prefix makes clients see it as Redis' own WRONGTYPE error.
local function wrong_type(key, found, want)
    error({err = string.format(
        'WRONGTYPE aiolock: key %s holds a %s, not the %s aiolock keeps there '
        .. '(written by someone else, or a name shared with another kind of data); '
        .. 'nothing was changed: delete the key or use another name', key, found, want)})
end

local function check_types(keys, ...)
    for i = 1, select('#', ...) do
        local found = redis.call('TYPE', keys[i])['ok']
        local want = select(i, ...)
        if found ~= want and found ~= 'none' then
            wrong_type(keys[i], found, want)
        end
    end
end

local function check_all(keys, want)
    for i = 1, #keys do
        local found = redis.call('TYPE', keys[i])['ok']
        if found ~= want and found ~= 'none' then
            wrong_type(keys[i], found, want)
        end
    end
end

-- A script that must not fail (the watchdog's batch renewals: one stray key
-- must not stop the renewal of every other hold) asks instead: does `key`
-- hold a value of type `want`? (false if it is missing or of another type)
local function is_type(key, want)
    return redis.call('TYPE', key)['ok'] == want
end
