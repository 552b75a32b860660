-- KEYS[1] the reference's children list, KEYS[2] the child's parent key;
-- ARGV: the child (JSON), the most children kept, the TTL (ms), the
-- parent's reference and the child's depth. Returns 1 when linked, 0 when
-- the reference holds the most already.
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
return 1
