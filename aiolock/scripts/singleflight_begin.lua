-- singleflight_begin: a caller's look at a singleflight: take a finished run's
-- result, wait for the run under way, or start the run (take its hold).
--
-- KEYS[1]  run hash     <prefix>:{<name>}:sf        (the runner: field <rid> = 1,
--                                                    ~fence = its fencing token)
-- KEYS[2]  fence hash   <prefix>:{<name>}:sf:fence  (t: last token issued)
-- KEYS[3]  result hash  <prefix>:{<name>}:sf:res    (t token of the run that wrote it,
--                                                    k kind, v payload, c cacheable)
-- ARGV[1]  rid           this call's runner id, <owner>:<attempt>
-- ARGV[2]  lease_ms      TTL of the run hash (the watchdog renews it)
-- ARGV[3]  retention_ms  TTL of the fence hash
-- ARGV[4]  seen          the token of the run this caller saw under way (0: none)
--
-- Returns one of:
--   {2, kind, payload, token}  a result to take: a cacheable one (written with
--                              ttl > 0), or any written by the run this caller
--                              waited for (token >= seen) or a later one;
--                              kind "v" value, "e" exception, "x" unshareable
--   {0, pttl_ms, token}        a run is under way (its hold's TTL, its token)
--   {1, token}                 this call now runs the function: the run hash
--                              holds rid with this fencing token for lease_ms
--@include _types.lua
--@include _fence.lua
-- (No TYPE per key on this path, which every waiting Client takes: each key
-- is first read with typed(), which fails naming the key before any write.)
local seen = tonumber(ARGV[4])
if typed('hash', 'HEXISTS', KEYS[3], 't') == 1 then
    local rec = redis.call('HMGET', KEYS[3], 't', 'k', 'v', 'c')
    if rec[4] == '1' or (seen > 0 and tonumber(rec[1]) >= seen) then
        return {2, rec[2], rec[3], tonumber(rec[1])}
    end
end
local running = typed('hash', 'HGET', KEYS[1], '~fence')
if running then
    return {0, redis.call('PTTL', KEYS[1]), tonumber(running)}
end
local token = next_token(KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], '1', '~fence', string.format('%d', token))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token}
