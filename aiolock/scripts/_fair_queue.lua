-- Shared snippet of the fair lock scripts (fair_*.lua): the FIFO queue.
--
-- Keys (all with the hash tag of the name, so one cluster slot):
--   lock   <prefix>:{<name>}        hash: <wid> -> 1, "~fence" -> token (as AsyncLock's)
--   fence  <prefix>:{<name>}:fence  hash: t -> last token issued, r -> last token released
--   queue  <prefix>:{<name>}:q      sorted set with two kinds of members:
--            <wid>   score = arrival number 1, 2, 3...: the waiting entries, FIFO
--            ~<cid>  score = -(deadline, server ms): the liveness of Client <cid>;
--                    its entries are dead once the deadline has passed.
--          The set's TTL is kept at least as long as its latest liveness
--          deadline, so it outlives every live entry, and it is deleted as
--          soon as no entry is left.
--
-- A waiter id (wid) names one acquire call: "<cid>:<task>:<call>:<lease>:<grace>:<mode>":
--   cid    the waiting Client's id (hex)          task, call  serials (unique)
--   lease  TTL in ms of the hold it asked for
--   grace  its Client's lease in ms: a hold handed to it lasts min(lease, grace)
--          until the waiter confirms it by running fair_acquire once more, so a
--          waiter that died after its last renewal costs the queue at most that
--   mode   how to tell its Client: p (PUBLISH <prefix>:{<name>}:ch:<cid>),
--          l (RPUSH <prefix>:{<name>}:sig:<cid>), x (not at all: it polls)
--
-- Those two names depend on the cid found in the queue, so the scripts get
-- them as templates in ARGV (ch_prefix = "<prefix>:{<name>}:ch:", sig_prefix =
-- "<prefix>:{<name>}:sig:") and append the cid; the Client listens on the
-- same template + its id (aiolock/_core/keys.py, FairKeys).
--
-- UNDECLARED KEY: the list-mode signal list <prefix>:{<name>}:sig:<cid> of the
-- Client being told is computed here from the wid: who that is only becomes
-- known inside the script, so it cannot be passed in KEYS. It carries the same
-- hash tag as KEYS[1], hence lives in the same cluster slot.
-- Its type cannot be checked before the first write: a value of another type
-- there is skipped (that Client is not told), never failed on. The Client
-- itself declares it and has its type checked when it queues (KEYS[4] of
-- fair_acquire.lua): a value of another type there refuses its acquire
-- before it waits, so only a value written while it waits is skipped (its
-- waiter retries on its own within a second, see notify.py).
--
-- Messages (payloads): "<wid>" = the lock was handed to wid; confirm it now.
-- "<wid> <ms>" = a hold was taken by (or handed to) a waiter just ahead of
-- wid: it can expire within <ms> (it was never confirmed, or it ends without a
-- release); check back then (a local timer, no command now).
--@include _fence.lua

--@include _clock.lua

-- cid, lease ms, grace ms, mode of a wid (nil if it is not one)
local function fair_parse(wid)
    local cid, lease, grace, mode = string.match(wid, '^(%x+):%d+:%d+:(%d+):(%d+):(%a)$')
    return cid, tonumber(lease), tonumber(grace), mode
end

-- Delete the queue when no entry is left (liveness records alone mean nothing).
local function fair_tidy(q)
    if redis.call('ZCOUNT', q, 1, '+inf') == 0 then
        redis.call('DEL', q)
    end
end

-- The first live entry, or nil. Drops expired liveness records, and the dead
-- entries it meets at the head (each entry is dropped once: amortised O(1)).
local function fair_head(q, now)
    redis.call('ZREMRANGEBYSCORE', q, string.format('%d', -now), '(0')
    while true do
        local first = redis.call('ZRANGEBYSCORE', q, 1, '+inf', 'LIMIT', 0, 1)[1]
        if not first then
            return nil
        end
        local cid = fair_parse(first)
        if cid and redis.call('ZSCORE', q, '~' .. cid) then
            return first
        end
        redis.call('ZREM', q, first)
    end
end

-- Make Client cid's entries live for at least live_ms more (never shortens).
local function fair_keep_alive(q, cid, now, live_ms)
    local member = '~' .. cid
    local deadline = now + live_ms
    local score = redis.call('ZSCORE', q, member)
    if score and -tonumber(score) > deadline then
        deadline = -tonumber(score)
    end
    redis.call('ZADD', q, string.format('%d', -deadline), member)
    if redis.call('PTTL', q) < deadline - now then
        redis.call('PEXPIRE', q, deadline - now)
    end
end

-- Tell Client cid (by its mode) the payload; keep_ms: how long a list item may wait.
local function fair_signal(mode, ch_prefix, sig_prefix, cid, payload, keep_ms)
    if mode == 'p' then
        redis.call('PUBLISH', ch_prefix .. cid, payload)
    elseif mode == 'l' then
        local key = sig_prefix .. cid -- undeclared, same slot: see the header
        local found = redis.call('TYPE', key)['ok']
        if found ~= 'list' and found ~= 'none' then
            -- Not ours (the caller wrote already: it must not fail now). That
            -- Client's own BLPOP on the key fails and reports it.
            return
        end
        redis.call('RPUSH', key, payload)
        redis.call('LTRIM', key, -64, -1)
        redis.call('PEXPIRE', key, math.max(10000, keep_ms))
    end
end

-- A new hold lasting ttl ms was taken by an entry of Client cid (now out of
-- the queue): nudge the first live entry of another Client among the next
-- few ("<wid> <ttl>": check back when the hold can expire, see the header),
-- so that a hold that ends without a release (expired, or never confirmed)
-- is taken up at once, not after the TTL of an older hold that entry saw when
-- it queued. (Client cid's own entries are woken by their Client when its
-- hold ends without a release: _FairState.hold_ended.)
local function fair_nudge(q, cid, ttl, ch_prefix, sig_prefix)
    local after = redis.call('ZRANGEBYSCORE', q, 1, '+inf', 'LIMIT', 0, 8)
    for _, other in ipairs(after) do
        local ocid, _, _, omode = fair_parse(other)
        if ocid and ocid ~= cid and redis.call('ZSCORE', q, '~' .. ocid) then
            fair_signal(omode, ch_prefix, sig_prefix, ocid,
                string.format('%s %d', other, ttl), ttl)
            break
        end
    end
end

-- Give the free lock to the live entry wid: a new token, a TTL of
-- min(lease, grace), a message to its Client only; and a nudge to the first
-- live entry of another Client among the next few (fair_nudge).
local function fair_hand(lock, fence, q, wid, retention_ms, ch_prefix, sig_prefix)
    local cid, lease, grace, mode = fair_parse(wid)
    redis.call('ZREM', q, wid)
    local token = next_token(fence, retention_ms)
    redis.call('HSET', lock, wid, 1, '~fence', string.format('%d', token))
    local ttl = math.min(lease, grace)
    redis.call('PEXPIRE', lock, ttl)
    fair_signal(mode, ch_prefix, sig_prefix, cid, wid, ttl)
    fair_nudge(q, cid, ttl, ch_prefix, sig_prefix)
    fair_tidy(q)
    return token
end

-- If the lock is free, hand it to the first live entry. Deletes an empty queue.
local function fair_settle(lock, fence, q, now, retention_ms, ch_prefix, sig_prefix)
    if redis.call('EXISTS', lock) == 1 then
        fair_tidy(q)
        return
    end
    local head = fair_head(q, now)
    if head then
        fair_hand(lock, fence, q, head, retention_ms, ch_prefix, sig_prefix)
    else
        redis.call('DEL', q)
    end
end

-- Forget the hold `token` of the lock hash (deleted by the caller) as released:
-- a retried release then answers 2.
local function fair_released(fence, token, retention_ms)
    redis.call('HSET', fence, 'r', token)
    if tonumber(redis.call('HGET', fence, 't') or '0') < tonumber(token) then
        redis.call('HSET', fence, 't', token)
    end
    redis.call('PEXPIRE', fence, retention_ms)
end
