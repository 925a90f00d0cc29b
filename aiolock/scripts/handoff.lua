-- handoff: release a lock and, in the same call, hand it to the next waiting
-- task of the same Client (cohort locking), unless others must get a turn.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  signal list  <prefix>:{<name>}:signal
-- KEYS[4]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  owner        the releasing hold's owner
-- ARGV[2]  token        the releasing hold's fencing token
-- ARGV[3]  next_owner   the local waiter to hand the lock to
-- ARGV[4]  next_ms      the TTL of the handed hold (the waiter's lease)
-- ARGV[5]  retention_ms TTL of the fence hash
-- ARGV[6]  yield        "1" if this Client handed the lock over many times in a
--                       row: then, if another Client's task is waiting (the
--                       acquire script flags the lock hash with "~w"), release
--                       normally instead, so that the other Client gets a turn
-- ARGV[7]  channel      pub/sub channel of the lock <prefix>:{<name>}:ch
-- ARGV[8]  wait_prefix  <prefix>:{<name>}:w: the template of a Client's own channel
--                       (+ client id, see _wake.lua)
-- ARGV[9]  reserve      fencing tokens to reserve for this Client (see _fence.lua)
--
-- Returns {1, token} when the lock was handed over: next_owner holds it with a
--   new fencing token, nobody is woken (the lock stayed held), unless another
--   Client waits on a bound past the handed hold's expiry: then it is told
--   (see wake_bounds in _wake.lua).
-- Returns {2} when it was released as release.lua would (granted to the next
--   registered waiter of another Client, or deleted and waiters woken).
-- Returns {0} when the owner no longer held it (expired or force-released).
-- Either way (1 or 2) the fence hash records the token as released, so a
-- retried plain release of the same hold answers 2 ("already released").
-- Refused (WRONGTYPE, nothing changed) if a key it or the handed hold's
-- release would write holds a value of another type. Without a TYPE per key:
-- the lock hash by the first (typed) read, the fence hash by its first
-- write, which fails before it writes; the signal list and the waiting set
-- by one EXISTS while neither exists.
--@include _free.lua
--@include _types.lua
if typed('hash', 'HEXISTS', KEYS[1], ARGV[1]) == 0 or redis.call('HGET', KEYS[1], '~fence') ~= ARGV[2] then
    return {0}
end
check_some({KEYS[3], KEYS[4]}, 'list', 'zset')
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], '~w') == 1 then
    check_types({KEYS[2]}, 'hash')
    local untargeted = redis.call('HEXISTS', KEYS[1], '~n') == 1
    free_lock(KEYS, ARGV[2], ARGV[5], untargeted, ARGV[7], ARGV[8])
    return {2}
end
typed('hash', 'HSET', KEYS[2], 'r', ARGV[2])
local token = next_token(KEYS[2], ARGV[5], ARGV[9])
redis.call('HDEL', KEYS[1], ARGV[1], '~a') -- the handed hold is no acquire attempt's
redis.call('HSET', KEYS[1], ARGV[3], 1, '~fence', string.format('%d', token))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if fence_cut(KEYS[2], ARGV[4]) then -- another Client waits past the handed hold
    wake_bounds(KEYS[4], ARGV[8], ARGV[7], tonumber(ARGV[4]))
end
return {1, token}
