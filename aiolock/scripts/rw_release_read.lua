-- rw_release_read: end one owner's read hold, idempotently.
--
-- KEYS[1]  lock hash           <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  released tokens     <prefix>:{<name>}:rel    list, last 64, 60 s
-- KEYS[3]  writers' signal     <prefix>:{<name>}:wsignal (list-mode wake-ups)
-- ARGV[1]  owner               "<client id>:<task serial>"
-- ARGV[2]  token               fencing token of the hold, or "": the hold taken by
--                              the acquire call ARGV[4] (undo of a call whose reply was lost)
-- ARGV[3]  writers' channel    <prefix>:{<name>}:wch
-- ARGV[4]  nonce               of that acquire call (only used when ARGV[2] is "")
--
-- When this was the last hold of the lock, one waiting writer is woken.
-- Returns 1 if this call released the hold.
-- Returns 2 if an earlier call released this very hold (a retry): nothing changes.
-- Returns 0 if the owner has no such hold (expired or force-released): nothing changes.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'list', 'list')
local key, owner, token = KEYS[1], ARGV[1], ARGV[2]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
rw_purge(key, now)
if rw_is_reader(key, owner, token, ARGV[4]) then
    rw_remember(KEYS[2], redis.call('HGET', key, 'r:' .. owner))
    rw_drop_reader(key, owner)
    if not rw_settle(key) then
        rw_wake_writer(ARGV[3], KEYS[3])
    end
    return 1
end
if token ~= '' and rw_was_released(KEYS[2], token) then
    return 2
end
return 0
