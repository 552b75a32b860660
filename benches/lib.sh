# Shared by benches/callgrind.sh and benches/syscalls.sh (sourced, from the
# repository's root): the binaries they run, free ports, the Python test
# worker, and a driver of N sequential SendMessage requests.

# A2AGW_BIN: another gateway build to count (default: this tree's release).
gw=${A2AGW_BIN:-$PWD/target/release/a2a-gateway}
bare=$(ls -t "$PWD"/target/release/deps/proxy-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
py=$PWD/target/pyvenv/bin/python
for f in "$gw" "$bare" "$py"; do
    [[ -x $f ]] || { echo "missing $f (see the header of $0)" >&2; exit 1; }
done

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 1 600); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; return 1; }

# start_worker DIR: the Python a2a-sdk test worker on a free port ($wport),
# stopped when the script exits.
start_worker() {
    wport=$(port)
    "$py" tests/workers/python_agent.py --port "$wport" > "$1/worker.out" 2> "$1/worker.err" &
    wpid=$!
    trap 'kill $wpid 2>/dev/null || true' EXIT
    wait_port "$wport"
}

# drive PORT N [METHOD]: N sequential SendMessage requests (JSON-RPC, ~1 KB,
# head and body in one send) on one keep-alive connection; with METHOD
# SendStreamingMessage, the same body as a stream, each read to its end.
drive() {
    "$py" - "$1" "$2" "${3:-SendMessage}" <<'EOF'
import http.client, json, socket, sys
port, n, method = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
    "params": {"message": {"messageId": "cg", "role": "ROLE_USER",
        "parts": [{"text": "quick"}], "metadata": {"pad": "x" * 600}}}}).encode()
# Head and body in one send (http.client sends them in two, and a proxy
# whose upstream answers before the body came may then close the
# connection, as nginx in front of benches/cpu-split.sh's canned responder).
req = (f"POST / HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
       f"a2a-version: 1.0\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
s = socket.create_connection(("127.0.0.1", port), timeout=60)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for i in range(n):
    s.sendall(req)
    r = http.client.HTTPResponse(s); r.begin(); data = r.read()
    assert r.status == 200 and b'"result"' in data, data[:200]
EOF
}

# gateway_toml FILE THREADS: a one-route gateway config in front of the
# worker, with @PORT@ for its listener.
gateway_toml() {
    cat > "$1" <<EOF
[server]
listen = ["127.0.0.1:@PORT@"]
threads = $2
[[routes]]
name = "w"
worker = "http://127.0.0.1:$wport"
EOF
}

# nginx_conf FILE PORT [WORKERS]: nginx as the proxy bench configures it
# (upstream keep-alive, no buffering) in front of the worker, logs and temp
# files in $dir; WORKERS worker processes (default 2), or with WORKERS = 0
# one process that is master and worker at once (for valgrind).
nginx_conf() {
    local user="" procs="worker_processes ${3:-2};"
    [[ $(id -u) == 0 ]] && user="user root;"
    [[ ${3:-2} == 0 ]] && procs="master_process off; worker_processes 1;"
    cat > "$1" <<EOF
$user
$procs
daemon off;
error_log $dir/nginx-error.log warn;
pid $1.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_requests 1000000;
    upstream worker { server 127.0.0.1:$wport; keepalive 64; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$2;
        location / {
            proxy_pass http://worker;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }
    }
}
EOF
}
