local MAX = 9007199254740991
local NS = {NS}
-- The prefix of the shard key k is in: the namespace, then in a cluster
-- `:{tag}` (RedisStore's shards), so that a script touches only keys of
-- the slot it was sent to.
local function shard(k)
  local e = string.find(k, '}', #NS + 1, true)
  if e then return string.sub(k, 1, e) end
  return NS
end
local TERMINAL = {TERMINAL}
local SETTLED = {SETTLED}
local function num(s)
  local n = tonumber(s)
  if n == nil then return 0 end
  return n
end
-- Integers as exact decimal strings (redis.call would print 1e+15).
local function fmt(n) return string.format('%.0f', n) end
-- A task's hash as a flat list, its `w:{replica}` fields summed into
-- `watchers` over the replicas still alive; {} when there is no hash.
local function record(k)
  local rec = redis.call('HGETALL', k)
  if #rec == 0 then return rec end
  local out, w, rp = {}, 0, shard(k) .. ':replica:'
  for i = 1, #rec, 2 do
    local f = rec[i]
    if string.sub(f, 1, 2) == 'w:' then
      if redis.call('EXISTS', rp .. string.sub(f, 3)) == 1 then
        w = w + math.max(num(rec[i + 1]), 0)
      end
    elseif f == 'watchers' then
      w = w + math.max(num(rec[i + 1]), 0)
    else
      out[#out + 1] = f
      out[#out + 1] = rec[i + 1]
    end
  end
  out[#out + 1] = 'watchers'
  out[#out + 1] = fmt(math.min(w, 4294967295))
  return out
end
-- Short retention once settled without a lease; long otherwise.
local function expire(k)
  local st = redis.call('HGET', k, 'state')
  if st and SETTLED[st] and redis.call('HEXISTS', k, 'lease_deadline') == 0 then
    redis.call('PEXPIRE', k, {SETTLED_MS})
  else
    redis.call('PEXPIRE', k, {LIVE_MS})
  end
end
-- -1: no live lease; -2: lapsed (left for the claimer); else the new deadline.
local function renew(k, z, now)
  if redis.call('EXISTS', k) == 0 then return -3 end
  local score = redis.call('ZSCORE', z, k)
  if not score then return -1 end
  local ttl = tonumber(redis.call('HGET', k, 'lease_ttl'))
  if not ttl then return -1 end
  if now > num(score) then return -2 end
  local d = math.min(now + ttl, MAX)
  redis.call('HSET', k, 'lease_deadline', fmt(d))
  redis.call('ZADD', z, fmt(d), k)
  expire(k)
  return d
end
-- Names the task's hash (route, task id) and keeps the tenant it was first
-- recorded in; returns whether `tenant` is that tenant (policies::owner:
-- a request naming the task in another tenant moves nothing).
local function name_task(k, now, route, tenant, task_id)
  redis.call('HSET', k, 'route', route, 'task_id', task_id, 'updated_ms', now)
  redis.call('HSETNX', k, 'tenant', tenant)
  return redis.call('HGET', k, 'tenant') == tenant
end
-- Whether an asker ('u' no auth, 'a' anonymous, 'i' identity `id`) may move
-- the state of the task in hash k, whose tenant it names already matched.
local function asker_moves(k, kind, id)
  local owner = redis.call('HGET', k, 'owner')
  return (not owner) or kind == 'u' or (kind == 'i' and owner == id)
end
