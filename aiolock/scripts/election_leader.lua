-- election_leader: read an election's leader. Read-only.
--
-- KEYS[1]  lock hash    <prefix>:{<name>}:el  (fields: see election_proclaim.lua)
--
-- Returns {value, term, pttl}: the announced value and the term's fencing
--   token ("" and "" when nobody leads: no hold, or a hold not announced yet),
--   and the hash's remaining TTL in ms (-2: no hash; -1: no TTL). A key of
--   another type reads as no leader.
--@include _types.lua
local hold = read_typed('HMGET', KEYS[1], '~v', '~t')
local pttl = redis.call('PTTL', KEYS[1])
if hold == nil or hold[2] == false then
    return {'', '', pttl}
end
return {hold[1] or '', hold[2], pttl}
