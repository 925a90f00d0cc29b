-- probe: whether this server lets a script PUBLISH (the Client's capability
-- probe, aiolock/_core/topology/probe.py: run when a Client settles, and
-- again after a Sentinel failover). It runs as written (SPUBLISH in a
-- cluster), never in the unpublished variant it chooses between.
--
-- KEYS[1]  probe key    <prefix>:{aiolock-probe}  (never read or written: it
--                       routes the call, and a script must declare a key)
-- ARGV[1]  channel      <prefix>:{aiolock-probe}:ch  (KEYS[1]'s slot; its
--                       message, an empty string, reaches nobody)
--
-- Returns "" if the PUBLISH ran, else the server's refusal of it (e.g. Tair's
-- "command not allowed in script"). Writes no key.
local ok, err = pcall(function()
    return redis.call('PUBLISH', ARGV[1], '')
end)
if ok then
    return ''
end
if type(err) == 'table' then
    return tostring(err.err or err)
end
return tostring(err)
