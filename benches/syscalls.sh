#!/usr/bin/env bash
# System calls per SendMessage: nginx, bare pingora (with the vendored
# pingora-proxy's upstream pool and with pingora-core's own, as published)
# and the gateway, counted by `strace -f -c` (counts do not depend on what
# else the machine is doing, unlike requests/s).
#
#   benches/syscalls.sh [N]        (default N = 200 requests per run)
#
# Needs strace, nginx (Debian's nginx-light), the Python test worker's venv
# (tests/workers/setup-venv.sh) and release builds of the gateway and of the
# proxy bench (which carries the bare pass-through):
# `cargo bench -p a2a-gateway --bench proxy --no-run`. Each proxy runs twice
# under strace, once with no request and once with N sequential keep-alive
# SendMessage requests (JSON-RPC, ~1 KB, head and body in one send); the
# difference over N is what one request costs. Prints one table: rows =
# system calls made at least 0.05 times per request by some proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
source benches/lib.sh
for c in strace nginx; do
    command -v $c >/dev/null || { echo "$c not installed" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/a2agw-syscalls.XXXXXX)
start_worker "$dir"
# Two proxy threads, as bare pingora runs (its futex calls are wake-ups
# between them).
gateway_toml "$dir/gw.toml" 2

# run NAME N: the proxy under strace, N requests through it; writes
# $dir/NAME.N.strace (strace's summary).
run() {
    local name=$1 n=$2
    local p; p=$(port)
    local cmd
    case $name in
        nginx) nginx_conf "$dir/nginx.$p.conf" "$p"; cmd=(nginx -c "$dir/nginx.$p.conf") ;;
        bare) cmd=("$bare" --bare-pingora --listen "127.0.0.1:$p" --upstream "127.0.0.1:$wport") ;;
        bare-core-pool) cmd=("$bare" --bare-pingora --pingora-core-pool --listen "127.0.0.1:$p" --upstream "127.0.0.1:$wport") ;;
        gateway)
            sed "s/@PORT@/$p/" "$dir/gw.toml" > "$dir/gw.$p.toml"
            cmd=(env A2A_GATEWAY_LOG=warn "$gw" --config "$dir/gw.$p.toml") ;;
    esac
    strace -f -c -o "$dir/$name.$n.strace" "${cmd[@]}" > "$dir/$name.$n.log" 2>&1 &
    local pid=$!
    wait_port "$p" || { echo "$name did not start; $dir/$name.$n.log" >&2; exit 1; }
    drive "$p" 1   # warm: connections, lazy statics
    sleep 0.2
    drive "$p" "$n"
    sleep 0.2
    # The proxy (strace's child) stops; strace writes its summary when the
    # last traced process has ended.
    pkill -TERM -P $pid; wait $pid || true
}

proxies=(nginx bare-core-pool bare gateway)
for proxy in "${proxies[@]}"; do
    for n in 0 "$N"; do
        run "$proxy" "$n"
    done
done

python3 - "$dir" "$N" "${proxies[@]}" <<'EOF'
import re, sys
d, n, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def calls(path):
    out = {}
    for line in open(path):
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) >= 5 and re.fullmatch(r"[\d.]+", f[0]) and f[3].isdigit() and f[-1] != "total":
            out[f[-1]] = int(f[3])
    return out
per = {}
for name in names:
    a, b = calls(f"{d}/{name}.0.strace"), calls(f"{d}/{name}.{n}.strace")
    per[name] = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}
rows = sorted({k for p in per.values() for k, v in p.items() if v >= 0.05})
print(f"system calls per SendMessage (strace -f -c, {n} sequential requests, worker: Python a2a-sdk; files in {d})")
print()
print("| system call | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for k in rows:
    print(f"| `{k}` | " + " | ".join(f"{per[p].get(k, 0):.2f}" for p in names) + " |")
print("| all | " + " | ".join(f"{sum(v for v in per[p].values() if v > 0):.2f}" for p in names) + " |")
EOF
