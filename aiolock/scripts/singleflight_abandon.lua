-- singleflight_abandon: a runner gives its run up without an outcome (it was
-- cancelled, its Client is closing, or its begin's reply was lost): end the
-- run and wake every waiter, one of which then runs the function.
-- Idempotent: it targets this runner id only.
--
-- KEYS[1]  run hash     <prefix>:{<name>}:sf         (see singleflight_begin.lua)
-- KEYS[2]  signal list  <prefix>:{<name>}:sf:signal  (list-mode wake-ups)
-- ARGV[1]  rid      the runner id
-- ARGV[2]  channel  pub/sub channel of the singleflight's waiters
--
-- Returns 1 if the run was this runner's (deleted, "*" published and
-- pushed), 0 if it was not (gone, or another runner's): nothing changed.
--@include _types.lua
--@include _notify.lua
check_types(KEYS, 'hash', 'list')
if redis.call('HGET', KEYS[1], ARGV[1]) ~= '1' then
    return 0
end
redis.call('DEL', KEYS[1])
notify(ARGV[2], KEYS[2], '*', 16)
return 1
