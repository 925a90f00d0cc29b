-- rw_force_release: evict the writer, every reader, or both, whoever they are.
--
-- KEYS[1]  lock hash           <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  waiting writers     <prefix>:{<name>}:wq
-- KEYS[3]  parked readers      <prefix>:{<name>}:rq
-- KEYS[4]  readers' signal     <prefix>:{<name>}:signal
-- KEYS[5]  writers' signal     <prefix>:{<name>}:wsignal
-- KEYS[6]  fence hash          <prefix>:{<name>}:fence (read only: the evicted tokens' bound)
-- ARGV[1]  what                "write", "read" or "all"
-- ARGV[2]  readers' channel    <prefix>:{<name>}:ch
-- ARGV[3]  writers' channel    <prefix>:{<name>}:wch
-- ARGV[4]  lost_prefix         template of a Client's eviction channel (+ client id)
--
-- The evicted holders' Clients are told on their eviction channels
-- ("x <bound> w|r <lock key>", see _evict.lua), and mark those leases lost;
-- a Client that is not listening finds out at its watchdog's next check. Waiting
-- writers stay registered. The fence hash is left alone, so tokens keep
-- increasing. Wakes waiters as a release would.
-- Returns 1 if a live hold was evicted, 0 if there was none of that kind.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
--@include _evict.lua
check_types(KEYS, 'hash', 'zset', 'zset', 'list', 'list', 'hash')
local key, what = KEYS[1], ARGV[1]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
rw_purge(key, now)
local evicted = 0
local bound = evict_bound(KEYS[6])
if (what == 'write' or what == 'all') and redis.call('HEXISTS', key, 'w') == 1 then
    evict_tell(ARGV[4], {evict_cid(redis.call('HGET', key, 'w'))}, bound, 'w', key)
    rw_drop_writer(key)
    evicted = 1
end
if (what == 'read' or what == 'all') and rw_readers(key) > 0 then
    local flat = redis.call('HGETALL', key)
    local readers = {}
    for i = 1, #flat, 2 do
        local prefix = string.sub(flat[i], 1, 2)
        if prefix == 'r:' or prefix == 'x:' or prefix == 'n:' then
            redis.call('HDEL', key, flat[i])
        end
        if prefix == 'r:' then
            readers[#readers + 1] = evict_cid(string.sub(flat[i], 3))
        end
    end
    evict_tell(ARGV[4], readers, bound, 'r', key)
    redis.call('HDEL', key, 'rc', 'nx')
    evicted = 1
end
if evicted == 0 then
    return 0
end
rw_wake_after(rw_settle(key), now, KEYS[2], KEYS[3], ARGV[2], KEYS[4], ARGV[3], KEYS[5])
return 1
