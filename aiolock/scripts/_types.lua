-- Shared snippet (included by every script that writes): refuse a key that
-- holds a value of another type than aiolock keeps there, BEFORE the first
-- write, so a refused script changes nothing (Redis does not roll back the
-- writes a script made before an error).
--
-- check_types(keys, t1, t2, ...)   keys[i] must be missing or of type ti (a type
--                                  past the last key is ignored: optional keys)
-- check_all(keys, t)               every key must be missing or of type t
--   t: 'hash', 'zset', 'list' (as TYPE answers). One TYPE per key.
--   Raises "WRONGTYPE aiolock: key <key> holds a <type>, not the <t> ...":
--   the prefix makes clients see it as Redis' own WRONGTYPE error.
-- Every key a script may write, on any path, is checked before its first
-- write; an acquire script also checks the keys its primitive's release and
-- wake-ups will write, so a cycle is refused at its start, never half done.
local function wrong_type(key, found, want)
    error({err = string.format(
        'WRONGTYPE aiolock: key %s holds a %s, not the %s aiolock keeps there '
        .. '(written by someone else, or a name shared with another kind of data); '
        .. 'nothing was changed: delete the key or use another name', key, found, want)})
end

local function check_types(keys, ...)
    for i = 1, math.min(select('#', ...), #keys) do
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

-- typed(want, command, key, ...) -> reply
--   redis.call(command, key, ...) where the key must be missing or of type
--   `want`, for a command that reads (or is the first write of the script)
--   and fails with WRONGTYPE on a key of another type, before any write:
--   then it raises the error above, naming the key. A check that costs no
--   command on the hot path (TYPE runs only to word the error).
local function typed(want, command, key, ...)
    local reply = redis.pcall(command, key, ...)
    if type(reply) == 'table' and reply.err then
        if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
            wrong_type(key, redis.call('TYPE', key)['ok'], want)
        end
        error(reply)
    end
    return reply
end

-- read_typed(command, key, ...) -> reply, or nil if the key holds a value of
--   another type (WRONGTYPE); any other error is raised. For the scripts
--   that must not fail (below), without a TYPE per key.
local function read_typed(command, key, ...)
    local reply = redis.pcall(command, key, ...)
    if type(reply) == 'table' and reply.err then
        if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
            return nil
        end
        error(reply)
    end
    return reply
end

-- check_some(keys, t1, t2, ...)   check_types, at the cost of one EXISTS when
--   none of the keys exists (keys written only when someone waits: waiting
--   sets, wake-up lists, release records).
-- Lua 5.1 (Redis, Valkey) has the global unpack, Lua 5.4 table.unpack.
local unpack = table.unpack or unpack

local function check_some(keys, ...)
    if redis.call('EXISTS', unpack(keys)) > 0 then
        check_types(keys, ...)
    end
end

-- A script that must not fail (the watchdog's batch renewals: one stray key
-- must not stop the renewal of every other hold) asks instead: does `key`
-- hold a value of type `want`? (false if it is missing or of another type)
local function is_type(key, want)
    return redis.call('TYPE', key)['ok'] == want
end
