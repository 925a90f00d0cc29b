-- sem_force_release: evict every holder of a semaphore, whoever they are.
--
-- KEYS[1]  main hash     <prefix>:{<name>}         (layout: see _sem.lua)
-- KEYS[2]  holder zset   <prefix>:{<name>}:h
-- KEYS[3]  signal list   <prefix>:{<name>}:signal
-- KEYS[4]  fence hash    <prefix>:{<name>}:fence (read only: the evicted tokens' bound)
-- ARGV[1]  channel       pub/sub channel of the semaphore <prefix>:{<name>}:ch
-- ARGV[2]  lost_prefix   template of a Client's eviction channel (+ client id: _evict.lua)
--
-- Every permit held returns: the holder zset is deleted and the permits in
-- use become 0. Waiters are woken as a release of those permits would wake
-- them (see sem_wake; a pending claim is kept). Nothing else changes: N is
-- not set (nor initialised if the semaphore has none yet), no key's TTL
-- moves, the fence hash keeps its counter, and the evicted members are NOT
-- recorded as released (their release answers 0, "gone"). The evicted
-- holders' Clients are told on their eviction channels ("x <bound> * <holder
-- zset key>", see _evict.lua); one not listening finds out at its watchdog's
-- next check (sem_renew answers 0).
-- Returns the members "<permits>|<holder id>" evicted (live holders only;
-- expired ones are purged, not counted): empty if nobody held a permit.
--@runner allow-oom  (it frees or keeps a hold: as a Redis Function it runs out of memory too)
--@include _sem.lua
--@include _types.lua
--@include _evict.lua
check_types(KEYS, 'hash', 'zset', 'list', 'hash')
local main, holders, signal = KEYS[1], KEYS[2], KEYS[3]
local now = clock_ms()
local evicted = {}
local freed = 0
local flat = redis.call('ZRANGE', holders, 0, -1, 'WITHSCORES')
local cids = {}
for i = 1, #flat, 2 do
    freed = freed + sem_permits_of(flat[i])  -- expired ones come free too (a purge)
    if tonumber(flat[i + 1]) > now then
        evicted[#evicted + 1] = flat[i]
        cids[#cids + 1] = evict_cid(string.match(flat[i], '^%d+|(.*)$') or '')
    end
end
evict_tell(ARGV[2], cids, evict_bound(KEYS[4]), '*', holders)
redis.call('DEL', holders)
local n = tonumber(redis.call('HGET', main, 'n'))
if n then
    redis.call('HSET', main, 'u', 0)
else
    -- No N recorded (no main hash): nobody claims either; wake as many
    -- waiters as permits came free, and the next acquisition sets N.
    n = freed
end
sem_wake(main, ARGV[1], signal, n, 0, freed, now)
return evicted
