-- KEYS[1] a parent's budget: a hash of `g:<meter>` (its grant), `s:<meter>`
-- (spent, its own and its children's), `parent` (JSON) and `stopped`.
-- ARGV[1] the TTL (ms) given to a budget a charge finds not yet opened;
-- then meter, amount pairs. Adds the amounts and returns the hash, with
-- `stop` 1 for the first charge that found a meter spent past its grant.
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], 's:' .. ARGV[i], ARGV[i + 1])
end
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
local h = redis.call('HGETALL', KEYS[1])
local stop = 0
if redis.call('HEXISTS', KEYS[1], 'stopped') == 0 then
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'g:' then
      local s = redis.call('HGET', KEYS[1], 's:' .. string.sub(h[i], 3))
      if s and tonumber(s) > tonumber(h[i + 1]) then stop = 1 end
    end
  end
  if stop == 1 then redis.call('HSET', KEYS[1], 'stopped', '1') end
end
table.insert(h, 'stop')
table.insert(h, tostring(stop))
return h
