local n = num(ARGV[1])
local idx, now, max = KEYS[n + 1], num(ARGV[2 + n * 9]), num(ARGV[3 + n * 9])
local pending = {}
local fresh = {}
local opened, opens = {}, 0
for i = 1, n do
  local b = 1 + (i - 1) * 9
  local k, meter, amount, limit = KEYS[i], ARGV[b + 1], num(ARGV[b + 2]), num(ARGV[b + 3])
  fresh[i] = redis.call('HEXISTS', k, 't:' .. ARGV[b + 9]) == 0
    and redis.call('EXISTS', shard(k) .. ':ticket:' .. ARGV[b + 9]) == 0
  if fresh[i] then
    local id = k .. '\n' .. meter
    local held = num(redis.call('HGET', k, 'spent:' .. meter))
      + num(redis.call('HGET', k, 'reserved:' .. meter)) + (pending[id] or 0)
    local left = math.max(limit - held, 0)
    if amount > left then return {i - 1, fmt(left)} end
    pending[id] = (pending[id] or 0) + amount
    if not opened[k] and redis.call('EXISTS', k) == 0 then
      opened[k] = true
      opens = opens + 1
    end
  end
end
-- A caller may choose the names accounts are kept by: past the bound, no
-- new one opens (expired ones are dropped from the index first).
if opens > 0 then
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', fmt(now))
  if redis.call('ZCARD', idx) + opens > max then return {-2, '0'} end
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
    redis.call('ZADD', idx, 'GT', ARGV[b + 4], k)
  end
end
return {-1, '0'}
