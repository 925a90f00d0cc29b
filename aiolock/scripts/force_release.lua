-- force_release: delete a lock whoever holds it, and wake a waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  signal list  <prefix>:{<name>}:signal
-- KEYS[3]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  channel      pub/sub channel of the lock
--
-- Returns 1 if a hold was deleted, 0 if the lock was free. The fence hash is
-- left alone, so the next acquisition still gets a larger token and the
-- evicted holder's release reports "not owned".
--@include _notify.lua
--@include _wake.lua
if redis.call('DEL', KEYS[1]) == 1 then
    notify(ARGV[1], KEYS[2], '1', 1)
    wake_next(KEYS[1], KEYS[3])
    return 1
end
return 0
