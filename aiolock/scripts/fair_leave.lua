-- fair_leave: an acquire call gave up (cancelled, timed out, reply lost):
-- take its entry out of the queue, and if the lock was handed to it meanwhile
-- (or granted with the reply lost), pass the lock on to the next live waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  queue zset   <prefix>:{<name>}:q      (layout: _fair_queue.lua)
-- ARGV[1]  wid          waiter id of the acquire call
-- ARGV[2]  retention_ms TTL of the fence hash
-- ARGV[3]  channel prefix  <prefix>:{<name>}:ch:   (template: + cid is a Client's channel)
-- ARGV[4]  signal prefix   <prefix>:{<name>}:sig:  (undeclared list key, same slot)
--
-- Returns 1 if wid was queued or held the lock, 0 if it left no trace.
-- Idempotent (a wid is used by one acquire call only).
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _fair_queue.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset')
local lock, fence, q = KEYS[1], KEYS[2], KEYS[3]
local found = redis.call('ZREM', q, ARGV[1])
if redis.call('HEXISTS', lock, ARGV[1]) == 1 then
    local token = redis.call('HGET', lock, '~fence')
    redis.call('DEL', lock)
    fair_released(fence, token, ARGV[2])
    found = 1
end
fair_settle(lock, fence, q, clock_ms(), ARGV[2], ARGV[3], ARGV[4])
return found
