local now, limit, look = num(ARGV[1]), num(ARGV[2]), num(ARGV[5])
local out = {}
for i = 1, #KEYS do
  if #out >= limit then break end
  local z = KEYS[i]
  local ks = redis.call('ZRANGEBYSCORE', z, '-inf', ARGV[1], 'LIMIT', '0', tostring(limit - #out))
  for _, k in ipairs(ks) do
    local owner = redis.call('HGET', k, 'ob_owner')
    local st = redis.call('HGET', k, 'state')
    if not owner then
      redis.call('ZREM', z, k)
    elseif st and SETTLED[st] then
      redis.call('ZREM', z, k)
      redis.call('HDEL', k, 'ob_owner', 'ob_token', 'ob_binding', 'ob_path', 'ob_cause')
    else
      local ttl = -2
      if owner ~= '' then ttl = redis.call('PTTL', shard(z) .. ':replica:' .. owner) end
      if ttl == -1 then ttl = look end
      if ttl > 0 then
        redis.call('ZADD', z, fmt(now + ttl), k)
      else
        redis.call('HSET', k, 'ob_owner', ARGV[3], 'ob_token', ARGV[4])
        redis.call('ZADD', z, fmt(now + look), k)
        local v = redis.call('HMGET', k, 'route', 'tenant', 'task_id', 'ob_binding', 'ob_path', 'ob_cause')
        for j = 1, 6 do if not v[j] then v[j] = '' end end
        out[#out + 1] = v
      end
    end
  end
end
return out
