-- Shared snippet of the force-release scripts: tell each evicted holder's
-- Client at once, on its eviction channel (aiolock/_core/evict.py).
--
-- The channel is template .. <client id>, the template coming in ARGV
-- (aiolock/_core/keys.py, lost_prefix): "<prefix>:lost:" standalone, one
-- channel per Client; in cluster mode "<prefix>:{<tag>}:lost:" with a hash
-- tag of this name's slot (the script's PUBLISH, made SPUBLISH there, stays
-- in its slot), one channel per Client and slot. The message:
--   "x <bound> <side> <key>"
--     bound  the last fencing token issued for the name (field `t` of the
--            fence hash; if that expired, the server clock in microseconds
--            minus 1): every hold deleted has a token <= bound, every later
--            hold a larger one (_fence.lua). The Client marks lost its holds
--            of `key` with a token <= bound, never a newer hold of its own.
--     side   "w" (a read-write lock's writer), "r" (its readers), "*" (any hold)
--     key    the key the evicted holds are renewed at (their renew_key)
-- A Client that does not listen (PUBLISH reaches nobody: disconnected, list or
-- poll mode) is not told: its watchdog finds the hold gone within lease / 3.

-- The largest token a hold of the name existing now can have.
local function evict_bound(fence)
    local t = redis.call('HGET', fence, 't')
    if t then
        return t
    end
    local now = redis.call('TIME')
    return string.format('%d', tonumber(now[1]) * 1000000 + tonumber(now[2]) - 1)
end

-- The client id of an owner id "<client id>:...", or nil.
local function evict_cid(owner)
    return string.match(owner, '^(%x+):')
end

-- Publish the eviction to each Client among `cids` (nil entries skipped), once each.
local function evict_tell(template, cids, bound, side, key)
    if template == nil or template == '' then
        return
    end
    local told = {}
    local message = 'x ' .. bound .. ' ' .. side .. ' ' .. key
    for _, cid in pairs(cids) do
        if cid and not told[cid] then
            told[cid] = true
            redis.call('PUBLISH', template .. cid, message)
        end
    end
end

-- The client ids of the holders of lock hash `key` (AsyncLock, FairLock:
-- fields "<client id>:..."; the "~" fields are not holders).
local function evict_hash_cids(key)
    local cids = {}
    for _, field in ipairs(redis.call('HKEYS', key)) do
        local cid = evict_cid(field)
        if cid then
            cids[#cids + 1] = cid
        end
    end
    return cids
end
