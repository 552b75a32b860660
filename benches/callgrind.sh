#!/usr/bin/env bash
# Instructions per SendMessage: the gateway against a bare pingora
# pass-through, counted by valgrind's callgrind (instruction counts do not
# depend on what else the machine is doing, unlike requests/s).
#
#   benches/callgrind.sh [N]        (default N = 400 requests per run)
#
# The `gateway-no-idle` row is the same gateway with
# `timeouts.upstream_idle = "0s"`: what the worker read bound costs. The
# `gateway-read-64k` row is the gateway with pingora's 64 KiB read-ahead on
# callers' connections (`server.read_buffer`; left out for a build that
# does not know the key), `bare-read-0` bare pingora with the gateway's
# default, none: what the read-ahead costs.
# `A2AGW_BIN=/path/to/a2a-gateway benches/callgrind.sh` counts another build
# of the gateway (an earlier commit's) against the same bare pingora and
# worker.
#
# Needs valgrind, the Python test worker's venv (tests/workers/setup-venv.sh)
# and release builds of the gateway and of the proxy bench (which carries
# the bare pass-through): `cargo bench -p a2a-gateway --bench proxy --no-run`.
# Each proxy runs twice under callgrind, once with no request and once with
# N sequential keep-alive SendMessage requests (JSON-RPC, ~1 KB, task
# tracking on); (Ir(N) - Ir(0)) / N is the cost of one request. Another
# proxy, bare pingora with pingora-core's own upstream pool
# (`--pingora-core-pool`), shows what the vendored pingora-proxy's pool
# takes off (vendor/pingora-proxy/PATCHED.md). nginx (Debian's nginx-light,
# configured as the proxy bench configures it, as one process: valgrind
# follows one) gives the count the pingora builds are compared with. Prints
# a table; leaves the
# callgrind files in a scratch directory for
# `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
source benches/lib.sh
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }
dir=$(mktemp -d /tmp/a2agw-callgrind.XXXXXX)
start_worker "$dir"

# run NAME N CMD...: the proxy under callgrind, N requests through it.
run() {
    local name=$1 n=$2; shift 2
    local p; p=$(port)
    local out="$dir/$name.$n.cg"
    local toml="$dir/gw.toml"
    [[ -f $dir/$name.toml ]] && toml="$dir/$name.toml"
    sed "s/@PORT@/$p/" "$toml" > "$dir/gw.$p.toml"
    [[ $name == nginx ]] && nginx_conf "$dir/nginx.$p.conf" "$p" 0
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

gateway_toml "$dir/gw.toml" 1
# The same gateway without the worker read bound (`timeouts.upstream_idle`,
# which bare pingora does not set): what that bound costs per request.
{ cat "$dir/gw.toml"; printf '[timeouts]\nupstream_idle = "0s"\n'; } > "$dir/gateway-no-idle.toml"
# The gateway with pingora's own 64 KiB read-ahead on callers' connections
# (`server.read_buffer`; the gateway's default is none), and bare pingora
# with the gateway's: what the read-ahead costs per request.
sed 's/^threads = .*/&\nread_buffer = "64KiB"/' "$dir/gw.toml" > "$dir/gateway-read-64k.toml"

results=()
proxies=(bare gateway gateway-no-idle)
# An earlier build (A2AGW_BIN) may not know `server.read_buffer`.
if sed "s/@PORT@/1/" "$dir/gateway-read-64k.toml" > "$dir/check.toml" &&
    "$gw" check-config "$dir/check.toml" > /dev/null 2>&1; then
    proxies+=(gateway-read-64k)
else
    echo "this gateway build refuses server.read_buffer: the gateway-read-64k row is left out" >&2
fi
proxies+=(bare-read-0 bare-core-pool)
command -v nginx >/dev/null && proxies+=(nginx) || echo "nginx not installed: its row is left out" >&2
for proxy in "${proxies[@]}"; do
    for n in 0 "$N"; do
        if [[ $proxy == bare ]]; then
            ir=$(run bare "$n" "$bare" --bare-pingora --listen 127.0.0.1:@PORT@ --upstream "127.0.0.1:$wport")
        elif [[ $proxy == nginx ]]; then
            ir=$(run nginx "$n" nginx -c "$dir/nginx.@PORT@.conf")
        elif [[ $proxy == bare-read-0 ]]; then
            ir=$(run bare-read-0 "$n" "$bare" --bare-pingora --l4-read-buffer 0 --listen 127.0.0.1:@PORT@ --upstream "127.0.0.1:$wport")
        elif [[ $proxy == bare-core-pool ]]; then
            ir=$(run bare-core-pool "$n" "$bare" --bare-pingora --pingora-core-pool --listen 127.0.0.1:@PORT@ --upstream "127.0.0.1:$wport")
        else
            ir=$(A2A_GATEWAY_LOG=warn run "$proxy" "$n" "$gw" --config @CONFIG@)
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
for proxy in "${proxies[@]}"; do
    z=${ir[$proxy.0]}; n=${ir[$proxy.$N]}
    echo "| $proxy | $z | $n | $(( (n - z) / N )) |"
done
b=$(( (${ir[bare.$N]} - ${ir[bare.0]}) / N )); g=$(( (${ir[gateway.$N]} - ${ir[gateway.0]}) / N ))
echo
c=$(( (${ir[bare-core-pool.$N]} - ${ir[bare-core-pool.0]}) / N ))
echo "gateway / bare: $(python3 -c "print(f'{$g/$b:.2f}')")x instructions per request (+$((g - b)) per request)"
ni=$(( (${ir[gateway-no-idle.$N]} - ${ir[gateway-no-idle.0]}) / N ))
echo "gateway's worker read bound (upstream_idle 1h against 0s): $((g - ni)) per request"
b0=$(( (${ir[bare-read-0.$N]} - ${ir[bare-read-0.0]}) / N ))
if [[ -n ${ir[gateway-read-64k.$N]:-} ]]; then
    g64=$(( (${ir[gateway-read-64k.$N]} - ${ir[gateway-read-64k.0]}) / N ))
    echo "callers' read-ahead, none against pingora's 64 KiB: gateway $((g - g64)), bare $((b0 - b)) per request"
fi
echo "gateway / bare with the gateway's read-ahead (none): $(python3 -c "print(f'{$g/$b0:.2f}')")x"
echo "bare with pingora-core's own upstream pool / bare: $(python3 -c "print(f'{$c/$b:.2f}')")x ($((c - b)) per request)"
if [[ -n ${ir[nginx.$N]:-} ]]; then
    x=$(( (${ir[nginx.$N]} - ${ir[nginx.0]}) / N ))
    echo "bare / nginx: $(python3 -c "print(f'{$b/$x:.2f}')")x; gateway / nginx: $(python3 -c "print(f'{$g/$x:.2f}')")x"
fi
