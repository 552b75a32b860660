local k, now = KEYS[1], num(ARGV[1])
local owner = redis.call('HGET', k, 'ob_owner')
if owner and owner ~= '' and redis.call('EXISTS', shard(k) .. ':replica:' .. owner) == 1 then return 0 end
local st = redis.call('HGET', k, 'state')
if st and SETTLED[st] then return 2 end
if redis.call('HEXISTS', k, 'lease_ttl') == 1 then
  for i = 3, 4 do
    local s = redis.call('ZSCORE', KEYS[i], k)
    if s and num(s) > now then return 0 end
  end
end
name_task(k, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
redis.call('HSET', k, 'ob_owner', ARGV[5], 'ob_token', ARGV[6], 'ob_binding', ARGV[7], 'ob_path', ARGV[8],
  'ob_cause', ARGV[9])
redis.call('HDEL', k, 'lease_ttl', 'lease_deadline', 'lease_holder')
for i = 2, 4 do redis.call('ZREM', KEYS[i], k) end
redis.call('ZADD', KEYS[5], fmt(now + num(ARGV[10])), k)
redis.call('PEXPIRE', KEYS[5], {RETRIES_TTL_MS})
expire(k)
return 1
