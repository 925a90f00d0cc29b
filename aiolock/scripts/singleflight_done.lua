-- singleflight_done: the runner's end: record the outcome, end the run, wake
-- every waiter of every Client.
--
-- KEYS[1]  run hash     <prefix>:{<name>}:sf         (see singleflight_begin.lua)
-- KEYS[2]  result hash  <prefix>:{<name>}:sf:res
-- KEYS[3]  signal list  <prefix>:{<name>}:sf:signal  (list-mode wake-ups)
-- ARGV[1]  rid         the runner id that holds the run
-- ARGV[2]  token       its fencing token
-- ARGV[3]  kind        "v" a value, "e" an exception, "x" an unshareable result
-- ARGV[4]  payload     the serialized value / {"type", "message"} / the reason
-- ARGV[5]  keep_ms     how long the record is kept (ttl, or the waiters' window)
-- ARGV[6]  cacheable   "1": later callers take it too; "0": only this run's waiters
-- ARGV[7]  channel     pub/sub channel of the singleflight's waiters
--
-- Returns 1 if the run was still this runner's (the record written, unless
-- a newer one is there, the run hash deleted, "*" published and pushed);
-- 0 if it was gone (its lease ran out, or another runner took over):
-- nothing is written, so a runner that lost its lease never overwrites the
-- result of a newer run.
--@include _types.lua
--@include _notify.lua
check_types(KEYS, 'hash', 'hash', 'list')
if redis.call('HGET', KEYS[1], ARGV[1]) ~= '1'
    or redis.call('HGET', KEYS[1], '~fence') ~= ARGV[2] then
    return 0
end
local last = tonumber(redis.call('HGET', KEYS[2], 't') or '0')
if last < tonumber(ARGV[2]) then
    redis.call('DEL', KEYS[2])
    redis.call('HSET', KEYS[2], 't', ARGV[2], 'k', ARGV[3], 'v', ARGV[4], 'c', ARGV[6])
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
redis.call('DEL', KEYS[1])
notify(ARGV[7], KEYS[3], '*', 16)
return 1
