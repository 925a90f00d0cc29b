-- release: end one owner's hold, idempotently, and wake a waiter.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  fence hash   <prefix>:{<name>}:fence
-- KEYS[3]  signal list  <prefix>:{<name>}:signal   (list-mode wake-ups, see _notify.lua)
-- KEYS[4]  waiting set  <prefix>:{<name>}:wq       (targeted wake-ups, see _wake.lua)
-- ARGV[1]  owner        "<client id>:<task serial>"
-- ARGV[2]  token        fencing token of the hold, or "": the hold taken by the acquire
--                       attempt ARGV[6] (the undo of an attempt whose reply was lost)
-- ARGV[3]  channel      pub/sub channel of the lock <prefix>:{<name>}:ch: "1" (wake
--                       one) is sent on it and pushed onto the signal list when the
--                       lock ends free and a waiter that is not registered flagged
--                       it ("~n": list and poll modes, spin and multi-locks)
-- ARGV[4]  wait_prefix  <prefix>:{<name>}:w: the template of a Client's own channel
--                       (+ client id, see _wake.lua)
-- ARGV[5]  retention_ms TTL of the fence hash
-- ARGV[6]  attempt      (only read when token is ""): the attempt id the hold must
--                       carry in "~a" (see acquire.lua), or "" for a hold that
--                       carries none (one handed over locally, see handoff.lua).
--                       A hold of the same owner from another attempt (the same
--                       task's next acquire) is not touched.
--
-- Returns 1 if this call released the hold: the lock is granted to the next
--   registered waiter, if any (see _wake.lua), and is deleted otherwise.
-- Returns 2 if the hold was already released by an earlier call with the same
--   owner and token (a retry after a lost reply): nothing changes.
-- Returns 0 if the owner does not hold the lock (expired, force-released, or
--   taken by another owner since): nothing changes.
-- Refused (WRONGTYPE, nothing changed) if a key it would write holds a value
-- of another type. Checked without a TYPE per key: the hash and the fence
-- hash by typed reads that precede every write; the signal list and the
-- waiting set by one EXISTS while neither exists.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _free.lua
--@include _types.lua
-- One read of the hash: the owner's entry, the hold's token, the flag, the attempt.
local hold = typed('hash', 'HMGET', KEYS[1], ARGV[1], '~fence', '~n', '~a')
local token = ARGV[2]
local holder = hold[1] ~= false
    and (hold[2] == token or (token == '' and (hold[4] or '') == ARGV[6]))
if holder then
    token = hold[2]
    check_some({KEYS[3], KEYS[4]}, 'list', 'zset')
    if tonumber(typed('hash', 'HGET', KEYS[2], 't') or '0') < tonumber(token) then
        redis.call('HSET', KEYS[2], 't', token)
    end
    free_lock(KEYS, token, ARGV[5], hold[3] ~= false, ARGV[3], ARGV[4])
    return 1
end
if token ~= '' and typed('hash', 'HGET', KEYS[2], 'r') == token then
    return 2
end
return 0
