-- fair_owned: does this waiter id still hold the fair lock with this token?
--
-- KEYS[1]  lock hash  <prefix>:{<name>}
-- ARGV[1]  wid
-- ARGV[2]  token
--
-- Returns the remaining TTL in ms (-1 if none) when the hold is still this
-- wid's with this token, -2 when it is not. Read-only.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 and redis.call('HGET', KEYS[1], '~fence') == ARGV[2] then
    return redis.call('PTTL', KEYS[1])
end
return -2
