#!/usr/bin/env bash
# Instructions per SendMessage: the gateway against a bare pingora
# pass-through, counted by valgrind's callgrind (instruction counts do not
# depend on what else the machine is doing, unlike requests/s).
#
#   benches/callgrind.sh [N]        (default N = 400 requests per run)
#
# Needs valgrind, the Python test worker's venv (tests/workers/setup-venv.sh)
# and release builds of the gateway and of the proxy bench (which carries
# the bare pass-through): `cargo bench -p a2a-gateway --bench proxy --no-run`.
# Each proxy runs twice under callgrind, once with no request and once with
# N sequential keep-alive SendMessage requests (JSON-RPC, ~1 KB, task
# tracking on); (Ir(N) - Ir(0)) / N is the cost of one request. Prints a
# table; leaves the callgrind files in a scratch directory for
# `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
root=$PWD
gw=$root/target/release/a2a-gateway
bare=$(ls -t "$root"/target/release/deps/proxy-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
py=$root/target/pyvenv/bin/python
for f in "$gw" "$bare" "$py"; do
    [[ -x $f ]] || { echo "missing $f (see the header of $0)" >&2; exit 1; }
done
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }
dir=$(mktemp -d /tmp/a2agw-callgrind.XXXXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 600); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }

wport=$(port)
"$py" tests/workers/python_agent.py --port "$wport" > "$dir/worker.out" 2> "$dir/worker.err" &
wpid=$!
trap 'kill $wpid 2>/dev/null || true' EXIT
wait_port "$wport"

# N sequential SendMessage requests on one keep-alive connection.
drive() {
    "$py" - "$1" "$2" <<'EOF'
import http.client, json, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
    "params": {"message": {"messageId": "cg", "role": "ROLE_USER",
        "parts": [{"text": "quick"}], "metadata": {"pad": "x" * 600}}}})
c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
for i in range(n):
    c.request("POST", "/", body, {"content-type": "application/json", "a2a-version": "1.0"})
    r = c.getresponse(); data = r.read()
    assert r.status == 200 and b'"result"' in data, data[:200]
EOF
}

# run NAME N CMD...: the proxy under callgrind, N requests through it.
run() {
    local name=$1 n=$2; shift 2
    local p; p=$(port)
    local out="$dir/$name.$n.cg"
    sed "s/@PORT@/$p/" "$dir/gw.toml" > "$dir/gw.$p.toml"
    local args=("${@//@PORT@/$p}")
    args=("${args[@]//@CONFIG@/$dir/gw.$p.toml}")
    valgrind --tool=callgrind --callgrind-out-file="$out" "${args[@]}" \
        > "$dir/$name.$n.log" 2>&1 &
    local pid=$!
    wait_port "$p" || { echo "$name did not start; $dir/$name.$n.log" >&2; exit 1; }
    drive "$p" 1   # warm: connections, lazy statics
    drive "$p" "$n"
    kill -TERM $pid; wait $pid || true
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'
}

cat > "$dir/gw.toml" <<EOF
[server]
listen = ["127.0.0.1:@PORT@"]
threads = 1
[[routes]]
name = "w"
worker = "http://127.0.0.1:$wport"
EOF

results=()
for proxy in bare gateway; do
    for n in 0 "$N"; do
        if [[ $proxy == bare ]]; then
            ir=$(run bare "$n" "$bare" --bare-pingora --listen 127.0.0.1:@PORT@ --upstream "127.0.0.1:$wport")
        else
            ir=$(A2A_GATEWAY_LOG=warn run gateway "$n" "$gw" --config @CONFIG@)
        fi
        results+=("$proxy $n $ir")
    done
done

echo "instructions per SendMessage (callgrind, $N sequential requests, worker: Python a2a-sdk; files in $dir)"
echo
echo "| proxy | Ir with 0 requests | Ir with $N | Ir per request |"
echo "|---|---|---|---|"
declare -A ir
for r in "${results[@]}"; do set -- $r; ir[$1.$2]=$3; done
for proxy in bare gateway; do
    z=${ir[$proxy.0]}; n=${ir[$proxy.$N]}
    echo "| $proxy | $z | $n | $(( (n - z) / N )) |"
done
b=$(( (${ir[bare.$N]} - ${ir[bare.0]}) / N )); g=$(( (${ir[gateway.$N]} - ${ir[gateway.0]}) / N ))
echo
echo "gateway / bare: $(python3 -c "print(f'{$g/$b:.2f}')")x instructions per request (+$((g - b)) per request)"
