-- Shared snippet: the server's clock in milliseconds (the time base of every
-- expiry score kept in a zset or hash field).
local function clock_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
