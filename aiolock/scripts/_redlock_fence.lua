-- Shared snippet (redlock_acquire, redlock_fence): a master's generation and
-- its acceptance of a Redlock fencing token (see aiolock/_redlock.py: the
-- write-back rule and its proof sketch).
--
-- server_clock_us() -> number    the server clock in microseconds
-- generation(gen_key, new_id, clock) -> gen, id, created
--   This master's generation "<id>/<created us>/<run_id>" (created now with
--   new_id, without a TTL, if it has none: the master is new or came back
--   empty; or if its run_id is not the server's: the server restarted, maybe
--   from an older snapshot or AOF, or a replica was promoted, since it was
--   written). The run_id comes from INFO server: a key cannot tell a new
--   server life, as a snapshot restores keys.
-- add_roster(roster_key, from)   adds ARGV[from..] (founding generation ids) to
--   the roster if it is empty (a master back empty learns it again).
-- counter(fence_key, id) -> t or false
--   The fence counter t written in generation id (the hash's field g); a
--   counter of another generation (restored from an older life) is absent.
-- fence_accept(fence_key, id, created, clock, token, retention_ms, trust_us, from)
--   -> 1 accepted: t (of this generation) was present and below token, or
--        absent with a trusted generation (in ARGV[from..], or at least
--        trust_us old); t = token, g = id, the hash's TTL reset to retention_ms;
--      0 refused: t >= token already;
--     -1 refused: t absent and the generation untrusted (came back empty
--        less than trust_us ago, after the roster was founded).
local function server_clock_us()
    local now = redis.call('TIME')
    return tonumber(now[1]) * 1000000 + tonumber(now[2])
end

local function generation(gen_key, new_id, clock)
    local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
    local gen = redis.call('GET', gen_key)
    if gen then
        local id, created, of = string.match(gen, '^([^/]+)/(%d+)/(%x+)$')
        if of == run_id then
            return gen, id, tonumber(created)
        end
    end
    gen = new_id .. '/' .. string.format('%d', clock) .. '/' .. run_id
    redis.call('SET', gen_key, gen)
    return gen, new_id, clock
end

local function counter(fence_key, id)
    local tg = redis.call('HMGET', fence_key, 't', 'g')
    if tg[1] and tg[2] == id then
        return tg[1]
    end
    return false
end

-- Lua 5.1 (Redis, Valkey) has the global unpack, Lua 5.4 table.unpack.
local unpack = table.unpack or unpack

local function add_roster(roster_key, from)
    if #ARGV >= from and redis.call('EXISTS', roster_key) == 0 then
        redis.call('SADD', roster_key, unpack(ARGV, from))
    end
end

local function fence_accept(fence_key, id, created, clock, token, retention_ms, trust_us, from)
    local last = counter(fence_key, id)
    if last then
        if tonumber(last) >= tonumber(token) then
            return 0
        end
    else
        local trusted = clock - created >= tonumber(trust_us)
        if not trusted then
            for i = from, #ARGV do
                if ARGV[i] == id then
                    trusted = true
                    break
                end
            end
        end
        if not trusted then
            return -1
        end
    end
    redis.call('HSET', fence_key, 't', token, 'g', id)
    redis.call('PEXPIRE', fence_key, retention_ms)
    return 1
end
