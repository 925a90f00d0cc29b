-- fair_live: the watchdog's batch renewal of waiting Clients' queue entries.
--
-- KEYS[i]      queue zset of the i-th name   <prefix>:{<name>}:q  (see _fair_queue.lua)
-- ARGV[1]      lease_ms  the Client's lease: its entries live at least this long more
-- ARGV[1+i]    the Client's id (cid) for the i-th name
--
-- One renewal covers every waiting task of that Client on that name. Returns
-- one integer per key: 1 if the Client's liveness record was still valid (it
-- now lasts at least lease_ms, never shortened), 0 if it had expired or the
-- queue is gone: its entries may have been dropped, so its waiters must queue
-- up again.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@runner renewal allow-oom  (a watchdog batch: one key per item of many names;
--           cross-slot; as a Redis Function it runs out of memory too)
--@include _fair_queue.lua
--@include _types.lua
--@include _renew.lua
local lease_ms = tonumber(ARGV[1])
local now = clock_ms()
return renew_each(function(i, q)
    local cid = ARGV[1 + i]
    local score = is_type(q, 'zset') and redis.call('ZSCORE', q, '~' .. cid)
    if score and -tonumber(score) > now then
        fair_keep_alive(q, cid, now, lease_ms)
        return true
    end
    return false
end)
