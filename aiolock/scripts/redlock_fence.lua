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
-- ARGV[5]  seed_gen     "" (a write-back), or a generation id (a seed, below)
-- ARGV[6..] roster      the founding generation ids the caller knows (added to the
--                       roster here, whatever the outcome)
--
-- A write-back accepts the token (sets t = token, resets the hash's TTL) when t
-- is present and lower than the token, or when t is absent and this master's
-- generation is trusted: listed in ARGV[6..], or at least trust_us old. A
-- missing counter of an untrusted generation (the master came back empty less
-- than trust_us ago, after the roster was founded) may be one that was lost:
-- nothing is written.
-- A seed writes a token a majority already accepted to a master that refused it
-- as untrusted: t = max(t, token), but only if the master's generation is still
-- seed_gen (it did not come back empty again since the attempt read it).
--
-- Returns {code, counter}: code 1 accepted; 0 refused, t >= token already
-- (counter: t); -1 refused, t absent and the generation untrusted, or (a seed)
-- the generation changed (counter "").
--@include _types.lua
check_types(KEYS, 'hash', 'string', 'set')
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000000 + tonumber(now[2])
local gen = redis.call('GET', KEYS[2])
if not gen then
    gen = ARGV[4] .. ':' .. string.format('%d', clock)
    redis.call('SET', KEYS[2], gen)
end
if #ARGV > 5 then
    redis.call('SADD', KEYS[3], unpack(ARGV, 6))
end
local token = tonumber(ARGV[1])
local last = redis.call('HGET', KEYS[1], 't')
local sep = string.find(gen, ':', 1, true)
local id, created = string.sub(gen, 1, sep - 1), tonumber(string.sub(gen, sep + 1))
if ARGV[5] ~= '' then
    if id ~= ARGV[5] then
        return {-1, ''}
    end
    if last and tonumber(last) >= token then
        return {0, last}
    end
elseif last then
    if tonumber(last) >= token then
        return {0, last}
    end
else
    local trusted = clock - created >= tonumber(ARGV[3])
    if not trusted then
        for i = 6, #ARGV do
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
