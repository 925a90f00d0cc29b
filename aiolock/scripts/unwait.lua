-- unwait: a Client stops waiting for a plain lock (its waiter gave up).
--
-- KEYS[1]  lock hash    <prefix>:{<name>}
-- KEYS[2]  waiting set  <prefix>:{<name>}:wq (see _wake.lua)
-- ARGV[1]  wid          the Client's id
--
-- Removes the Client's entry. If the lock is free, a wake-up may have been
-- sent to this Client just before it gave up: pass it on to the next Client.
-- Returns 1 if the lock was free (the wake-up was passed on, if anyone
-- waits), 0 if it is held (its release will wake the next Client).
--@include _wake.lua
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
    wake_next(KEYS[1], KEYS[2])
    return 1
end
return 0
