-- acquire: take a reentrant lock for one owner, or report who is in the way.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}        fields: <owner> -> hold count, "~fence" -> token
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence  fields: t -> last token issued, r -> last token released
-- KEYS[3]  waiting set  <prefix>:{<name>}:wq     tasks waiting in pub/sub mode (see _wake.lua)
-- KEYS[4]  signal list  <prefix>:{<name>}:signal list-mode wake-ups (written by the
--                       release, see release.lua: only its type is checked here)
-- ARGV[1]  owner        "<client id>:<task serial>"
-- ARGV[2]  lease_ms     TTL to set on the lock hash
-- ARGV[3]  retention_ms TTL of the fence hash
-- ARGV[4]  reserve      fencing tokens to reserve for this Client (see _fence.lua)
-- ARGV[5]  attempt      id of this acquisition attempt (unique per Client), kept
--                       in the field "~a"
-- ARGV[6]  member       this task's entry in the waiting set (see _wake.lua), to
--                       register if the lock is busy; "" registers nothing (a
--                       waiter that is not targeted: list or poll mode, spin
--                       lock); "-" registers and flags nothing (a try that will
--                       not wait: try_acquire(), the last try at a deadline)
-- ARGV[7]  live_ms      how long a registration outlives the holder's TTL
-- ARGV[8]  prev         the entry this Client may have in the waiting set, or "":
--                       it is removed, and a lock granted to it (a task of this
--                       Client that gave up before taking the grant) is taken
--                       over by this call
-- ARGV[9]  channel      pub/sub channel of the lock <prefix>:{<name>}:ch
-- ARGV[10] wait_prefix  <prefix>:{<name>}:w: the template of a Client's own channel
--                       (+ client id, see _wake.lua)
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
--   notifies the untargeted waiters (shared channel, signal list), and
--   "~nx" -> until when (server ms) such a task is known to wait: its next
--   try is due before then (pttl + live_ms), and renews it (read by the
--   operator commands only). The task is registered as waiting (unless
--   member is ""), and pttl is recorded as a wait bound in the fence hash
--   (fence_waited, see _fence.lua). A try that will not wait (member "-")
--   writes nothing: nobody waits on its account.
-- A fresh hold whose TTL ends before a bound some waiter may sleep on tells
--   the waiting Clients (wake_bounds, see _wake.lua).
--
-- The client keeps re-entry counts locally, so the hold count in Redis is 1.
--
-- Refused (WRONGTYPE, nothing changed) if any of the four keys holds a value
-- of another type: also the signal list, which only the release writes, so
-- that a cycle is refused at its acquire, never half done. Without a TYPE
-- per key on the uncontended path: the lock hash's TYPE is also the "is it
-- free" test; the fence hash is first read by next_token (a typed read that
-- precedes every write of the script on the paths that take it; the other
-- paths check it); the waiting set and the signal list cost one EXISTS while
-- neither exists.
--@include _fence.lua
--@include _wake.lua
--@include _types.lua
local lock, fence, wq = KEYS[1], KEYS[2], KEYS[3]
local kind = redis.call('TYPE', lock)['ok']
if kind ~= 'hash' and kind ~= 'none' then
    wrong_type(lock, kind, 'hash')
end
check_some({wq, KEYS[4]}, 'zset', 'list')
-- A fresh hold for the owner; `replace`: in place of the hash's content
-- (keeping its "~n").
local function grant(replace)
    local untargeted = replace and redis.call('HEXISTS', lock, '~n') == 1
    local token = next_token(fence, ARGV[3], ARGV[4]) -- first write (after a typed read)
    if replace then
        redis.call('DEL', lock)
    end
    redis.call('HSET', lock, ARGV[1], 1, '~fence', string.format('%d', token), '~a', ARGV[5])
    if untargeted then
        redis.call('HSET', lock, '~n', 1)
    end
    redis.call('PEXPIRE', lock, ARGV[2])
    if fence_cut(fence, ARGV[2]) then
        wake_bounds(wq, ARGV[10], ARGV[9], tonumber(ARGV[2]))
    end
    return {1, token}
end
local prev = ARGV[8]
if prev ~= '' then
    check_types({fence}, 'hash') -- the paths below write the waiting set first
    if prev ~= ARGV[6] and wake_granted(lock, prev) then
        local reply = grant(true) -- granted to our task that gave up: this task's now
        redis.call('ZREM', wq, prev)
        return reply
    end
    redis.call('ZREM', wq, prev)
end
if kind == 'none' then
    return grant(false)
end
if redis.call('HEXISTS', lock, ARGV[1]) == 1 then
    if redis.call('HGET', lock, '~a') == ARGV[5] then
        redis.call('PEXPIRE', lock, ARGV[2])
        return {1, tonumber(redis.call('HGET', lock, '~fence'))}
    end
    return grant(true)
end
if prev == '' then
    check_types({fence}, 'hash') -- busy: not read here, but a grant to this task writes it
end
local pttl = redis.call('PTTL', lock)
if ARGV[6] == '-' then
    return {0, pttl}
end
fence_waited(fence, pttl, ARGV[3])
if ARGV[6] ~= '' then
    redis.call('HSET', lock, '~w', 1)
    wake_register(wq, ARGV[6], pttl, tonumber(ARGV[7]))
else
    local known = clock_ms() + math.max(pttl, 0) + tonumber(ARGV[7])
    known = math.max(known, tonumber(redis.call('HGET', lock, '~nx') or '0'))
    redis.call('HSET', lock, '~w', 1, '~n', 1, '~nx', string.format('%d', known))
end
return {0, pttl}
