local k, z = KEYS[1], KEYS[2]
local same = name_task(k, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if ARGV[5] == '1' then redis.call('HSET', k, 'context_id', ARGV[6]) end
local s = ARGV[7]
if s ~= '' then
  local old = redis.call('HGET', k, 'state')
  if not (old and TERMINAL[old]) then redis.call('HSET', k, 'state', s) end
  if SETTLED[s] then
    redis.call('HDEL', k, 'lease_ttl', 'lease_deadline', 'lease_holder')
    redis.call('ZREM', z, k)
    redis.call('HDEL', k, 'ob_owner', 'ob_token', 'ob_binding', 'ob_path', 'ob_cause')
    redis.call('ZREM', KEYS[3], k)
  end
end
-- A request naming the task in another tenant claims nothing more.
-- ARGV[18] '1': the caller does not read the record back.
if not same then
  expire(k)
  if ARGV[18] == '1' then return 1 end
  return record(k)
end
if ARGV[8] == '1' then redis.call('HSET', k, 'binding', ARGV[9], 'target_path', ARGV[10]) end
-- ARGV[13]: the owner a send records if there is none ('' none);
-- ARGV[14]: who asks, 'u' (no auth), 'a' (anonymous) or 'i' (ARGV[15]).
-- Only an asker that may move the task's state counts (policies::owner).
if ARGV[16] ~= '' then redis.call('HSETNX', k, 'replica', ARGV[16]) end
if ARGV[17] ~= '' then redis.call('HSETNX', k, 'message_id', ARGV[17]) end
if ARGV[13] ~= '' and redis.call('HEXISTS', k, 'owner') == 0 then
  redis.call('HSET', k, 'owner', ARGV[13])
end
if asker_moves(k, ARGV[14], ARGV[15]) then
  local wf = 'w:' .. ARGV[12]
  local w = math.max(num(redis.call('HGET', k, wf)), 0) + num(ARGV[11])
  if w <= 0 then
    redis.call('HDEL', k, wf)
  else
    redis.call('HSET', k, wf, fmt(math.min(w, 4294967295)))
  end
end
expire(k)
if ARGV[18] == '1' then return 1 end
return record(k)
