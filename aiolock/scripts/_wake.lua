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

-- The lock `lock` is free: grant it to (or wake) the next registered task.
-- `untargeted`: tasks that are not in the waiting set wait too (the freed
-- hash had "~n", see acquire.lua); a granted hash carries the flag on, so
-- its release wakes them. `wait_prefix`: the template of a Client's channel.
-- Returns true if the lock was granted.
local function wake_next(lock, fence, wq, retention_ms, untargeted, wait_prefix)
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
            local channel = wait_prefix .. string.match(owner, '^%x+')
            if grant_ms == '0' then
                if redis.call('PUBLISH', channel, '1') > 0 then
                    return false
                end
            else
                local token = next_token(fence, retention_ms, GRANT_RESERVE)
                local message = string.format('g %d %d %s', token, GRANT_RESERVE, member)
                if redis.call('PUBLISH', channel, message) > 0 then
                    redis.call('HSET', lock, owner, 1, '~fence', string.format('%d', token), '~a', attempt)
                    if untargeted then
                        redis.call('HSET', lock, '~n', 1, '~w', 1)
                    elseif redis.call('EXISTS', wq) == 1 then
                        redis.call('HSET', lock, '~w', 1)
                    end
                    redis.call('PEXPIRE', lock, grant_ms)
                    return true
                end
            end
        end
    end
end
