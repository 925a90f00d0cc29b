-- latch_set: start a count-down latch, unless it is already counting.
--
-- KEYS[1]  latch hash  <prefix>:{<name>}   fields: c -> count (absent: zero, open),
--                                          g -> generation (how many times it opened)
-- KEYS[2]  signal list <prefix>:{<name>}:signal  not written here, only its type
--                       checked (the last count-down writes it): a latch that
--                       could not open is refused at its start
-- ARGV[1]  count         >= 1
-- ARGV[2]  retention_ms  TTL of the latch hash
--
-- Returns 1 if the count was set, 0 if the latch was already counting
-- (unchanged). The TTL is (re)set to retention_ms either way: see latch_down.
--@include _types.lua
check_types(KEYS, 'hash', 'list')
if redis.call('HEXISTS', KEYS[1], 'c') == 1 then
    return 0
end
redis.call('HSET', KEYS[1], 'c', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
