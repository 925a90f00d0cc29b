-- sem_release: return the permits of one acquisition, idempotently; also undoes an acquire.
--
-- KEYS[1]  main hash     <prefix>:{<name>}         (layout: see _sem.lua)
-- KEYS[2]  holder zset   <prefix>:{<name>}:h
-- KEYS[3]  released zset <prefix>:{<name>}:r
-- KEYS[4]  signal list   <prefix>:{<name>}:signal
-- ARGV[1]  member        "<permits>|<holder id>" of the acquisition
-- ARGV[2]  default_n     N to initialise the semaphore with if it has none
-- ARGV[3]  retention_ms  TTL of the main hash
-- ARGV[4]  channel       pub/sub channel of the semaphore
--
-- Returns 1 if this call returned the permits (waiters are woken: as many as
--   permits came free, per Client).
-- Returns 2 if this member's permits were already returned by an earlier call
--   (a retry after a lost reply; remembered for 120 s / the last 10,000 releases).
-- Returns 0 if the member holds nothing (it expired, or never held).
-- Either way a claim of this member (a waiter giving up) is dropped.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _sem.lua
--@include _types.lua
check_types(KEYS, 'hash', 'zset', 'zset', 'list')
local main, holders, released = KEYS[1], KEYS[2], KEYS[3]
local member = ARGV[1]
local now = clock_ms()
local n, used, freed = sem_state(main, holders, ARGV[2], now)
local code = 0
if redis.call('ZREM', holders, member) == 1 then
    local k = sem_permits_of(member)
    used = used - k
    freed = freed + k
    redis.call('HSET', main, 'u', used)
    redis.call('ZADD', released, now, member)
    redis.call('ZREMRANGEBYSCORE', released, '-inf', now - SEM_RELEASED_MS)
    if redis.call('ZCARD', released) > SEM_RELEASED_MAX then
        redis.call('ZREMRANGEBYRANK', released, 0, -SEM_RELEASED_MAX - 1)
    end
    redis.call('PEXPIRE', released, SEM_RELEASED_MS)
    code = 1
elseif redis.call('ZSCORE', released, member) then
    code = 2
end
if redis.call('HGET', main, 'c') == member then
    redis.call('HDEL', main, 'c', 'ck', 'ce', 'cs')
    freed = freed + math.max(n - used, 0)
end
sem_wake(main, ARGV[4], KEYS[4], n, used, freed, now)
sem_touch(main, holders, now, ARGV[3], n, ARGV[2])
return code
