-- rw_unwait: a waiting writer gives up (timeout, cancellation): drop its entry.
--
-- KEYS[1]  waiting writers     <prefix>:{<name>}:wq     zset "<owner>#<nonce>" -> expiry ms
-- KEYS[2]  lock hash           <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[3]  parked readers      <prefix>:{<name>}:rq
-- KEYS[4]  readers' signal     <prefix>:{<name>}:signal
-- KEYS[5]  writers' signal     <prefix>:{<name>}:wsignal
-- ARGV[1]  entry               "<owner>#<nonce>" of the acquire call giving up
-- ARGV[2]  readers' channel    <prefix>:{<name>}:ch
-- ARGV[3]  writers' channel    <prefix>:{<name>}:wch
--
-- If no writer waits any more and none holds the lock, every parked reader
-- is woken at once (not after the entry's lease); if the lock is free, one
-- writer is woken too (the one giving up may have taken the last wake-up).
-- Returns 1 if the entry was there, else 0. Idempotent.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'zset', 'hash', 'zset', 'list', 'list')
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
    return 0
end
local key = KEYS[2]
if not rw_kind_ok(key) then
    return 1
end
local now = clock_ms()
rw_purge(key, now)
if redis.call('HEXISTS', key, 'w') == 0 then
    if rw_zlive(KEYS[1], now) == 0 then
        rw_wake_readers(KEYS[3], ARGV[2], KEYS[4], now)
    end
    if rw_readers(key) == 0 then
        rw_wake_writer(ARGV[3], KEYS[5])
    end
end
return 1
