-- rw_release_write: end one owner's write hold, idempotently.
--
-- KEYS[1]  lock hash           <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  released tokens     <prefix>:{<name>}:rel    list, last 64, 60 s
-- KEYS[3]  waiting writers     <prefix>:{<name>}:wq
-- KEYS[4]  parked readers      <prefix>:{<name>}:rq
-- KEYS[5]  readers' signal     <prefix>:{<name>}:signal  (list-mode wake-ups)
-- KEYS[6]  writers' signal     <prefix>:{<name>}:wsignal
-- ARGV[1]  owner               "<client id>:<task serial>"
-- ARGV[2]  token               fencing token of the hold, or "": the hold taken by
--                              the acquire call ARGV[5] (undo of a call whose reply was lost)
-- ARGV[3]  readers' channel    <prefix>:{<name>}:ch
-- ARGV[4]  writers' channel    <prefix>:{<name>}:wch
-- ARGV[5]  nonce               of that acquire call: its waiting-writer entry, if
--                              any, is dropped too
--
-- A read hold of the same owner (a downgrade) stays: the mode becomes read.
-- Wakes every parked reader of every Client (unless a writer waits: they
-- would be refused), and one waiting writer if the lock is now free.
-- Returns 1 if this call released the hold.
-- Returns 2 if an earlier call released this very hold (a retry): nothing changes.
-- Returns 0 if the owner has no such hold (expired or force-released).
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'list', 'zset', 'zset', 'list', 'list')
local key, owner, token, nonce = KEYS[1], ARGV[1], ARGV[2], ARGV[5]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
rw_purge(key, now)
local unwaited = nonce ~= '' and redis.call('ZREM', KEYS[3], owner .. '#' .. nonce) == 1
if rw_is_writer(key, owner, token, nonce) then
    rw_remember(KEYS[2], redis.call('HGET', key, 'wt'))
    rw_drop_writer(key)
    rw_wake_after(rw_settle(key), now, KEYS[3], KEYS[4], ARGV[3], KEYS[5], ARGV[4], KEYS[6])
    return 1
end
if unwaited and redis.call('HEXISTS', key, 'w') == 0 and rw_zlive(KEYS[3], now) == 0 then
    rw_wake_readers(KEYS[4], ARGV[3], KEYS[5], now)
end
if token ~= '' and rw_was_released(KEYS[2], token) then
    return 2
end
return 0
