local k = KEYS[1]
redis.call('HDEL', k, 'ob_owner', 'ob_token', 'ob_binding', 'ob_path', 'ob_cause',
  'lease_ttl', 'lease_deadline', 'lease_holder')
for i = 2, 5 do redis.call('ZREM', KEYS[i], k) end
if redis.call('EXISTS', k) == 1 then expire(k) end
return 1
