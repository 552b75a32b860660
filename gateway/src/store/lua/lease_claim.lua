local z, limit, hold = KEYS[1], num(ARGV[2]), ARGV[3]
local function held_in(k)
  local tp, rp = shard(k) .. ':task:', shard(k) .. ':leases:retry:'
  local rest = string.sub(k, #tp + 1)
  local e = string.find(rest, ':', 1, true)
  if string.sub(k, 1, #tp) ~= tp or not e then return KEYS[2] end
  return rp .. string.sub(rest, 1, e - 1)
end
local function hold_it(k)
  local r = held_in(k)
  redis.call('ZADD', r, hold, k)
  redis.call('PEXPIRE', r, {RETRIES_TTL_MS})
end
local ks = redis.call('ZRANGEBYSCORE', z, '-inf', '(' .. ARGV[1], 'LIMIT', '0', ARGV[2])
local out = {}
for _, k in ipairs(ks) do
  redis.call('ZREM', z, k)
  local rec = record(k)
  if #rec > 0 and redis.call('HEXISTS', k, 'ob_owner') == 0 then
    out[#out + 1] = rec
    hold_it(k)
  end
end
for i = 2, #KEYS do
  if #out >= limit then break end
  local r = KEYS[i]
  local rs = redis.call('ZRANGEBYSCORE', r, '-inf', ARGV[1], 'LIMIT', '0', tostring(limit - #out))
  for _, k in ipairs(rs) do
    redis.call('ZREM', r, k)
    if redis.call('HEXISTS', k, 'lease_ttl') == 1 and redis.call('HEXISTS', k, 'ob_owner') == 0 then
      out[#out + 1] = record(k)
      hold_it(k)
    end
  end
end
return out
