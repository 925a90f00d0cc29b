-- force_release: delete a lock whoever holds it, and wake a waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  signal list  <prefix>:{<name>}:signal
-- KEYS[3]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- KEYS[4]  fence hash   <prefix>:{<name>}:fence
-- ARGV[1]  channel      pub/sub channel of the lock
-- ARGV[2]  retention_ms TTL of the fence hash
--
-- Returns 1 if a hold was deleted (then the lock is granted to the next
-- registered waiter, if any, and untargeted waiters are woken otherwise),
-- 0 if the lock was free. The fence hash keeps its record of the last token
-- issued, so the next acquisition still gets a larger token and the evicted
-- holder's release reports "not owned".
--@include _notify.lua
--@include _wake.lua
--@include _types.lua
check_types(KEYS, 'hash', 'list', 'zset', 'hash')
if redis.call('DEL', KEYS[1]) == 1 then
    if not wake_next(KEYS[1], KEYS[4], KEYS[3], ARGV[2], true) then
        notify(ARGV[1], KEYS[2], '1', 1)
    end
    return 1
end
return 0
