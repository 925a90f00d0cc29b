-- unwait: a Client's waiting task gave up (cancelled, timed out, Client closed).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  signal list  <prefix>:{<name>}:signal
-- KEYS[4]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  member       the task's entry in the waiting set
-- ARGV[2]  retention_ms TTL of the fence hash
-- ARGV[3]  channel      pub/sub channel of the lock <prefix>:{<name>}:ch
-- ARGV[4]  wait_prefix  <prefix>:{<name>}:w: the template of a Client's own channel
--                       (+ client id, see _wake.lua)
--
-- Removes the entry. If the lock was granted to it and not taken up, the
-- grant is released (as release.lua would: the next waiter gets it). If
-- the lock is free, a wake-up may have been sent to this task just before
-- it gave up: it is passed on to the next registered task.
-- Returns 1 if the lock is free or was granted to the entry (the wake-up
-- or the lock was passed on, if anyone waits), 0 if someone else holds it
-- (its release will wake the next task).
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _free.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'list', 'zset')
local lock = KEYS[1]
redis.call('ZREM', KEYS[4], ARGV[1])
if wake_granted(lock, ARGV[1]) then
    local token = redis.call('HGET', lock, '~fence')
    local untargeted = redis.call('HEXISTS', lock, '~n') == 1
    free_lock(KEYS, token, ARGV[2], untargeted, ARGV[3], ARGV[4])
elseif redis.call('EXISTS', lock) == 1 then
    return 0
else
    free_wake(KEYS, ARGV[2], false, ARGV[3], ARGV[4])
end
return 1
