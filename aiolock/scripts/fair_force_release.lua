-- fair_force_release: delete the fair lock whoever holds it, and hand it to
-- the next live waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  queue zset   <prefix>:{<name>}:q      (layout: _fair_queue.lua)
-- ARGV[1]  retention_ms TTL of the fence hash
-- ARGV[2]  channel prefix  <prefix>:{<name>}:ch:   (template: + cid is a Client's channel)
-- ARGV[3]  signal prefix   <prefix>:{<name>}:sig:  (undeclared list key, same slot)
-- ARGV[4]  lost_prefix     template of a Client's eviction channel (+ client id: _evict.lua)
--
-- Returns 1 if a hold was deleted, 0 if the lock was free. The evicted hold is
-- not recorded as released, so its owner's release reports "not owned"; its
-- Client is told on its eviction channel ("x <bound> * <lock key>", _evict.lua).
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _fair_queue.lua
--@include _types.lua
--@include _evict.lua
check_types(KEYS, 'hash', 'hash', 'zset')
local evicted = evict_hash_cids(KEYS[1])
local deleted = redis.call('DEL', KEYS[1])
if deleted == 1 then
    evict_tell(ARGV[4], evicted, evict_bound(KEYS[2]), '*', KEYS[1])
end
fair_settle(KEYS[1], KEYS[2], KEYS[3], clock_ms(), ARGV[1], ARGV[2], ARGV[3])
return deleted
