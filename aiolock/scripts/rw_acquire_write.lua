-- rw_acquire_write: take the write hold for one owner, or say how long to wait.
--
-- KEYS[1]  lock hash        <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  fence hash       <prefix>:{<name>}:fence  t -> last token issued
-- KEYS[3]  waiting writers  <prefix>:{<name>}:wq     zset "<owner>#<nonce>" -> expiry ms
-- KEYS[4..7]  parked readers :rq, released tokens :rel, readers' signal
--          :signal, writers' signal :wsignal: not written here, only their
--          types checked (the release and the wake-ups write them): a cycle
--          is refused at its acquire
-- ARGV[1]  owner            "<client id>:<task serial>"
-- ARGV[2]  lease_ms         how long the write hold lasts unless renewed
-- ARGV[3]  retention_ms     TTL of the fence hash
-- ARGV[4]  wait_ms          how long this call's waiting-writer entry lasts
--                           unless renewed (the watchdog renews it, rw_renew_wait);
--                           0: do not register (the caller will not wait)
-- ARGV[5]  nonce            of this acquire call (its retries send the same)
-- ARGV[6]  channel          readers' channel <prefix>:{<name>}:ch
-- ARGV[7]  wchannel         writers' channel <prefix>:{<name>}:wch
--
-- Wait bounds (see _fence.lua): a refusal records its wait_ms as a bound
-- waiters may sleep on; a new hold whose lease ends before such a bound
-- publishes "b <lease_ms>" on both channels (every parked waiter tries again).
--
-- The caller holds no read lock of this name (an upgrade is refused before
-- any round trip) and no write lock (re-entries never get here), so a hold of
-- this owner from another call is a leftover of an abandoned call, and is
-- dropped.
-- Returns {1, token}: the write hold, with a fresh fencing token; or, if this
--   call took it already (same nonce: a retry after a lost reply), that hold,
--   extended.
-- Returns {0, wait_ms}: another writer holds it (wait_ms: its expiry).
-- Returns {2, wait_ms}: readers hold it. Unless wait_ms was 0 ({0, wait_ms}
--   then), this call is now a waiting writer in KEYS[3]: new readers are
--   refused until it gets the lock, gives up (rw_unwait) or its entry
--   expires. wait_ms: when the earliest read hold would expire (it is also
--   woken when the last one is released).
-- Raises an error if another kind of lock uses this name.
--@include _fence.lua
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset')
check_some({KEYS[4], KEYS[5], KEYS[6], KEYS[7]}, 'zset', 'list', 'list', 'list')
local key, owner, nonce = KEYS[1], ARGV[1], ARGV[5]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
local lease = tonumber(ARGV[2])
local member = owner .. '#' .. nonce
rw_purge(key, now)
local writer = redis.call('HGET', key, 'w')
if writer == owner then
    if redis.call('HGET', key, 'wn') == nonce then
        rw_extend(key, 'wx', now, lease)
        redis.call('ZREM', KEYS[3], member)
        return {1, tonumber(redis.call('HGET', key, 'wt'))}
    end
    rw_drop_writer(key)
    writer = nil
end
if writer then
    local wait = tonumber(redis.call('HGET', key, 'wx')) - now
    if wait < 1 then
        wait = 1
    end
    fence_waited(KEYS[2], wait, ARGV[3])
    return {0, wait}
end
rw_drop_reader(key, owner)
rw_settle(key)
if rw_readers(key) > 0 then
    local code = 0
    if tonumber(ARGV[4]) > 0 then
        rw_zkeep(KEYS[3], member, now + tonumber(ARGV[4]), now)
        code = 2
    end
    local wait = redis.call('PTTL', key)
    local nx = tonumber(redis.call('HGET', key, 'nx') or '0')
    if nx > now and nx - now < wait then
        wait = nx - now
    end
    if wait < 1 then
        wait = 1
    end
    fence_waited(KEYS[2], wait, ARGV[3])
    return {code, wait}
end
local token = next_token(KEYS[2], ARGV[3])
redis.call('HSET', key, 'w', owner, 'wt', rw_fmt(token), 'wx', rw_fmt(now + lease), 'wn', nonce)
rw_settle(key)
rw_keep(key, lease)
redis.call('ZREM', KEYS[3], member)
if fence_cut(KEYS[2], lease) then
    rw_bound(ARGV[6], ARGV[7], lease)
end
return {1, token}
