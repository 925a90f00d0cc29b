-- Shared snippet of the read-write lock scripts (rw_*.lua).
--
-- The lock hash <prefix>:{<name>} holds every hold of one read-write lock:
--   mode        "write" while a writer holds it, else "read" (derived; it also
--               marks the hash as a read-write lock's)
--   w, wt, wx   the writer: owner, fencing token, expiry (server time, ms)
--   wn          the nonce of the acquire call that took the write hold
--   r:<owner>   a reader's fencing token
--   x:<owner>   that reader's expiry (server time, ms)
--   n:<owner>   the nonce of the acquire call that took that read hold
--   rc          how many readers (absent: none)
--   nx          a lower bound of the earliest reader expiry: once it passes,
--               the next script scans the readers and drops the expired ones
-- A nonce (unique per acquire call of a Client) tells a retry of the same
-- call (same nonce: answer with the same hold) from a new call by the same
-- task (another nonce: the old entry is a leftover of an abandoned call,
-- whose undo may still be on its way, and is replaced by a fresh hold).
-- Every hold expires on its own (its expiry field); the hash's TTL is never
-- shorter than the latest expiry in it, and the hash is deleted as soon as it
-- holds nothing. So a crashed reader or writer pins the lock no longer than
-- its own lease, whoever else keeps renewing theirs.
--
-- Other keys (all with TTLs):
--   <prefix>:{<name>}:fence  fencing counter (_fence.lua), shared by reads and writes
--   <prefix>:{<name>}:rel    the last 64 released tokens (60 s): idempotent release
--   <prefix>:{<name>}:wq     zset: writers waiting for readers to leave
--                            ("<owner>#<nonce>" -> expiry ms);
--                            while it is not empty, no new reader is let in
--   <prefix>:{<name>}:rq     zset: Clients with parked readers (client id -> expiry ms);
--                            a write release pushes one list-mode wake-up per Client
--   <prefix>:{<name>}:signal, :wsignal   list-mode wake-ups of readers, of writers
-- Channels (ARGV, never built here: aiolock/_core/keys.py, RWKeys):
--   <prefix>:{<name>}:ch (readers, "*"), <prefix>:{<name>}:wch (writers, "1").
--@include _notify.lua

local RW_WRONG_KIND = 'AIOLOCK another kind of lock uses this name (not a read-write lock)'

local function rw_fmt(n)
    return string.format('%d', n)
end

--@include _clock.lua

-- A new hold lasting `ms` may expire before the bound some waiter sleeps on
-- (fence_cut, see _fence.lua): every parked reader and writer tries again.
local function rw_bound(channel, wchannel, ms)
    local message = string.format('b %d', ms)
    redis.call('PUBLISH', channel, message)
    redis.call('PUBLISH', wchannel, message)
end

-- Is `key` free, or a read-write lock's hash?
local function rw_kind_ok(key)
    return redis.call('EXISTS', key) == 0 or redis.call('HEXISTS', key, 'mode') == 1
end

-- Make `key` live at least `ms` from now; never shortens its TTL.
local function rw_keep(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, rw_fmt(ms))
    end
end

-- After a change: delete the hash if it holds nothing, else set its mode.
-- Returns 'write', 'read', or false (the lock is free).
local function rw_settle(key)
    local writer = redis.call('HEXISTS', key, 'w') == 1
    local readers = tonumber(redis.call('HGET', key, 'rc') or '0')
    if not writer and readers <= 0 then
        redis.call('DEL', key)
        return false
    end
    if readers <= 0 then
        redis.call('HDEL', key, 'rc', 'nx')
    end
    local mode = 'read'
    if writer then
        mode = 'write'
    end
    redis.call('HSET', key, 'mode', mode)
    return mode
end

-- Drop expired holds (the writer's, and readers' once `nx` has passed).
local function rw_purge(key, now)
    local changed = false
    local wx = tonumber(redis.call('HGET', key, 'wx') or '0')
    if wx > 0 and wx <= now then
        redis.call('HDEL', key, 'w', 'wt', 'wx', 'wn')
        changed = true
    end
    local nx = tonumber(redis.call('HGET', key, 'nx') or '0')
    if nx > 0 and nx <= now then
        local flat = redis.call('HGETALL', key)
        local count, low = 0, 0
        for i = 1, #flat, 2 do
            local field = flat[i]
            if string.sub(field, 1, 2) == 'x:' then
                local expiry = tonumber(flat[i + 1])
                if expiry <= now then
                    local owner = string.sub(field, 3)
                    redis.call('HDEL', key, field, 'r:' .. owner, 'n:' .. owner)
                else
                    count = count + 1
                    if low == 0 or expiry < low then
                        low = expiry
                    end
                end
            end
        end
        if count > 0 then
            redis.call('HSET', key, 'rc', count, 'nx', rw_fmt(low))
        else
            redis.call('HDEL', key, 'rc', 'nx')
        end
        changed = true
    end
    if changed then
        rw_settle(key)
    end
end

local function rw_readers(key)
    return tonumber(redis.call('HGET', key, 'rc') or '0')
end

local function rw_add_reader(key, owner, token, expiry, nonce)
    redis.call('HSET', key, 'r:' .. owner, rw_fmt(token), 'x:' .. owner, rw_fmt(expiry),
        'n:' .. owner, nonce)
    redis.call('HINCRBY', key, 'rc', 1)
    local nx = tonumber(redis.call('HGET', key, 'nx') or '0')
    if nx == 0 or expiry < nx then
        redis.call('HSET', key, 'nx', rw_fmt(expiry))
    end
end

-- Callers settle afterwards (the hash keeps its `mode` field meanwhile).
local function rw_drop_reader(key, owner)
    if redis.call('HDEL', key, 'r:' .. owner, 'x:' .. owner, 'n:' .. owner) > 0 then
        redis.call('HINCRBY', key, 'rc', -1)
    end
end

-- Set the expiry field `field` to at least now + ms; keep the hash alive that long.
local function rw_extend(key, field, now, ms)
    local expiry = now + ms
    if tonumber(redis.call('HGET', key, field) or '0') < expiry then
        redis.call('HSET', key, field, rw_fmt(expiry))
    end
    rw_keep(key, ms)
end

local function rw_drop_writer(key)
    redis.call('HDEL', key, 'w', 'wt', 'wx', 'wn')
end

-- Is this the read hold of `owner` named by `token` (or, if token is "", by `nonce`)?
local function rw_is_reader(key, owner, token, nonce)
    if token ~= '' then
        return redis.call('HGET', key, 'r:' .. owner) == token
    end
    return nonce ~= '' and redis.call('HGET', key, 'n:' .. owner) == nonce
end

-- Is this the write hold of `owner` named by `token` (or, if token is "", by `nonce`)?
local function rw_is_writer(key, owner, token, nonce)
    if redis.call('HGET', key, 'w') ~= owner then
        return false
    end
    if token ~= '' then
        return redis.call('HGET', key, 'wt') == token
    end
    return nonce ~= '' and redis.call('HGET', key, 'wn') == nonce
end

-- Idempotent release: remember the released token for a while.
local function rw_remember(rel_key, token)
    redis.call('LPUSH', rel_key, token)
    redis.call('LTRIM', rel_key, 0, 63)
    redis.call('PEXPIRE', rel_key, 60000)
end

local function rw_was_released(rel_key, token)
    return redis.call('LPOS', rel_key, token) ~= false
end

-- A zset of member -> expiry: add or extend (never shortens), keep the key alive.
local function rw_zkeep(zkey, member, expiry, now)
    local old = tonumber(redis.call('ZSCORE', zkey, member) or '0')
    if old < expiry then
        redis.call('ZADD', zkey, rw_fmt(expiry), member)
    end
    rw_keep(zkey, expiry - now)
end

-- Drop expired members; return how many are left.
local function rw_zlive(zkey, now)
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', rw_fmt(now))
    return redis.call('ZCARD', zkey)
end

-- Wake every parked reader of every Client: "*" on the readers' channel, and
-- one list item per Client that has parked readers (each Client's BLPOP takes one).
local function rw_wake_readers(rq_key, channel, signal_key, now)
    local copies = rw_zlive(rq_key, now)
    redis.call('DEL', rq_key)
    notify(channel, signal_key, '*', copies)
end

-- Wake one waiting writer.
local function rw_wake_writer(channel, signal_key)
    notify(channel, signal_key, '1', 1)
end

-- Holds were dropped and rw_settle answered `mode`: wake every parked reader
-- unless a writer holds the lock or waits for it, and one waiting writer if
-- the lock is free. (Names: waiting writers, parked readers, the readers'
-- channel and signal list, the writers' channel and signal list.)
local function rw_wake_after(mode, now, wq, rq, channel, signal, wchannel, wsignal)
    if mode ~= 'write' and rw_zlive(wq, now) == 0 then
        rw_wake_readers(rq, channel, signal, now)
    end
    if not mode then
        rw_wake_writer(wchannel, wsignal)
    end
end
