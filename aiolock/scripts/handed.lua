-- handed: was this hold handed over to another owner (client.adopt)? Asked
-- by the Client of a hold whose handle was taken, when it finds the hold gone.
--
-- KEYS[1]  handed hash  <prefix>:{<name>}:handed   (written by adopt.lua, rw_adopt.lua,
--                                                   sem_adopt.lua)
-- ARGV[1]  holder       the hold's identity in Redis: its holder field (lock,
--                       fair lock), "w|<owner>" (write lock), or its member (semaphore)
-- ARGV[2]  token        fencing token of the hold
--
-- Returns 1 if the hold was handed over (the record is removed: it is read
-- once), 0 if not (it expired, was released or force-released: lost).
--@include _types.lua
check_types(KEYS, 'hash')
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
    redis.call('HDEL', KEYS[1], ARGV[1])
    return 1
end
return 0
