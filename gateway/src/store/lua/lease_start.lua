local k, z = KEYS[1], KEYS[2]
redis.call('ZREM', KEYS[3], k)
redis.call('ZREM', KEYS[4], k)
redis.call('HSET', k, 'route', ARGV[6], 'tenant', ARGV[7], 'task_id', ARGV[8], 'updated_ms', ARGV[1],
  'lease_ttl', ARGV[3], 'lease_deadline', ARGV[2])
if ARGV[4] == '1' then
  redis.call('HSET', k, 'lease_holder', ARGV[5])
else
  redis.call('HDEL', k, 'lease_holder')
end
redis.call('ZADD', z, ARGV[2], k)
expire(k)
return 1
