for i = 1, #KEYS do
  local b = (i - 1) * 10
  local k, meter = KEYS[i], ARGV[b + 1]
  local tomb = shard(k) .. ':ticket:' .. ARGV[b + 9]
  local held = redis.call('HDEL', k, 't:' .. ARGV[b + 9]) == 1
  if held or redis.call('EXISTS', tomb) == 0 then
    local charged = num(ARGV[b + 10])
    if held or charged > 0 then
      local r = num(redis.call('HGET', k, 'reserved:' .. meter))
      if held then r = math.max(r - num(ARGV[b + 2]), 0) end
      local s = math.min(num(redis.call('HGET', k, 'spent:' .. meter)) + charged, MAX)
      redis.call('HSET', k, 'reserved:' .. meter, fmt(r), 'spent:' .. meter, fmt(s),
        'limit:' .. meter, ARGV[b + 3],
        'route', ARGV[b + 5], 'scope', ARGV[b + 6], 'holder', ARGV[b + 7], 'window', ARGV[b + 8])
      redis.call('PEXPIREAT', k, ARGV[b + 4])
    end
    redis.call('SET', tomb, '1', 'PX', {TOMBSTONE_MS})
  end
end
return 1
