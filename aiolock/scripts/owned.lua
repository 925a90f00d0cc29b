-- owned: does this owner (a lock's owner, a fair lock's wid) still hold the
-- lock with this token?
--
-- KEYS[1]  lock hash  <prefix>:{<name>}
-- ARGV[1]  holder field: the owner (lock), or the waiter id (fair lock)
-- ARGV[2]  token
--
-- Returns the remaining TTL in ms (-1 if the hash has no TTL) when the hold is
-- still this owner's with this token, or -2 when it is not. Read-only.
--@runner no-writes  (it only reads: its Redis Function is flagged no-writes)
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 and redis.call('HGET', KEYS[1], '~fence') == ARGV[2] then
    return redis.call('PTTL', KEYS[1])
end
return -2
