local n = num(ARGV[1])
local pending = {}
local fresh = {}
for i = 1, n do
  local b = 1 + (i - 1) * 9
  local k, meter, amount, limit = KEYS[i], ARGV[b + 1], num(ARGV[b + 2]), num(ARGV[b + 3])
  fresh[i] = redis.call('HEXISTS', k, 't:' .. ARGV[b + 9]) == 0
    and redis.call('EXISTS', {TICKETS} .. ARGV[b + 9]) == 0
  if fresh[i] then
    local id = k .. '\n' .. meter
    local held = num(redis.call('HGET', k, 'spent:' .. meter))
      + num(redis.call('HGET', k, 'reserved:' .. meter)) + (pending[id] or 0)
    local left = math.max(limit - held, 0)
    if amount > left then return {i - 1, fmt(left)} end
    pending[id] = (pending[id] or 0) + amount
  end
end
for i = 1, n do
  if fresh[i] then
    local b = 1 + (i - 1) * 9
    local k, meter = KEYS[i], ARGV[b + 1]
    local r = num(redis.call('HGET', k, 'reserved:' .. meter)) + num(ARGV[b + 2])
    redis.call('HSET', k, 'reserved:' .. meter, fmt(r), 'limit:' .. meter, ARGV[b + 3],
      'route', ARGV[b + 5], 'scope', ARGV[b + 6], 'holder', ARGV[b + 7], 'window', ARGV[b + 8],
      't:' .. ARGV[b + 9], ARGV[b + 2])
    redis.call('PEXPIREAT', k, ARGV[b + 4])
  end
end
return {-1, '0'}
