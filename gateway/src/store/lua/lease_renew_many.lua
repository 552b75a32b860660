-- KEYS[1] the deadline index, then the tasks; ARGV[1] now. Returns how
-- many were renewed, then the indexes (0-based) of the tasks with no hash
-- at all (lost by the store: renew's -3).
local now, n, lost = num(ARGV[1]), 0, {}
for i = 2, #KEYS do
  local r = renew(KEYS[i], KEYS[1], now)
  if r >= 0 then n = n + 1 elseif r == -3 then lost[#lost + 1] = i - 2 end
end
table.insert(lost, 1, n)
return lost
