return renew(KEYS[1], KEYS[2], num(ARGV[1]))
