-- Shared snippet (included by every script that frees something).
--
-- notify(channel, signal_key, message, copies)
--   Wakes waiters of every Client, whatever its notify mode: publishes
--   `message` on `channel` (pubsub mode) and pushes it `copies` times onto
--   the list `signal_key` (list mode: BLPOP), keeping at most the last 16
--   items, for 10 s. message: "1" wake one, "*" wake all, "<n>" wake n.
local function notify(channel, signal_key, message, copies)
    redis.call('PUBLISH', channel, message)
    for _ = 1, copies do
        redis.call('RPUSH', signal_key, message)
    end
    redis.call('LTRIM', signal_key, -16, -1)
    redis.call('PEXPIRE', signal_key, 10000)
end
