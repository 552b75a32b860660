return record(KEYS[1])
