local k, z = KEYS[1], KEYS[2]
redis.call('HDEL', k, 'lease_ttl', 'lease_deadline', 'lease_holder')
redis.call('ZREM', z, k)
redis.call('ZREM', KEYS[3], k)
redis.call('ZREM', KEYS[4], k)
if redis.call('EXISTS', k) == 1 then expire(k) end
return 1
