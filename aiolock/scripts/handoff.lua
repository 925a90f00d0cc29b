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
--   new fencing token, nobody is woken (the lock stayed held).
-- Returns {2} when it was released as release.lua would (granted to the next
--   registered waiter of another Client, or deleted and waiters woken).
-- Returns {0} when the owner no longer held it (expired or force-released).
-- Either way (1 or 2) the fence hash records the token as released, so a
-- retried plain release of the same hold answers 2 ("already released").
--@include _free.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'list', 'zset')
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 or redis.call('HGET', KEYS[1], '~fence') ~= ARGV[2] then
    return {0}
end
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], '~w') == 1 then
    local untargeted = redis.call('HEXISTS', KEYS[1], '~n') == 1
    free_lock(KEYS, ARGV[2], ARGV[5], untargeted, ARGV[7], ARGV[8])
    return {2}
end
redis.call('HSET', KEYS[2], 'r', ARGV[2])
local token = next_token(KEYS[2], ARGV[5], ARGV[9])
redis.call('HDEL', KEYS[1], ARGV[1], '~a') -- the handed hold is no acquire attempt's
redis.call('HSET', KEYS[1], ARGV[3], 1, '~fence', string.format('%d', token))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, token}
