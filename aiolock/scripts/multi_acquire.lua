-- multi_acquire: take several locks of one server at once, or none.
--
-- KEYS[4i-3]  lock hash of the i-th lock    <prefix>:{<name_i>}
-- KEYS[4i-2]  fence hash of the i-th lock   <prefix>:{<name_i>}:fence
-- KEYS[4i-1]  its waiting set               <prefix>:{<name_i>}:wq
-- KEYS[4i]    its signal list               <prefix>:{<name_i>}:signal
--             (not written here, only their types checked: the releases
--             write them, so a cycle is refused at its acquire)
-- ARGV[1]     owner        "<client id>:<task serial>" (the same for every lock)
-- ARGV[2]     lease_ms     TTL to set on every lock hash
-- ARGV[3]     retention_ms TTL of the fence hashes
-- ARGV[4]     attempt      id of this attempt: a lock the owner holds from another
--                          attempt (one its Client gave up as lost) is granted afresh
-- ARGV[5]     wait         "1": the caller will wait if a lock is busy; "0": it will
--                          not (a try): then the busy lock is not flagged
-- ARGV[4+2i]  channel      pub/sub channel of the i-th lock <prefix>:{<name_i>}:ch
-- ARGV[5+2i]  wait_prefix  <prefix>:{<name_i>}:w: the template of a Client's own
--                          channel for the i-th lock (see _wake.lua)
--
-- Returns {1, token_1, ..., token_n} when the owner holds every lock after
--   the call (each fresh hold gets a new fencing token from its own name's
--   counter; a retry of the same attempt keeps the tokens: idempotent).
-- Returns {0, i, pttl} when lock i is held by another owner: nothing was
--   taken; pttl is its remaining TTL in ms (-1 without TTL), the wait hint.
--   Unless wait is "0", lock i is flagged as waited for by a task that is not
--   registered for a targeted wake-up ("~w", "~n", "~nx" with lease_ms as
--   the slack: see acquire.lua), so its release notifies, and pttl is
--   recorded as a wait bound in its fence hash (see _fence.lua).
-- A fresh hold whose lease ends before a bound waiters of that lock may sleep
--   on publishes "b <lease_ms>" to its waiters (registered and untargeted:
--   they try again; see wake_bounds in _wake.lua).
-- A script may only declare keys of one slot in Redis Cluster (even with
-- allow-cross-slot-keys): in cluster mode the client sends this script only
-- for locks whose names share a slot (multi.py takes the other parts one by one).
--@runner cross-slot (takes keys of many names: allow-cross-slot-keys in a cluster)
--@include _clock.lua
--@include _fence.lua
--@include _wake.lua
--@include _types.lua
local n = #KEYS / 4
for i = 1, n do
    check_types({KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]},
        'hash', 'hash', 'zset', 'list')
end
for i = 1, n do
    local key = KEYS[4 * i - 3]
    if redis.call('EXISTS', key) == 1 and redis.call('HEXISTS', key, ARGV[1]) == 0 then
        local pttl = redis.call('PTTL', key)
        if ARGV[5] == '1' then
            local known = clock_ms() + math.max(pttl, 0) + tonumber(ARGV[2])
            known = math.max(known, tonumber(redis.call('HGET', key, '~nx') or '0'))
            redis.call('HSET', key, '~w', 1, '~n', 1, '~nx', string.format('%d', known))
            fence_waited(KEYS[4 * i - 2], pttl, ARGV[3])
        end
        return {0, i, pttl}
    end
end
local result = {1}
for i = 1, n do
    local key = KEYS[4 * i - 3]
    if redis.call('EXISTS', key) == 1 and redis.call('HGET', key, '~a') == ARGV[4] then
        result[i + 1] = tonumber(redis.call('HGET', key, '~fence'))
        redis.call('PEXPIRE', key, ARGV[2])
    else
        redis.call('DEL', key)
        local token = next_token(KEYS[4 * i - 2], ARGV[3])
        redis.call('HSET', key, ARGV[1], 1, '~fence', string.format('%d', token), '~a', ARGV[4])
        result[i + 1] = token
        redis.call('PEXPIRE', key, ARGV[2])
        if fence_cut(KEYS[4 * i - 2], ARGV[2]) then
            wake_bounds(KEYS[4 * i - 1], ARGV[5 + 2 * i], ARGV[4 + 2 * i], tonumber(ARGV[2]))
        end
    end
end
return result
