-- fair_release: end a fair-lock hold, idempotently, and hand the lock to the
-- next live waiter (waking that waiter's Client only).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  queue zset   <prefix>:{<name>}:q      (layout: _fair_queue.lua)
-- ARGV[1]  wid          the holder's waiter id
-- ARGV[2]  token        fencing token of the hold
-- ARGV[3]  retention_ms TTL of the fence hash
-- ARGV[4]  channel prefix  <prefix>:{<name>}:ch:   (template: + cid is a Client's channel)
-- ARGV[5]  signal prefix   <prefix>:{<name>}:sig:  (a list-mode Client's list is
--                          computed from it: an undeclared key, same slot)
--
-- Returns 1 if this call released the hold (then the lock is handed to the
--   first live waiter, if any: new token, TTL min(its lease, its grace)).
-- Returns 2 if the hold was already released by an earlier call with the same
--   token (a retry after a lost reply): nothing changes.
-- Returns 0 if the hold is not there (expired, force-released, or taken since).
-- In every case a free lock with a live waiter is handed over.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _fair_queue.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset')
local lock, fence, q = KEYS[1], KEYS[2], KEYS[3]
local code = 0
if redis.call('HEXISTS', lock, ARGV[1]) == 1 and redis.call('HGET', lock, '~fence') == ARGV[2] then
    redis.call('DEL', lock)
    fair_released(fence, ARGV[2], ARGV[3])
    code = 1
elseif redis.call('HGET', fence, 'r') == ARGV[2] then
    code = 2
end
fair_settle(lock, fence, q, clock_ms(), ARGV[3], ARGV[4], ARGV[5])
return code
