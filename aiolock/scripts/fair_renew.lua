-- fair_renew: the watchdog's batch renewal of fair-lock holds; also extend().
--
-- KEYS[i]      lock hash of the i-th hold   <prefix>:{<name>}
-- ARGV[1]      lease_ms  each hold still ours is made to last at least this long
--              (0: only check, extend nothing: the watchdog checking a fixed lease)
-- ARGV[2i]     wid of the i-th hold
-- ARGV[2i+1]   fencing token of the i-th hold
--
-- Returns one integer per key: 1 if the hold is still this wid's with this
-- token and now lasts at least lease_ms (never shortened), 0 if it is gone.
-- Never fails on a key of another type (someone overwrote it): that one is
-- gone (0), and the other keys of the batch are renewed all the same.
--@include _types.lua
--@include _renew.lua
local lease_ms = tonumber(ARGV[1])
return renew_each(function(i, key)
    return renew_field(key, ARGV[2 * i], ARGV[2 * i + 1], lease_ms)
end)
