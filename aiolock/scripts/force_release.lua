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
-- ARGV[4]  lost_prefix  template of a Client's eviction channel (+ client id: _evict.lua)
--
-- Returns 1 if a hold was deleted (then the lock is granted to the next
-- registered waiter, if any, and untargeted waiters are woken otherwise),
-- 0 if the lock was free. The holder's Client is told on its eviction
-- channel ("x <bound> * <lock key>", see _evict.lua). The fence hash keeps its record of the last token
-- issued, so the next acquisition still gets a larger token and the evicted
-- holder's release reports "not owned".
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _free.lua
--@include _types.lua
--@include _evict.lua
check_types(KEYS, 'hash', 'hash', 'list', 'zset')
-- The untargeted waiters are woken whether or not the hold was flagged "~n";
-- a grant to a registered waiter carries the flag only if the hold had it.
local untargeted = redis.call('HEXISTS', KEYS[1], '~n') == 1
local evicted = evict_hash_cids(KEYS[1])
if redis.call('DEL', KEYS[1]) == 1 then
    evict_tell(ARGV[4], evicted, evict_bound(KEYS[2]), '*', KEYS[1])
    if not wake_next(KEYS[1], KEYS[2], KEYS[4], ARGV[3], untargeted, ARGV[2], ARGV[1]) then
        notify(ARGV[1], KEYS[3], '1', 1)
    end
    return 1
end
return 0
