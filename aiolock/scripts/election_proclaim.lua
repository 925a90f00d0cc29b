-- election_proclaim: the leader of an election announces its value (after it
-- won, and on proclaim()), and every observer is told.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}:el  fields: <owner> -> 1, "~fence" -> token
--                       (see acquire.lua), "~v" -> the value, "~t" -> the term's token
-- ARGV[1]  owner        the hold's owner in Redis "<client id>:<task serial>"
-- ARGV[2]  token        the hold's fencing token in Redis ("~fence")
-- ARGV[3]  term         the term's fencing token (the hold's own; one handed on
--                       inside a Client without a round trip carries a reserved
--                       token above the one in "~fence")
-- ARGV[4]  value        the leader's value (any string, "" included)
-- ARGV[5]  notices      the election's channel <prefix>:{<name>}:el:obs
--
-- Returns 1 if the hold is still this owner's with this token: "~v" and "~t"
--   are set and "*" is published on the notices channel (observers read the
--   leader again); 0 if it is not (expired, force-released, taken): nothing
--   changes.
-- Refused (WRONGTYPE, nothing changed) if the key holds another type.
--@include _types.lua
local hold = typed('hash', 'HMGET', KEYS[1], ARGV[1], '~fence')
if hold[1] == false or hold[2] ~= ARGV[2] then
    return 0
end
redis.call('HSET', KEYS[1], '~v', ARGV[4], '~t', ARGV[3])
redis.call('PUBLISH', ARGV[5], '*')
return 1
