if redis.call('HEXISTS', KEYS[1], 'lease_ttl') == 1 then
  redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
  redis.call('PEXPIRE', KEYS[2], {RETRIES_TTL_MS})
  return 1
end
return 0
