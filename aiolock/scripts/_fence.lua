-- Shared snippet (included by scripts that issue fencing tokens).
--@include _types.lua
--
-- next_token(fence_key, retention_ms[, reserve]) -> integer
--   Returns a fencing token strictly greater than the last one recorded in
--   the hash `fence_key` (field `t`) and never smaller than the server's
--   clock in microseconds. Records token + reserve - 1 in `t` (reserve
--   defaults to 1): the caller may hand out the reserve - 1 tokens after it
--   itself, without a round trip (cohort handoffs among one Client's
--   tasks). (Re)sets the hash's TTL to `retention_ms`, so the counter of a
--   name nobody uses any more expires. Its first command reads the hash
--   (typed): a value of another type there fails it before it writes.
--   After expiry (or a restart that lost the data) the clock floor keeps
--   tokens increasing: a token runs ahead of the clock by at most one
--   microsecond per acquisition issued within the same microsecond.
--   Cluster failover: replication is asynchronous, so a promoted replica may
--   lack the master's last writes to `t` (and the hold itself). The clock
--   floor covers that too: the new master's clock passed every token the old
--   one issued as long as the two nodes' clocks differ by less than the
--   failover took (at least cluster-node-timeout; tokens run ahead of the
--   clock by ~reserve microseconds only). A manual CLUSTER FAILOVER waits for
--   the replica to catch up and loses nothing; FORCE/TAKEOVER can be faster
--   than a clock skew, and then the order rests on the clocks alone.
--
-- Wait bounds (the field `b`): a waiter that finds the lock held sleeps at
-- most until the hold in the way can expire, and records that moment (server
-- ms) with fence_waited(); fence_cut(), called by the script that takes a new
-- hold after its next_token(), says whether some waiter may sleep past the new
-- hold's expiry (the caller then tells the waiters, who try again and learn
-- the new TTL) and records that expiry as the new latest bound. It costs no
-- command of its own: next_token reads `b` with `t`, and `b` is only written
-- while someone waits.
local fence_now_ms, fence_bound = 0, 0

local function next_token(fence_key, retention_ms, reserve)
    local now = redis.call('TIME')
    local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local got = typed('hash', 'HMGET', fence_key, 't', 'b') -- checks its type
    local last = tonumber(got[1] or '0')
    fence_now_ms, fence_bound = math.floor(clock / 1000), tonumber(got[2] or '0')
    local token = clock
    if last >= token then
        token = last + 1
    end
    redis.call('HSET', fence_key, 't', string.format('%d', token + (tonumber(reserve) or 1) - 1))
    redis.call('PEXPIRE', fence_key, retention_ms)
    return token
end

-- A waiter was told to wait at most `pttl` ms (the TTL of the hold in the
-- way): record the latest moment any waiter may sleep until (`b`, server ms).
local function fence_waited(fence_key, pttl, retention_ms)
    if pttl <= 0 then
        return
    end
    local t = redis.call('TIME')
    local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + pttl
    if until_ms > tonumber(redis.call('HGET', fence_key, 'b') or '0') then
        redis.call('HSET', fence_key, 'b', string.format('%d', until_ms))
        if redis.call('PTTL', fence_key) < 0 then
            redis.call('PEXPIRE', fence_key, retention_ms)
        end
    end
end

-- After next_token(): a new hold lasting `ttl_ms` was taken. True if a waiter
-- may sleep past its expiry (the caller must tell the waiters); that expiry is
-- then recorded as the latest bound.
local function fence_cut(fence_key, ttl_ms)
    local expiry = fence_now_ms + tonumber(ttl_ms)
    if fence_bound <= expiry then
        return false
    end
    redis.call('HSET', fence_key, 'b', string.format('%d', expiry))
    fence_bound = expiry
    return true
end
