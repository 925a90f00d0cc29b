-- sem_state: N and the permits in use (purging expired holders first).
--
-- KEYS[1]  main hash     <prefix>:{<name>}         (layout: see _sem.lua)
-- KEYS[2]  holder zset   <prefix>:{<name>}:h
-- KEYS[3]  signal list   <prefix>:{<name>}:signal
-- ARGV[1]  default_n     N to initialise the semaphore with if it has none
-- ARGV[2]  retention_ms  TTL of the main hash
-- ARGV[3]  channel       pub/sub channel (wake-ups if the purge freed permits)
--
-- Returns {n, used}.
--@include _sem.lua
--@include _types.lua
check_types(KEYS, 'hash', 'zset', 'list')
local main, holders = KEYS[1], KEYS[2]
local now = clock_ms()
local n, used, freed = sem_state(main, holders, ARGV[1], now)
sem_wake(main, ARGV[3], KEYS[3], n, used, freed, now)
sem_touch(main, holders, now, ARGV[2], n, ARGV[1])
return {n, used}
