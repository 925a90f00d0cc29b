-- fair_acquire: take the fair lock if it is this waiter's turn, else queue up.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  queue zset   <prefix>:{<name>}:q      (layout: _fair_queue.lua)
-- KEYS[4]  (list mode only) this Client's signal list <prefix>:{<name>}:sig:<cid>:
--          not written here, only its type checked (a release that hands the
--          lock to this call writes it): a wait that could not be told is
--          refused at its start, as is the whole cycle of this call
-- ARGV[1]  wid          waiter id of this acquire call (see _fair_queue.lua)
-- ARGV[2]  lease_ms     TTL of the hold
-- ARGV[3]  live_ms      the Client's lease: how long its queue entries live unrenewed
-- ARGV[4]  retention_ms TTL of the fence hash
-- ARGV[5]  join         "1": queue up if it must wait; "0": do not (the last try
--                       at a deadline), and leave the queue if in it
-- ARGV[6]  channel prefix  <prefix>:{<name>}:ch:   (template: + cid is a Client's channel)
-- ARGV[7]  signal prefix   <prefix>:{<name>}:sig:  (+ cid: a Client's list; undeclared)
--
-- Returns {1, token} when wid holds the lock after the call: granted now (the
--   lock was free and wid first in line, or the queue empty), or handed to wid
--   earlier by a release (then its TTL is reset to lease_ms: the confirmation).
--   A hold taken from the head of the queue nudges the entries next in line
--   (fair_nudge in _fair_queue.lua).
-- Returns {0, pttl} when it must wait: pttl is the remaining TTL of the hold
--   in the way, in ms (the caller's bound on its wait). With join = "1" wid is
--   then in the queue (at the tail if it was not yet) and its Client's entries
--   live for live_ms more. A free lock with a live waiter ahead of wid is
--   handed to that waiter here.
--@include _fair_queue.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset', 'list')
local lock, fence, q = KEYS[1], KEYS[2], KEYS[3]
local wid = ARGV[1]
if redis.call('HEXISTS', lock, wid) == 1 then
    redis.call('PEXPIRE', lock, ARGV[2])
    return {1, tonumber(redis.call('HGET', lock, '~fence'))}
end
local now = clock_ms()
if redis.call('EXISTS', lock) == 0 then
    local head = nil
    if redis.call('EXISTS', q) == 1 then
        head = fair_head(q, now)
        if head == nil then
            redis.call('DEL', q)
        end
    end
    if head == nil or head == wid then
        local token = next_token(fence, ARGV[4])
        redis.call('HSET', lock, wid, 1, '~fence', string.format('%d', token))
        redis.call('PEXPIRE', lock, ARGV[2])
        if head then
            redis.call('ZREM', q, wid)
            -- the next in line check back when this hold can expire
            fair_nudge(q, fair_parse(wid), tonumber(ARGV[2]), ARGV[6], ARGV[7])
            fair_tidy(q)
        end
        return {1, token}
    end
    fair_hand(lock, fence, q, head, ARGV[4], ARGV[6], ARGV[7])
end
if ARGV[5] == '1' then
    if not redis.call('ZSCORE', q, wid) then
        local last = redis.call('ZREVRANGEBYSCORE', q, '+inf', 1, 'WITHSCORES', 'LIMIT', 0, 1)
        local seq = 1
        if last[2] then
            seq = tonumber(last[2]) + 1
        end
        redis.call('ZADD', q, string.format('%d', seq), wid)
    end
    fair_keep_alive(q, fair_parse(wid), now, tonumber(ARGV[3]))
else
    redis.call('ZREM', q, wid)
    fair_tidy(q)
end
return {0, redis.call('PTTL', lock)}
