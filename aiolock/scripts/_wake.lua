-- Shared snippet of the plain lock's scripts: targeted wake-ups across Clients.
--
-- <lock key>:wq is a zset of the Clients (by id) whose task waits for the lock
-- in pub/sub mode, each scored by when its entry lapses (ms, server clock):
-- the holder's TTL when it last failed plus the Client's lease, so an entry
-- outlives the waiter's next try by one lease and a dead Client's entry goes
-- by itself. A Client's waiter listens on its own channel <lock key>:w:<id>.
-- A release pops the entry that lapses first (roughly: the Client that has
-- waited longest) and sends "1" to that Client alone; a Client whose try then
-- fails registers again. So one release wakes one Client, not all of them.

--@include _clock.lua

-- Register Client `wid` as waiting: its next try comes within `pttl` ms.
local function wake_register(wq, wid, pttl, live_ms)
    local ms = math.max(pttl, 0) + live_ms
    redis.call('ZADD', wq, clock_ms() + ms, wid)
    if redis.call('PTTL', wq) < ms then
        redis.call('PEXPIRE', wq, ms)
    end
end

-- Wake the next registered Client of the lock `lock`, if any.
local function wake_next(lock, wq)
    if redis.call('EXISTS', wq) == 0 then
        return
    end
    redis.call('ZREMRANGEBYSCORE', wq, '-inf', clock_ms())
    local first = redis.call('ZRANGE', wq, 0, 0)
    if first[1] then
        redis.call('ZREM', wq, first[1])
        redis.call('PUBLISH', lock .. ':w:' .. first[1], '1')
    end
end
