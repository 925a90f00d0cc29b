-- Shared snippet (included by scripts that issue fencing tokens).
--
-- next_token(fence_key, retention_ms[, reserve]) -> integer
--   Returns a fencing token strictly greater than the last one recorded in
--   the hash `fence_key` (field `t`) and never smaller than the server's
--   clock in microseconds. Records token + reserve - 1 in `t` (reserve
--   defaults to 1): the caller may hand out the reserve - 1 tokens after it
--   itself, without a round trip (cohort handoffs among one Client's
--   tasks). (Re)sets the hash's TTL to `retention_ms`, so the counter of a
--   name nobody uses any more expires.
--   After expiry (or a restart that lost the data) the clock floor keeps
--   tokens increasing: a token runs ahead of the clock by at most one
--   microsecond per acquisition issued within the same microsecond.
--   Cluster failover: replication is asynchronous, so a promoted replica may
--   lack the master's last writes to `t` (and the hold itself). The clock
--   floor covers that too: the new master's clock passed every token the old
--   one issued as long as the two nodes' clocks differ by less than the
--   failover took (at least cluster-node-timeout; tokens run ahead of the
--   clock by ~reserve microseconds only). A manual CLUSTER FAILOVER waits for
--   the replica to catch up and loses nothing; FORCE/TAKEOVER can be faster
--   than a clock skew, and then the order rests on the clocks alone.
local function next_token(fence_key, retention_ms, reserve)
    local now = redis.call('TIME')
    local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local last = tonumber(redis.call('HGET', fence_key, 't') or '0')
    local token = clock
    if last >= token then
        token = last + 1
    end
    redis.call('HSET', fence_key, 't', string.format('%d', token + (tonumber(reserve) or 1) - 1))
    redis.call('PEXPIRE', fence_key, retention_ms)
    return token
end
