-- acquire: take a reentrant lock for one owner, or report who is in the way.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}        fields: <owner> -> hold count, "~fence" -> token
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence  fields: t -> last token issued, r -> last token released
-- KEYS[3]  waiting set  <prefix>:{<name>}:wq     tasks waiting in pub/sub mode (see _wake.lua)
-- ARGV[1]  owner        "<client id>:<task serial>"
-- ARGV[2]  lease_ms     TTL to set on the lock hash
-- ARGV[3]  retention_ms TTL of the fence hash
-- ARGV[4]  reserve      fencing tokens to reserve for this Client (see _fence.lua)
-- ARGV[5]  attempt      id of this acquisition attempt (unique per Client), kept
--                       in the field "~a"
-- ARGV[6]  member       this task's entry in the waiting set (see _wake.lua), to
--                       register if the lock is busy; "" registers nothing (a try
--                       that will not wait, or a waiter that is not targeted)
-- ARGV[7]  live_ms      how long a registration outlives the holder's TTL
-- ARGV[8]  prev         the entry this Client may have in the waiting set, or "":
--                       it is removed, and a lock granted to it (a task of this
--                       Client that gave up before taking the grant) is taken
--                       over by this call
--
-- Returns {1, token} when the owner holds the lock after the call: a fresh
--   hold gets a new fencing token; if the owner already held it from this
--   same attempt (a retried acquire, or a grant to this attempt) the call is
--   idempotent: the count stays 1 and the existing token is returned, with
--   the TTL reset to lease_ms. A hold of the owner from another attempt is
--   one its Client already gave up as lost: it is replaced by a fresh hold
--   with a new token.
-- Returns {0, pttl} when another owner holds it: pttl is the remaining TTL in
--   milliseconds (the caller's wait hint), or -1 if the hash has no TTL. The
--   lock hash is then flagged "~w" (someone waits), which tells the holder's
--   Client to stop handing the lock among its own tasks (see handoff.lua);
--   a task that is not registered also flags it "~n", so that the release
--   notifies the untargeted waiters (shared channel, signal list). The task
--   is registered as waiting (unless member is "").
--
-- The client keeps re-entry counts locally, so the hold count in Redis is 1.
--@include _fence.lua
--@include _wake.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset')
local lock, fence, wq = KEYS[1], KEYS[2], KEYS[3]
-- A fresh hold for the owner; `replace`: in place of the hash's content
-- (keeping its "~n").
local function grant(replace)
    local untargeted = replace and redis.call('HEXISTS', lock, '~n') == 1
    if replace then
        redis.call('DEL', lock)
    end
    local token = next_token(fence, ARGV[3], ARGV[4])
    redis.call('HSET', lock, ARGV[1], 1, '~fence', string.format('%d', token), '~a', ARGV[5])
    if untargeted then
        redis.call('HSET', lock, '~n', 1)
    end
    redis.call('PEXPIRE', lock, ARGV[2])
    return {1, token}
end
local prev = ARGV[8]
if prev ~= '' then
    redis.call('ZREM', wq, prev)
    if prev ~= ARGV[6] and wake_granted(lock, prev) then
        return grant(true) -- granted to our task that gave up: this task's now
    end
end
if redis.call('EXISTS', lock) == 0 then
    return grant(false)
end
if redis.call('HEXISTS', lock, ARGV[1]) == 1 then
    if redis.call('HGET', lock, '~a') == ARGV[5] then
        redis.call('PEXPIRE', lock, ARGV[2])
        return {1, tonumber(redis.call('HGET', lock, '~fence'))}
    end
    return grant(true)
end
local pttl = redis.call('PTTL', lock)
if ARGV[6] ~= '' then
    redis.call('HSET', lock, '~w', 1)
    wake_register(wq, ARGV[6], pttl, tonumber(ARGV[7]))
else
    redis.call('HSET', lock, '~w', 1, '~n', 1)
end
return {0, pttl}
