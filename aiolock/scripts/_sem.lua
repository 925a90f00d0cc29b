-- Shared snippet of the semaphore scripts (sem_*.lua).
--
-- Layout of semaphore <name> (all keys share the hash tag {<name>}):
--   <prefix>:{<name>}        hash  n -> configured permits (N), u -> permits in use
--                                  (a cache of the sum over the holder set),
--                                  c / ck / ce / cs -> the current claim: the waiter
--                                  that has waited longest, the permits it asks for,
--                                  when the claim lapses (ms, server clock) unless
--                                  refreshed, and when that waiter first failed.
--                                  Deleted when idle (no holder, no claim) at the
--                                  default N; kept `retention` ms if N was changed
--   <prefix>:{<name>}:h      zset  one member per acquisition, "<permits>|<holder id>",
--                                  scored by its expiry (ms, server clock)
--   <prefix>:{<name>}:r      zset  recently released members -> release time (ms), so
--                                  that a retried release answers 2, not 0
--   <prefix>:{<name>}:fence  hash  the fencing counter (see _fence.lua)
--   <prefix>:{<name>}:signal list  list-mode wake-ups
-- Every script run purges expired holders first, by the server's clock.

-- How long (ms) and how many released members are remembered for retried releases.
local SEM_RELEASED_MS = 120000
local SEM_RELEASED_MAX = 10000

--@include _clock.lua

local function sem_permits_of(member)
    return tonumber(string.match(member, '^(%d+)|')) or 0
end

-- Returns n, used, freed: the configured permits (initialised to default_n on
-- first use), the permits in use after purging expired holders, and how many
-- permits the purge freed.
local function sem_state(main, holders, default_n, now)
    local n = tonumber(redis.call('HGET', main, 'n'))
    if not n then
        n = tonumber(default_n)
        redis.call('HSET', main, 'n', n)
    end
    local freed = 0
    local expired = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
    for _, member in ipairs(expired) do
        freed = freed + sem_permits_of(member)
    end
    if #expired > 0 then
        redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    end
    local used = 0
    if redis.call('EXISTS', holders) == 1 then
        local cached = tonumber(redis.call('HGET', main, 'u'))
        if cached then
            used = cached - freed
        else
            for _, member in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
                used = used + sem_permits_of(member)
            end
        end
    end
    redis.call('HSET', main, 'u', used)
    return n, used, freed
end

-- The live claim: claimant member, the permits it asks for, when the claim
-- lapses and since when the claimant waits; or nil, 0, 0, 0.
local function sem_claim(main, now)
    local c = redis.call('HMGET', main, 'c', 'ck', 'ce', 'cs')
    if not c[1] then
        return nil, 0, 0, 0
    end
    if tonumber(c[3]) <= now then
        redis.call('HDEL', main, 'c', 'ck', 'ce', 'cs')
        return nil, 0, 0, 0
    end
    return c[1], tonumber(c[2]), tonumber(c[3]), tonumber(c[4]) or tonumber(c[3])
end

-- Publish `message` (pub/sub mode) and push `copies` items onto the signal
-- list (list mode; "1" each, or "*" for wake-all), keeping 16 items for 10 s.
local function sem_notify(channel, signal, message, copies)
    redis.call('PUBLISH', channel, message)
    local item = '1'
    if message == '*' then
        item = '*'
    end
    for _ = 1, math.min(copies, 16) do
        redis.call('RPUSH', signal, item)
    end
    redis.call('LTRIM', signal, -16, -1)
    redis.call('PEXPIRE', signal, 10000)
end

-- `freed` permits just came free: wake that many waiters per Client. When a
-- claim is pending, nobody but the claimant can fit before it does: wake
-- everyone once it fits (it may be parked behind others), nobody before.
local function sem_wake(main, channel, signal, n, used, freed, now)
    if freed <= 0 then
        return
    end
    local claimant, ck = sem_claim(main, now)
    if claimant then
        if used + ck <= n then
            sem_notify(channel, signal, '*', 16)
        end
        return
    end
    local room = n - used
    if room <= 0 then
        return
    end
    local wake = math.min(freed, room)
    sem_notify(channel, signal, string.format('%d', wake), wake)
end

-- Keep the keys alive for `retention` ms, and at least as long as the last
-- holder. An idle semaphore (no holder, no claim) whose N is the default
-- leaves no key at all; one whose N was changed keeps it for `retention` ms.
local function sem_touch(main, holders, now, retention, n, default_n)
    local ttl = tonumber(retention)
    local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
    if not last[2] and n == tonumber(default_n) and redis.call('HEXISTS', main, 'c') == 0 then
        redis.call('DEL', main)
        return
    end
    if last[2] then
        ttl = math.max(ttl, tonumber(last[2]) - now + 1000)
        redis.call('PEXPIRE', holders, ttl)
    end
    redis.call('PEXPIRE', main, ttl)
end
