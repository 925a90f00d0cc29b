-- unwait: a Client's waiting task gave up (cancelled, timed out, Client closed).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  signal list  <prefix>:{<name>}:signal
-- KEYS[4]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  member       the task's entry in the waiting set
-- ARGV[2]  retention_ms TTL of the fence hash
-- ARGV[3]  channel      pub/sub channel of the lock
--
-- Removes the entry. If the lock was granted to it and not taken up, the
-- grant is released (as release.lua would: the next waiter gets it). If
-- the lock is free, a wake-up may have been sent to this task just before
-- it gave up: it is passed on to the next registered task.
-- Returns 1 if the lock is free or was granted to the entry (the wake-up
-- or the lock was passed on, if anyone waits), 0 if someone else holds it
-- (its release will wake the next task).
--@include _notify.lua
--@include _wake.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'list', 'zset')
local lock, fence, wq = KEYS[1], KEYS[2], KEYS[4]
redis.call('ZREM', wq, ARGV[1])
local untargeted = false
if wake_granted(lock, ARGV[1]) then
    local token = redis.call('HGET', lock, '~fence')
    untargeted = redis.call('HEXISTS', lock, '~n') == 1
    redis.call('DEL', lock)
    redis.call('HSET', fence, 'r', token)
    redis.call('PEXPIRE', fence, ARGV[2])
elseif redis.call('EXISTS', lock) == 1 then
    return 0
end
if not wake_next(lock, fence, wq, ARGV[2], untargeted) and untargeted then
    notify(ARGV[3], KEYS[3], '1', 1)
end
return 1
