-- redlock_fence: write a chosen fencing token back to one master (the Redlock
-- write-back: a token is handed out only once a majority of masters accepted
-- it here; see aiolock/_redlock.py for the rule and its proof sketch).
--
-- KEYS[1]  fence hash   <prefix>:{<name>}:rl:fence   field t -> highest token written back here
-- KEYS[2]  generation   <prefix>:redlock:gen         "<random id>:<created, server clock us>", no TTL
-- KEYS[3]  roster       <prefix>:redlock:roster      set: the founding generation ids
-- ARGV[1]  token        the chosen token (decimal)
-- ARGV[2]  retention_ms TTL of the fence hash (the counter of an unused name expires)
-- ARGV[3]  trust_us     how old a generation must be for its missing counters to be
--                       trusted (the counters' retention, in microseconds)
-- ARGV[4]  new_gen      a random id: this master's generation id if it has none
-- ARGV[5..] roster      the founding generation ids the caller knows (added to the
--                       roster here, whatever the outcome)
--
-- Accepts the token (sets t = token, resets the hash's TTL) when t is present and
-- lower than the token, or when t is absent and this master's generation is
-- trusted: listed in ARGV[5..], or at least trust_us old. A missing counter of
-- an untrusted generation (the master came back empty less than trust_us ago,
-- after the roster was founded) may be one that was lost: nothing is written.
--
-- Returns {code, counter}: code 1 accepted; 0 refused, t >= token already
-- (counter: t); -1 refused, t absent and the generation untrusted (counter "").
--@include _types.lua
check_types(KEYS, 'hash', 'string', 'set')
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
local gen = redis.call('GET', KEYS[2])
if not gen then
    gen = ARGV[4] .. ':' .. string.format('%d', clock)
    redis.call('SET', KEYS[2], gen)
end
if #ARGV > 4 then
    redis.call('SADD', KEYS[3], unpack(ARGV, 5))
end
local token = tonumber(ARGV[1])
local last = redis.call('HGET', KEYS[1], 't')
if last then
    if tonumber(last) >= token then
        return {0, last}
    end
else
    local sep = string.find(gen, ':', 1, true)
    local id, created = string.sub(gen, 1, sep - 1), tonumber(string.sub(gen, sep + 1))
    local trusted = clock - created >= tonumber(ARGV[3])
    if not trusted then
        for i = 5, #ARGV do
            if ARGV[i] == id then
                trusted = true
                break
            end
        end
    end
    if not trusted then
        return {-1, ''}
    end
end
redis.call('HSET', KEYS[1], 't', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, ARGV[1]}
