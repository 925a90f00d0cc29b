-- latch_down: count a latch down by one; at zero, open it and wake every waiter.
--
-- KEYS[1]  latch hash   <prefix>:{<name>}         (fields: see latch_set.lua)
-- KEYS[2]  signal list  <prefix>:{<name>}:signal  (list-mode wake-ups)
-- ARGV[1]  channel       pub/sub channel of the latch
-- ARGV[2]  retention_ms  TTL of the latch hash
--
-- Returns the count after the call (0 if it was already open: a no-op).
-- On reaching zero: the count is removed, the generation g is incremented
-- (a waiter that saw the latch counting returns once g moved, even if the
-- latch was set counting again before it looked), and "*" is published and
-- pushed 16 times. The hash lives retention_ms after its last count-down,
-- try_set_count or waiter check.
--@include _notify.lua
--@include _types.lua
check_types(KEYS, 'hash', 'list')
local c = tonumber(redis.call('HGET', KEYS[1], 'c'))
if not c then
    return 0
end
c = c - 1
if c <= 0 then
    redis.call('HDEL', KEYS[1], 'c')
    redis.call('HINCRBY', KEYS[1], 'g', 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    notify(ARGV[1], KEYS[2], '*', 16)
    return 0
end
redis.call('HSET', KEYS[1], 'c', c)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return c
