-- renew: the watchdog's batch renewal of many lock and fair-lock holds in one
-- call; also extend().
--
-- KEYS[i]      lock hash of the i-th hold   <prefix>:{<name>}
-- ARGV[1]      lease_ms  each hold still ours is made to last at least this long
--              (0: only check, extend nothing: the watchdog checking a fixed lease)
-- ARGV[2i]     holder field of the i-th hold: the owner (lock, spin lock),
--              or the waiter id (wid) of a fair lock; both keep the token in ~fence
-- ARGV[2i+1]   fencing token of the i-th hold
--
-- Returns an array with one integer per key: 1 if the hold was still this
-- owner's (same token) and now has a TTL of at least lease_ms (never
-- shortened), 0 if it is gone (expired, force-released or taken): lost.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@runner renewal allow-oom  (a watchdog batch: one key per item of many names;
--           cross-slot; as a Redis Function it runs out of memory too)
--@include _types.lua
--@include _renew.lua
local lease_ms = tonumber(ARGV[1])
return renew_each(function(i, key)
    return renew_field(key, ARGV[2 * i], ARGV[2 * i + 1], lease_ms)
end)
