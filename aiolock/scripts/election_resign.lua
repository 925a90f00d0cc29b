-- election_resign: the leader of an election withdraws its announcement before
-- its hold is released (resign()), and every observer is told.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}:el  (fields: see election_proclaim.lua)
-- ARGV[1]  owner        the hold's owner in Redis "<client id>:<task serial>"
-- ARGV[2]  token        the hold's fencing token in Redis ("~fence")
-- ARGV[3]  notices      the election's channel <prefix>:{<name>}:el:obs
--
-- Returns 1 if the hold is still this owner's with this token: "~v" and "~t"
--   are removed (the hold stays, for its release to end) and "*" is published
--   on the notices channel; 0 if it is not: nothing changes. Idempotent.
-- Refused (WRONGTYPE, nothing changed) if the key holds another type.
--@include _types.lua
local hold = typed('hash', 'HMGET', KEYS[1], ARGV[1], '~fence')
if hold[1] == false or hold[2] ~= ARGV[2] then
    return 0
end
redis.call('HDEL', KEYS[1], '~v', '~t')
redis.call('PUBLISH', ARGV[3], '*')
return 1
