-- multi_acquire: take several locks of one server at once, or none.
--
-- KEYS[2i-1]  lock hash of the i-th lock    <prefix>:{<name_i>}
-- KEYS[2i]    fence hash of the i-th lock   <prefix>:{<name_i>}:fence
-- ARGV[1]     owner        "<client id>:<task serial>" (the same for every lock)
-- ARGV[2]     lease_ms     TTL to set on every lock hash
-- ARGV[3]     retention_ms TTL of the fence hashes
-- ARGV[4]     attempt      id of this attempt: a lock the owner holds from another
--                          attempt (one its Client gave up as lost) is granted afresh
--
-- Returns {1, token_1, ..., token_n} when the owner holds every lock after
--   the call (each fresh hold gets a new fencing token from its own name's
--   counter; a retry of the same attempt keeps the tokens: idempotent).
-- Returns {0, i, pttl} when lock i is held by another owner: nothing was
--   taken; pttl is its remaining TTL in ms (-1 without TTL), the wait hint.
--   Lock i is flagged as waited for by a task that is not registered for a
--   targeted wake-up ("~w", "~n": see acquire.lua), so its release notifies.
-- A script may only declare keys of one slot in Redis Cluster (even with
-- allow-cross-slot-keys): in cluster mode the client sends this script only
-- for locks whose names share a slot (multi.py takes the other parts one by one).
--@include _fence.lua
--@include _types.lua
check_all(KEYS, 'hash')
local n = #KEYS / 2
for i = 1, n do
    local key = KEYS[2 * i - 1]
    if redis.call('EXISTS', key) == 1 and redis.call('HEXISTS', key, ARGV[1]) == 0 then
        redis.call('HSET', key, '~w', 1, '~n', 1)
        return {0, i, redis.call('PTTL', key)}
    end
end
local result = {1}
for i = 1, n do
    local key = KEYS[2 * i - 1]
    if redis.call('EXISTS', key) == 1 and redis.call('HGET', key, '~a') == ARGV[4] then
        result[i + 1] = tonumber(redis.call('HGET', key, '~fence'))
    else
        redis.call('DEL', key)
        local token = next_token(KEYS[2 * i], ARGV[3])
        redis.call('HSET', key, ARGV[1], 1, '~fence', string.format('%d', token), '~a', ARGV[4])
        result[i + 1] = token
    end
    redis.call('PEXPIRE', key, ARGV[2])
end
return result
