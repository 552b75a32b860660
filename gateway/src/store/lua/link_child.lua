-- KEYS[1] the reference's children list; ARGV: the child (JSON), the most
-- children kept, the TTL (ms). Returns 1 when linked, 0 when the
-- reference holds the most already.
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
