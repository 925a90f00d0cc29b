-- rw_acquire_read: take a read hold for one owner, or say how long to wait.
--
-- KEYS[1]  lock hash        <prefix>:{<name>}        (layout: _rw_common.lua)
-- KEYS[2]  fence hash       <prefix>:{<name>}:fence  t -> last token issued
-- KEYS[3]  waiting writers  <prefix>:{<name>}:wq     zset "<owner>#<nonce>" -> expiry ms
-- KEYS[4]  parked readers   <prefix>:{<name>}:rq     zset client id -> expiry ms
-- KEYS[5..7]  released tokens :rel, readers' signal :signal, writers' signal
--          :wsignal: not written here, only their types checked (the release
--          and the wake-ups write them): a cycle is refused at its acquire
-- ARGV[1]  owner            "<client id>:<task serial>"
-- ARGV[2]  lease_ms         how long the read hold lasts unless renewed
-- ARGV[3]  retention_ms     TTL of the fence hash
-- ARGV[4]  client id        recorded in KEYS[4] when refused; "": record nothing
--                           (a try that will not wait)
-- ARGV[5]  nonce            of this acquire call (its retries send the same)
-- ARGV[6]  channel          readers' channel <prefix>:{<name>}:ch
-- ARGV[7]  wchannel         writers' channel <prefix>:{<name>}:wch
--
-- Wait bounds (see _fence.lua): a refusal records its wait_ms as a bound
-- waiters may sleep on; a new hold whose lease ends before such a bound
-- publishes "b <lease_ms>" on both channels (every parked waiter tries again).
--
-- Granted when nobody else holds the write lock and no writer waits for the
-- readers to leave; the writer itself may always take it (a downgrade).
-- Returns {1, token}: a new read hold with a fresh fencing token; or, if this
--   call took it already (same nonce: a retry after a lost reply), that hold,
--   extended. A read hold of this owner from another call is a leftover (the
--   caller holds no read lock: re-entries never get here) and is replaced.
-- Returns {0, wait_ms}: refused; wait_ms bounds the wait before trying again
--   (when the writer's hold, or the waiting writers' entries, would expire).
-- Raises an error if another kind of lock uses this name.
--@include _fence.lua
--@include _rw_common.lua
--@include _types.lua
check_types(KEYS, 'hash', 'hash', 'zset', 'zset')
check_some({KEYS[5], KEYS[6], KEYS[7]}, 'list', 'list', 'list')
local key, owner, nonce = KEYS[1], ARGV[1], ARGV[5]
if not rw_kind_ok(key) then
    return redis.error_reply(RW_WRONG_KIND)
end
local now = clock_ms()
local lease = tonumber(ARGV[2])
rw_purge(key, now)
local token = redis.call('HGET', key, 'r:' .. owner)
if token then
    if redis.call('HGET', key, 'n:' .. owner) == nonce then
        rw_extend(key, 'x:' .. owner, now, lease)
        return {1, tonumber(token)}
    end
    rw_drop_reader(key, owner)
    rw_settle(key)
end
local writer = redis.call('HGET', key, 'w')
local wait = nil
if writer and writer ~= owner then
    wait = tonumber(redis.call('HGET', key, 'wx')) - now
elseif not writer and rw_zlive(KEYS[3], now) > 0 then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    wait = tonumber(last[2]) - now
end
if wait then
    if wait < 1 then
        wait = 1
    end
    if ARGV[4] ~= '' then
        rw_zkeep(KEYS[4], ARGV[4], now + wait + 1000, now)
        fence_waited(KEYS[2], wait, ARGV[3])
    end
    return {0, wait}
end
token = next_token(KEYS[2], ARGV[3])
rw_add_reader(key, owner, token, now + lease, nonce)
rw_settle(key)
rw_keep(key, lease)
if fence_cut(KEYS[2], lease) then
    rw_bound(ARGV[6], ARGV[7], lease)
end
return {1, token}
