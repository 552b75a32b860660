local k, z = KEYS[1], KEYS[2]
-- ARGV[9], ARGV[10]: who asks, as in update.lua: only one that may move the
-- task's state starts a lease on it (a lease another caller let lapse
-- would cancel the owner's task).
if not (name_task(k, ARGV[1], ARGV[6], ARGV[7], ARGV[8]) and asker_moves(k, ARGV[9], ARGV[10])) then
  expire(k)
  return 0
end
redis.call('ZREM', KEYS[3], k)
redis.call('ZREM', KEYS[4], k)
redis.call('HSET', k, 'lease_ttl', ARGV[3], 'lease_deadline', ARGV[2])
if ARGV[4] == '1' then
  redis.call('HSET', k, 'lease_holder', ARGV[5])
else
  redis.call('HDEL', k, 'lease_holder')
end
redis.call('ZADD', z, ARGV[2], k)
expire(k)
return 1
