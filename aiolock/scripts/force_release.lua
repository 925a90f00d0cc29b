-- force_release: delete a lock whoever holds it, and wake a waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  signal list  <prefix>:{<name>}:signal
-- KEYS[4]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  channel      pub/sub channel of the lock <prefix>:{<name>}:ch
-- ARGV[2]  wait_prefix  <prefix>:{<name>}:w: the template of a Client's own channel
--                       (+ client id, see _wake.lua)
-- ARGV[3]  retention_ms TTL of the fence hash
--
-- Returns 1 if a hold was deleted (then the lock is granted to the next
-- registered waiter, if any, and untargeted waiters are woken otherwise),
-- 0 if the lock was free. The fence hash keeps its record of the last token
-- issued, so the next acquisition still gets a larger token and the evicted
-- holder's release reports "not owned".
--@include _free.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'list', 'zset')
if redis.call('DEL', KEYS[1]) == 1 then
    free_wake(KEYS, ARGV[3], true, ARGV[1], ARGV[2])
    return 1
end
return 0
