-- acquire: take a reentrant lock for one owner, or report who is in the way.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}        fields: <owner> -> hold count, "~fence" -> token
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence  fields: t -> last token issued, r -> last token released
-- KEYS[3]  waiting set  <prefix>:{<name>}:wq     Clients waiting in pub/sub mode (see _wake.lua)
-- ARGV[1]  owner        "<client id>:<task serial>"
-- ARGV[2]  lease_ms     TTL to set on the lock hash
-- ARGV[3]  retention_ms TTL of the fence hash
-- ARGV[4]  reserve      fencing tokens to reserve for this Client (see _fence.lua)
-- ARGV[5]  attempt      id of this acquisition attempt (unique per Client), kept
--                       in the field "~a"
-- ARGV[6]  wid          this Client's id, to register as waiting if the lock is
--                       busy; "" registers nothing (a try that will not wait, or
--                       a waiter that is not woken by a targeted message)
-- ARGV[7]  live_ms      how long a registration outlives the holder's TTL
-- ARGV[8]  registered   "1" if this Client may be registered (a success then
--                       removes its entry)
--
-- Returns {1, token} when the owner holds the lock after the call: a fresh
--   hold gets a new fencing token; if the owner already held it from this
--   same attempt (a retried acquire) the call is idempotent: the count stays
--   1 and the existing token is returned, with the TTL reset to lease_ms. A
--   hold of the owner from another attempt is one its Client already gave up
--   as lost: it is replaced by a fresh hold with a new token.
-- Returns {0, pttl} when another owner holds it: pttl is the remaining TTL in
--   milliseconds (the caller's wait hint), or -1 if the hash has no TTL. The
--   lock hash is then flagged "~w" (someone waits), which tells the holder's
--   Client to stop handing the lock among its own tasks (see handoff.lua),
--   and the Client is registered as waiting (unless wid is "").
--
-- The client keeps re-entry counts locally, so the hold count in Redis is 1.
--@include _fence.lua
--@include _wake.lua
local function grant()
    if ARGV[8] == '1' then
        redis.call('ZREM', KEYS[3], ARGV[6])
    end
    local token = next_token(KEYS[2], ARGV[3], ARGV[4])
    redis.call('HSET', KEYS[1], ARGV[1], 1, '~fence', string.format('%d', token), '~a', ARGV[5])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, token}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
    return grant()
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    if redis.call('HGET', KEYS[1], '~a') == ARGV[5] then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return {1, tonumber(redis.call('HGET', KEYS[1], '~fence'))}
    end
    redis.call('DEL', KEYS[1])
    return grant()
end
redis.call('HSET', KEYS[1], '~w', 1)
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[6] ~= '' then
    wake_register(KEYS[3], ARGV[6], pttl, tonumber(ARGV[7]))
end
return {0, pttl}
