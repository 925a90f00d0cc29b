-- sem_set_permits: change N while permits may be held.
--
-- KEYS[1]  main hash     <prefix>:{<name>}         (layout: see _sem.lua)
-- KEYS[2]  holder zset   <prefix>:{<name>}:h
-- KEYS[3]  signal list   <prefix>:{<name>}:signal
-- ARGV[1]  n             the new N (>= 1)
-- ARGV[2]  default_n     N to initialise the semaphore with if it has none
-- ARGV[3]  retention_ms  TTL of the main hash
-- ARGV[4]  channel       pub/sub channel of the semaphore
--
-- Holders keep their permits; new grants wait until the permits in use plus
-- theirs fit in the new N. Raising N wakes waiters; a pending claim that asks
-- for more than the new N is dropped (its waiter gets InvalidArgumentError
-- at its next try) and everyone is woken.
-- Returns the previous N.
--@include _sem.lua
--@include _types.lua
check_types(KEYS, 'hash', 'zset', 'list')
local main, holders = KEYS[1], KEYS[2]
local now = clock_ms()
local old, used, freed = sem_state(main, holders, ARGV[2], now)
local n = tonumber(ARGV[1])
redis.call('HSET', main, 'n', n)
local claimant, ck = sem_claim(main, now)
if claimant and ck > n then
    redis.call('HDEL', main, 'c', 'ck', 'ce', 'cs')
    sem_notify(ARGV[4], KEYS[3], '*', 16)
else
    if n > old then
        freed = freed + (n - old)
    end
    sem_wake(main, ARGV[4], KEYS[3], n, used, freed, now)
end
sem_touch(main, holders, now, ARGV[3], n, ARGV[2])
return old
