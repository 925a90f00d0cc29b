-- sem_acquire: take permits of a semaphore for one acquisition, or say how long to wait.
--
-- KEYS[1]  main hash     <prefix>:{<name>}         (layout: see _sem.lua)
-- KEYS[2]  holder zset   <prefix>:{<name>}:h
-- KEYS[3]  fence hash    <prefix>:{<name>}:fence
-- KEYS[4]  signal list   <prefix>:{<name>}:signal
-- KEYS[5]  released zset <prefix>:{<name>}:r      not written here, only its type
--                        checked (the release writes it): a cycle is refused at
--                        its acquire
-- ARGV[1]  member        "<permits>|<holder id>", unique per acquisition
-- ARGV[2]  default_n     N to initialise the semaphore with if it has none
-- ARGV[3]  lease_ms      the holder expires this long after the grant
-- ARGV[4]  retention_ms  TTL of the main hash and the fence hash
-- ARGV[5]  channel       pub/sub channel (wake-ups after purging expired holders)
-- ARGV[6]  claim_ms      how long a claim lasts unless the claimant retries (0: do not
--                        claim: a try that will not wait)
-- ARGV[7]  since_ms      when this acquisition first failed (server clock, ms, as
--                        returned by an earlier try), or 0 on its first try
--
-- Wait bounds (see _fence.lua): a refusal records wait_ms as a bound waiters
-- may sleep on; a grant whose lease ends before such a bound publishes
-- "b <lease_ms>" on the channel (every parked waiter tries again).
--
-- Returns {1, token}: granted (a fresh fencing token). If the member already
--   holds (a retry of an acquire whose reply was lost) it is granted again,
--   idempotently: its expiry is moved to now + lease_ms, never shortened.
-- Returns {0, wait_ms, claimed, since_ms}: not now. wait_ms: until the first
--   holder expires or the blocking claim lapses, whichever is first (-1:
--   unknown); claimed: 1 if this member holds the claim (it must retry within
--   claim_ms); since_ms: when this acquisition first failed (pass it back).
-- Returns {-1, n}: it asks for more permits than the semaphore has (N = n);
--   a claim of this member is dropped.
--
-- Fairness: the claim belongs to the waiter that has waited longest (the
-- earliest since_ms among those that retried within claim_ms; an older
-- waiter takes it over on its next try). While the claim lives, others are
-- granted only what leaves room for the claimant, so a waiter asking for
-- many permits is not starved by a stream of small ones, however often
-- they retry.
--@include _fence.lua
--@include _sem.lua
--@include _types.lua
check_types(KEYS, 'hash', 'zset', 'hash', 'list', 'zset')
local main, holders = KEYS[1], KEYS[2]
local member = ARGV[1]
local lease_ms = tonumber(ARGV[3])
local now = clock_ms()
local k = sem_permits_of(member)
local n, used, freed = sem_state(main, holders, ARGV[2], now)
local result
local score = redis.call('ZSCORE', holders, member)
if score then
    if tonumber(score) < now + lease_ms then
        redis.call('ZADD', holders, 'XX', now + lease_ms, member)
    end
    result = {1, next_token(KEYS[3], ARGV[4])}
else
    local claimant, ck, ce, cs = sem_claim(main, now)
    local since = tonumber(ARGV[7])
    local willing = tonumber(ARGV[6]) > 0
    if since <= 0 then
        since = now
    end
    if claimant and claimant ~= member and willing and k <= n and since < cs then
        -- This waiter has waited longer than the claimant: the claim is its own.
        redis.call('HSET', main, 'c', member, 'ck', k, 'ce', now + tonumber(ARGV[6]), 'cs', since)
        claimant, ck, ce, cs = member, k, now + tonumber(ARGV[6]), since
    end
    if k > n then
        if claimant == member then
            redis.call('HDEL', main, 'c', 'ck', 'ce', 'cs')
            freed = freed + math.max(n - used, 0)
        end
        result = {-1, n}
    else
        local reserve = 0
        if claimant and claimant ~= member then
            reserve = ck
        end
        if used + k + reserve <= n then
            redis.call('ZADD', holders, now + lease_ms, member)
            used = used + k
            redis.call('HSET', main, 'u', used)
            if claimant == member then
                redis.call('HDEL', main, 'c', 'ck', 'ce', 'cs')
            end
            result = {1, next_token(KEYS[3], ARGV[4])}
        else
            local claimed = 0
            if not claimant and willing then
                redis.call('HSET', main, 'c', member, 'ck', k, 'ce', now + tonumber(ARGV[6]), 'cs', since)
                claimed = 1
            elseif claimant == member then
                redis.call('HSET', main, 'ce', now + tonumber(ARGV[6]))
                claimed = 1
            end
            local wait_ms = -1
            local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
            if first[2] then
                wait_ms = math.max(tonumber(first[2]) - now, 1)
            end
            if claimant and claimant ~= member and (wait_ms < 0 or ce - now < wait_ms) then
                wait_ms = math.max(ce - now, 1)
            end
            result = {0, wait_ms, claimed, since}
        end
    end
end
if result[1] == 1 then
    if fence_cut(KEYS[3], lease_ms) then
        redis.call('PUBLISH', ARGV[5], string.format('b %d', lease_ms))
    end
elseif result[1] == 0 then
    fence_waited(KEYS[3], result[2], ARGV[4])
end
sem_wake(main, ARGV[5], KEYS[4], n, used, freed, now)
sem_touch(main, holders, now, ARGV[4], n, ARGV[2])
return result
