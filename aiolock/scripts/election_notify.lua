-- election_notify: tell an election's observers to read the leader again
-- (after a force release, which deletes the hold without a word to them).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}:el  (only its type is checked: it
--                       routes the call to the node of the election's slot)
-- ARGV[1]  notices      the election's channel <prefix>:{<name>}:el:obs
--
-- Returns the number of receivers PUBLISH counted. Writes no key.
-- Refused (WRONGTYPE) if the key holds another type than a hash.
--@include _types.lua
check_types(KEYS, 'hash')
return redis.call('PUBLISH', ARGV[1], '*')
