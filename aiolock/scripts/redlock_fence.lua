-- redlock_fence: write a chosen fencing token back to one master (the Redlock
-- write-back: a token is handed out only once a majority of masters accepted
-- it; see aiolock/_redlock.py for the rule and its proof sketch).
--
-- KEYS[1]  fence hash   <prefix>:{<name>}:rl:fence   t -> highest token accepted here, g -> its generation id
-- KEYS[2]  generation   <prefix>:redlock:gen         "<random id>/<created, server clock us>/<run_id>", no TTL
-- KEYS[3]  roster       <prefix>:redlock:roster      set: the founding generation ids
-- ARGV[1]  token        the chosen token (decimal)
-- ARGV[2]  retention_ms TTL of the fence hash (the counter of an unused name expires)
-- ARGV[3]  trust_us     how old a generation must be for its missing counters to be trusted
-- ARGV[4]  new_gen      a random id: this master's generation id if it has none
-- ARGV[5]  seed_gen     "" (a write-back), or a generation id (a seed, below)
-- ARGV[6]  seed_age_us  a seed is written only if the generation is at least this old
--                       (ATTEMPT_LIMIT: the caller checks more, see _redlock.py's
--                       _seed); "0" for a write-back
-- ARGV[7..] roster      the founding generation ids the caller knows (added to
--                       the roster if it has none)
--
-- A write-back offers the token to fence_accept (_redlock_fence.lua): accepted
-- when t is present and below it, or absent with a trusted generation.
-- A seed writes a token a majority already accepted to a master that refused
-- it as untrusted: t = max(t, token), but only if the master's generation is
-- still seed_gen (it did not come back empty, or restart, since the attempt
-- read it) and at least seed_age_us old.
--
-- Returns {code, counter}: 1 accepted (counter: the token); 0 refused, t >=
-- token already (counter: t); -1 refused, t absent and the generation
-- untrusted, or (a seed) the generation changed or is too young (counter "").
--@include _redlock_fence.lua
--@include _types.lua
check_types(KEYS, 'hash', 'string', 'set')
local clock = server_clock_us()
local gen, id, created = generation(KEYS[2], ARGV[4], clock)
add_roster(KEYS[3], 7)
local code
if ARGV[5] ~= '' then
    if id ~= ARGV[5] or clock - created < tonumber(ARGV[6]) then
        return {-1, ''}
    end
    -- The seed: trusted, as the token was accepted by a majority.
    code = fence_accept(KEYS[1], id, 0, clock, ARGV[1], ARGV[2], 0, #ARGV + 1)
else
    code = fence_accept(KEYS[1], id, created, clock, ARGV[1], ARGV[2], ARGV[3], 7)
end
if code == 0 then
    return {0, counter(KEYS[1], id)}
end
if code == -1 then
    return {-1, ''}
end
return {1, ARGV[1]}
