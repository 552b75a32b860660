local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', '1000')
local out, limit = {r[1]}, num(ARGV[3])
for _, k in ipairs(r[2]) do
  if #out - 1 >= limit then break end
  if redis.call('TYPE', k).ok == 'hash' then
    local rec = record(k)
    if #rec > 0 then out[#out + 1] = rec end
  end
end
return out
