local now, n = num(ARGV[1]), 0
for i = 2, #KEYS do
  if renew(KEYS[i], KEYS[1], now) >= 0 then n = n + 1 end
end
return n
