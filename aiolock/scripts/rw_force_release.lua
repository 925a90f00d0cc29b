-- rw_force_release: evict the writer, every reader, or both, whoever they are.
--
-- KEYS[1]  lock hash           <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  waiting writers     <prefix>:{<name>}:wq
-- KEYS[3]  parked readers      <prefix>:{<name>}:rq
-- KEYS[4]  readers' signal     <prefix>:{<name>}:signal
-- KEYS[5]  writers' signal     <prefix>:{<name>}:wsignal
-- ARGV[1]  what                "write", "read" or "all"
-- ARGV[2]  readers' channel    <prefix>:{<name>}:ch
-- ARGV[3]  writers' channel    <prefix>:{<name>}:wch
--
-- The evicted holders' leases are lost (found by their watchdogs). Waiting
-- writers stay registered. The fence hash is left alone, so tokens keep
-- increasing. Wakes waiters as a release would.
-- Returns 1 if a live hold was evicted, 0 if there was none of that kind.
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'zset', 'zset', 'list', 'list')
local key, what = KEYS[1], ARGV[1]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
rw_purge(key, now)
local evicted = 0
if (what == 'write' or what == 'all') and redis.call('HEXISTS', key, 'w') == 1 then
    rw_drop_writer(key)
    evicted = 1
end
if (what == 'read' or what == 'all') and rw_readers(key) > 0 then
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
        local prefix = string.sub(flat[i], 1, 2)
        if prefix == 'r:' or prefix == 'x:' or prefix == 'n:' then
            redis.call('HDEL', key, flat[i])
        end
    end
    redis.call('HDEL', key, 'rc', 'nx')
    evicted = 1
end
if evicted == 0 then
    return 0
end
rw_wake_after(rw_settle(key), now, KEYS[2], KEYS[3], ARGV[2], KEYS[4], ARGV[3], KEYS[5])
return 1
