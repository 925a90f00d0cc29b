-- Shared snippet of the plain lock's scripts: targeted wake-ups and grants
-- across Clients (pub/sub mode).
--
-- <lock key>:wq is a zset of the tasks that wait for the lock, at most one
-- per Client (the Client's other tasks queue locally behind it). Member:
--   "<owner>|<attempt>|<grant_ms>"
--     owner     "<client id>:<task serial>" of the waiting task
--     attempt   id of its acquisition attempt (unique per Client)
--     grant_ms  how long a lock granted to it lasts before its Client takes
--               it up (its Client's lease); "0": never granted, only woken
--               (a task that asked for a fixed lease)
-- Score: when the entry lapses (ms, server clock): the holder's TTL at the
-- task's last try plus its Client's lease, so an entry outlives the task's
-- next try by one lease and a dead Client's entry goes by itself.
--
-- When the lock becomes free (release, force release, a waiter leaving), the
-- entry that lapses first (roughly: the task that has waited longest) is
-- popped, and on that Client's own channel <lock key>:w:<client id> (built
-- from the template wait_prefix = "<lock key>:w:" the script gets in ARGV:
-- wait_prefix .. client id, see aiolock/_core/keys.py, LockKeys):
--   * grant_ms > 0: the lock is granted to that task in the same script (hash
--     {owner: 1, "~fence": token, "~a": attempt}, TTL grant_ms, GRANT_RESERVE
--     tokens reserved) and "g <token> <reserve> <member>" is published: the
--     task takes the hold without a round trip. A Client whose task has
--     given up meanwhile hands the grant to its next task (acquire.lua with
--     prev = member) or releases it (unwait.lua).
--   * grant_ms = 0: "1" is published; the task tries again.
-- A Client that does not listen on its channel (PUBLISH reaches nobody:
-- dead, or not subscribed yet, in which case its next try is on its way) is
-- skipped, and the next entry is taken.

--@include _clock.lua
--@include _fence.lua

-- Tokens a grant reserves for its Client's local handoffs (its TOKEN_RESERVE).
local GRANT_RESERVE = 16

-- Register `member` as waiting; its next try comes within `pttl` ms.
local function wake_register(wq, member, pttl, live_ms)
    local ms = math.max(pttl, 0) + live_ms
    redis.call('ZADD', wq, clock_ms() + ms, member)
    if redis.call('PTTL', wq) < ms then
        redis.call('PEXPIRE', wq, ms)
    end
end

-- owner, attempt, grant_ms of a member (nil if it is not one)
local function wake_parse(member)
    return string.match(member, '^(%x+:%d+)|(%d+)|(%d+)$')
end

-- Whether `lock` is a grant to `member` that nobody has taken up in Redis.
local function wake_granted(lock, member)
    local owner, attempt = wake_parse(member)
    return owner ~= nil and redis.call('HEXISTS', lock, owner) == 1
        and redis.call('HGET', lock, '~a') == attempt
end

-- A new hold lasting `ttl_ms` was taken and some waiter may sleep past its
-- expiry (fence_cut, see _fence.lua): tell every waiting Client "b <ttl_ms>"
-- (its task tries again at once and learns the new TTL, so no free lock sits
-- idle for an old holder's TTL): on its own channel for each registered
-- entry, and on the lock's channel `channel` for the untargeted waiters.
-- List-mode and poll-mode waiters are not told: they re-check at least every
-- second (ListWaiter.PARK_MAX, Backoff.maximum).
local function wake_bounds(wq, wait_prefix, channel, ttl_ms)
    local message = string.format('b %d', ttl_ms)
    for _, member in ipairs(redis.call('ZRANGE', wq, 0, -1)) do
        local owner = wake_parse(member)
        if owner then
            redis.call('PUBLISH', wait_prefix .. string.match(owner, '^%x+'), message)
        end
    end
    redis.call('PUBLISH', channel, message)
end

-- The lock `lock` is free: grant it to (or wake) the next registered task.
-- `untargeted`: tasks that are not in the waiting set wait too (the freed
-- hash had "~n", see acquire.lua); a granted hash carries the flag on, so
-- its release wakes them. `wait_prefix`: the template of a Client's channel.
-- `channel`: the lock's channel (see wake_bounds). Returns true if the lock
-- was granted.
local function wake_next(lock, fence, wq, retention_ms, untargeted, wait_prefix, channel)
    if redis.call('EXISTS', wq) == 0 then
        return false
    end
    redis.call('ZREMRANGEBYSCORE', wq, '-inf', clock_ms())
    while true do
        local member = redis.call('ZRANGE', wq, 0, 0)[1]
        if not member then
            return false
        end
        redis.call('ZREM', wq, member)
        local owner, attempt, grant_ms = wake_parse(member)
        if owner then
            local own = wait_prefix .. string.match(owner, '^%x+')
            if grant_ms == '0' then
                if redis.call('PUBLISH', own, '1') > 0 then
                    return false
                end
            else
                local token = next_token(fence, retention_ms, GRANT_RESERVE)
                local message = string.format('g %d %d %s', token, GRANT_RESERVE, member)
                if redis.call('PUBLISH', own, message) > 0 then
                    redis.call('HSET', lock, owner, 1, '~fence', string.format('%d', token), '~a', attempt)
                    if untargeted then
                        redis.call('HSET', lock, '~n', 1, '~w', 1)
                    elseif redis.call('EXISTS', wq) == 1 then
                        redis.call('HSET', lock, '~w', 1)
                    end
                    redis.call('PEXPIRE', lock, grant_ms)
                    if fence_cut(fence, grant_ms) then
                        wake_bounds(wq, wait_prefix, channel, grant_ms)
                    end
                    return true
                end
            end
        end
    end
end
