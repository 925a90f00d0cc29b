-- Shared snippet of the plain lock's scripts that free the lock (release,
-- handoff, unwait, force_release): "free the lock and wake the next waiter",
-- written once.
--
-- Those scripts all take the same KEYS, in this order (LockKeys.free in
-- aiolock/_core/keys.py), passed here as `keys`:
--   keys[1]  lock hash    <prefix>:{<name>}
--   keys[2]  fence hash   <prefix>:{<name>}:fence
--   keys[3]  signal list  <prefix>:{<name>}:signal  (list-mode wake-ups, see _notify.lua)
--   keys[4]  waiting set  <prefix>:{<name>}:wq      (targeted wake-ups, see _wake.lua)
-- and the lock's two names in ARGV, passed here as:
--   channel      the lock's channel <prefix>:{<name>}:ch (untargeted wake-ups)
--   wait_prefix  the template of a Client's channel, <prefix>:{<name>}:w:
--                (+ client id: see _wake.lua)
--@include _notify.lua
--@include _wake.lua

-- The lock is free (its hash is gone): grant it to the next registered task
-- (see wake_next), or, if none took it and `untargeted` (tasks that are not
-- registered wait too: the freed hash had "~n"), wake one of those: "1" on
-- the channel and the signal list.
local function free_wake(keys, retention_ms, untargeted, channel, wait_prefix)
    if not wake_next(keys[1], keys[2], keys[4], retention_ms, untargeted, wait_prefix, channel)
        and untargeted then
        notify(channel, keys[3], '1', 1)
    end
end

-- Free the lock held with fencing token `token`: delete its hash, record the
-- token as released in the fence hash (a retried release of it then answers
-- "already released"), keep the fence hash for retention_ms, and wake the
-- next waiter (free_wake).
local function free_lock(keys, token, retention_ms, untargeted, channel, wait_prefix)
    redis.call('DEL', keys[1])
    redis.call('HSET', keys[2], 'r', token)
    redis.call('PEXPIRE', keys[2], retention_ms)
    free_wake(keys, retention_ms, untargeted, channel, wait_prefix)
end
