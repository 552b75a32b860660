if redis.call('HGET', KEYS[1], 'ob_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'ob_owner', '', 'ob_token', '')
redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
redis.call('PEXPIRE', KEYS[2], {RETRIES_TTL_MS})
return 1
