#!/usr/bin/env bash
# Where the CPU per request goes (issue 35, item 4): instructions per
# SendMessage and per SSE stream, counted by valgrind's callgrind, for nginx,
# bare pingora and the gateway in front of the canned responder of
# `cargo bench -p a2a-gateway --bench proxy -- --canned`, split by where
# each instruction's code comes from: pingora, tokio, HTTP parsing, the
# allocator, libc, Rust's standard library, the gateway's own code, its
# libraries. Instruction counts do not depend on what else the machine is
# doing, unlike requests/s.
#
#   benches/cpu-split.sh [N]        (default N = 400 requests per run)
#
# The split is by the source file of each instruction's line (callgrind's
# per-line costs, from the line tables that `debug = "line-tables-only"`
# keeps in the release build): fat LTO inlines across crates, so a
# function's name says little about whose code ran (the gateway's hooks are
# inlined into pingora's functions and the other way round), while a line
# still names its file. Code of Rust's standard library (core, alloc, std:
# `Vec`, iterators, `Arc`, hash maps) inlined into either side cannot be
# told apart this way and is a bucket of its own; so is libc's.
# Instructions run in the kernel (system calls) are not counted by callgrind
# at all: `proxy -- --canned` gives the system time per request, and with
# strace installed the same runs are made under `strace -f -c` for a table
# of system calls per request.
#
# Columns, each its own process under callgrind, in front of the canned
# responder (nginx, one worker process, started by the proxy bench binary
# with `--canned --responder`):
# - nginx (Debian's nginx-light, configured as the proxy bench configures
#   it, as one process: valgrind follows one);
# - bare pingora (`benches/bare_pingora.rs`, 2 threads, pingora's 64 KiB
#   read-ahead on callers' connections, as `--canned` runs it);
# - the gateway, memory store, task tracking on, `blocking_sends = "pass"`,
#   2 threads, as `--canned` runs it, with the product's default log.
# Each runs twice, once with N sequential keep-alive requests on one
# connection and once with none, left up as long (after one request to
# warm up in both); (Ir(N) - Ir(0)) / N per bucket is the cost of one
# request.
#
# Needs valgrind, nginx (nginx-light), the Python test worker's venv
# (tests/workers/setup-venv.sh; its Python drives the requests) and release
# builds of the gateway and of the proxy bench:
# `cargo bench -p a2a-gateway --bench proxy --no-run`. `A2AGW_BIN=path`
# counts another build of the gateway. Prints two tables; leaves the
# callgrind files in a scratch directory (`callgrind_annotate FILE`).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
source benches/lib.sh
for c in valgrind nginx; do
    command -v $c >/dev/null || { echo "$c not installed" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/a2agw-cpu-split.XXXXXX)
# The gateway logs as a user's does (`info`, an access line per request,
# to a file) unless A2A_GATEWAY_LOG says otherwise (`warn`: no access
# line). A2AGW_GATEWAY_TOML: lines added to its config (say
# `[delegation]` and `link = false`, to count what the references cost).

# The canned responder, from the proxy bench binary.
"$bare" --canned --responder > "$dir/responder.out" 2> "$dir/responder.err" &
rpid=$!
vpid=
trap 'kill $rpid $vpid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    [[ -f $dir/responder.out && $(wc -l < "$dir/responder.out") -ge 2 ]] && break
    sleep 0.1
done
send_up=$(awk '$1 == "send" {print $2}' "$dir/responder.out")
sse_up=$(awk '$1 == "sse" {print $2}' "$dir/responder.out")
[[ -n $send_up && -n $sse_up ]] || { echo "the canned responder did not start: $dir/responder.err" >&2; exit 1; }

# run TOOL NAME KIND N: the proxy under TOOL (callgrind or strace), N
# requests of KIND (send: a SendMessage; sse: a SendStreamingMessage, its
# whole stream) through it.
run() {
    local tool=$1 name=$2 kind=$3 n=$4
    local up=$send_up method=SendMessage
    [[ $kind == sse ]] && { up=$sse_up; method=SendStreamingMessage; }
    # lib.sh's config writers put their upstream at 127.0.0.1:$wport.
    wport=${up##*:}
    local p; p=$(port)
    local cmd
    case $name in
        nginx)
            nginx_conf "$dir/nginx.$p.conf" "$p" 0
            cmd=(nginx -c "$dir/nginx.$p.conf") ;;
        bare)
            cmd=("$bare" --bare-pingora --listen "127.0.0.1:$p" --upstream "$up") ;;
        bare-read-0)
            cmd=("$bare" --bare-pingora --l4-read-buffer 0 --listen "127.0.0.1:$p" --upstream "$up") ;;
        gateway)
            gateway_toml "$dir/gw.$p.toml" 2
            sed -i "s/@PORT@/$p/" "$dir/gw.$p.toml"
            echo 'blocking_sends = "pass"' >> "$dir/gw.$p.toml"
            [[ -n ${A2AGW_GATEWAY_TOML:-} ]] && printf '%s\n' "$A2AGW_GATEWAY_TOML" >> "$dir/gw.$p.toml"
            cmd=("$gw" --config "$dir/gw.$p.toml") ;;
    esac
    local out="$dir/$name.$kind.$n"
    if [[ $tool == callgrind ]]; then
        valgrind --tool=callgrind --callgrind-out-file="$out.cg" "${cmd[@]}" > "$out.log" 2>&1 &
    else
        strace -f -c -o "$out.strace" "${cmd[@]}" > "$out.log" 2>&1 &
    fi
    local pid=$!
    vpid=$pid
    wait_port "$p" || { echo "$name did not start; $out.log" >&2; exit 1; }
    drive "$p" 1 "$method"   # warm: connections, lazy statics
    if (( n > 0 )); then
        local t0=$EPOCHREALTIME
        drive "$p" "$n" "$method"
        took=$(python3 -c "print($EPOCHREALTIME - $t0)")
    else
        # As long as the run with requests took: what the proxy does while
        # idle (timers, the gateway's background ticks) is in both runs, so
        # it is not counted as the requests'.
        sleep "$took"
    fi
    if [[ $tool == callgrind ]]; then
        kill -TERM $pid
    else
        # The proxy (strace's child) stops; strace writes its summary when
        # the last traced process has ended.
        pkill -TERM -P $pid
    fi
    wait $pid || true
}

proxies=(nginx bare bare-read-0 gateway)
for kind in send sse; do
    for proxy in "${proxies[@]}"; do
        for n in "$N" 0; do
            echo "callgrind $proxy $kind $n" >&2
            run callgrind "$proxy" "$kind" "$n"
        done
    done
done
# System calls, whose instructions callgrind does not see.
straced=()
if command -v strace > /dev/null; then
    straced=(nginx bare gateway)
    for kind in send sse; do
        for proxy in "${straced[@]}"; do
            for n in "$N" 0; do
                echo "strace $proxy $kind $n" >&2
                run strace "$proxy" "$kind" "$n"
            done
        done
    done
else
    echo "strace not installed: no table of system calls" >&2
fi

python3 - "$dir" "$N" "${proxies[@]}" <<'EOF'
import collections, re, sys

dir, n, proxies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def parse(path):
    """Self cost (Ir) per (object, source file, function) of a callgrind
    file: the cost lines, leaving out a call's (its callee's inclusive
    cost); a line's file is the function's (fl=) unless an inlined file
    (fi=, fe=) is set."""
    names, cost, calls, total = {}, collections.Counter(), collections.Counter(), None
    ob = fl = cur = fn = cfn = None
    skip = False
    kinds = {"ob": "ob", "cob": "ob", "fl": "fl", "fi": "fl", "fe": "fl",
             "cfl": "fl", "cfi": "fl", "fn": "fn", "cfn": "fn"}
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        if line[0].isdigit() or line[0] in "+-*":
            if skip:
                skip = False
                f = line.split()
                calls[(fn, cfn)] += int(f[1]) if len(f) > 1 else 0
                continue
            f = line.split()
            cost[(ob, cur, fn)] += int(f[1]) if len(f) > 1 else 0
            continue
        k, _, v = line.partition("=")
        if k in kinds:
            m = re.match(r"\((\d+)\)(?: (.*))?$", v)
            if m:
                key = (kinds[k], m.group(1))
                if m.group(2) is not None:
                    names[key] = m.group(2)
                v = names[key]
            if k == "ob":
                ob = v
            elif k == "fl":
                fl = cur = v
            elif k in ("fi", "fe"):
                cur = v
            elif k == "fn":
                fn, cur = v, fl
            elif k == "cfn":
                cfn = v
        elif k == "calls":
            skip = True
        elif line.startswith("totals:"):
            total = int(line.split()[1])
    assert total is None or sum(cost.values()) == total, (path, sum(cost.values()), total)
    return cost, calls

def fn_crate(fn):
    """The crate a function's (demangled) name starts with; for drop glue,
    the crate of the type dropped."""
    fn = fn or ""
    m = re.search(r"drop_in_place<\W*([a-z_][a-z0-9_]*)::", fn)
    if m:
        return m.group(1)
    m = re.match(r"\W*([a-z_][a-z0-9_]*)::", fn)
    return m.group(1) if m else ""

CRATE = re.compile(r"/registry/src/[^/]+/([A-Za-z0-9_.-]+?)-\d+\.\d+\.\d+[^/]*/")

def crate(ob, file, fn):
    """Where a line's code comes from: a crate, part of the workspace,
    Rust's standard library, or an object without Rust sources."""
    file = file or ""
    m = CRATE.search(file)
    if m:
        return m.group(1)
    m = re.search(r"vendor/(pingora-[a-z-]+)/", file)
    if m:
        return m.group(1)
    if "/rustc/" in file or re.search(r"/library/(core|alloc|std)/", file):
        # Whose function it was inlined into (or std's own, not inlined).
        side = fn_crate(fn)
        if side in ("a2a_gateway", "policies", "config"):
            return "std:gateway"
        if side in ("core", "alloc", "std"):
            return "std:std"
        return "std:other"
    if re.search(r"(^|/)gateway/src/allocator\.rs$", file):
        return "allocator.rs"
    if re.search(r"(^|/)gateway/src/proxy/timing\.rs$", file):
        return "timing.rs"
    for ws in ("gateway", "policies", "config"):
        if re.search(r"(^|/)%s/src/" % ws, file):
            return "workspace:" + ws
    if re.search(r"(^|/)benches/", file):
        return "benches"
    obj = (ob or "").rsplit("/", 1)[-1]
    if obj.startswith("libc.so"):
        if re.match(r"_*(mem|str|wmem|stp)", fn or ""):
            return "libc:mem"
        return "libc:other"
    if obj.startswith("linux-vdso") or obj.startswith("vdso"):
        return "vdso"
    if obj == "nginx":
        return "nginx"
    return "object:" + obj

GROUPS = [
    ("pingora (pingora-core, pingora-proxy and the other pingora-* crates)", lambda c: c.startswith("pingora")),
    ("tokio, mio (runtime, timers, I/O readiness)", lambda c: c in ("tokio", "mio", "tokio-util")),
    ("HTTP types and HTTP/1 parsing (http, httparse, bytes)", lambda c: c in ("http", "httparse", "bytes", "httpdate", "http-body")),
    ("allocator (mimalloc, and gateway/src/allocator.rs, its wrapper)", lambda c: c in ("libmimalloc-sys", "mimalloc", "allocator.rs")),
    ("libc: memcpy, memmove, memset, memcmp, str*", lambda c: c == "libc:mem"),
    ("libc: system call wrappers and the rest", lambda c: c == "libc:other"),
    ("vDSO (clock reads)", lambda c: c == "vdso"),
    ("Rust core, alloc, std: inlined into the gateway's functions (or its types' drops)", lambda c: c == "std:gateway"),
    ("Rust core, alloc, std: inlined into other functions (pingora's, tokio's, ...)", lambda c: c == "std:other"),
    ("Rust core, alloc, std: their own functions, not inlined", lambda c: c == "std:std"),
    ("the gateway's own code (gateway/, policies/, config/)", lambda c: c.startswith("workspace:")),
    ("JSON (serde_json, serde)", lambda c: c in ("serde_json", "serde", "serde_core")),
    ("the timing marks (gateway/src/proxy/timing.rs: the gateway's, bare pingora has them too)", lambda c: c == "timing.rs"),
    ("bare pingora's own (benches/bare_pingora.rs)", lambda c: c == "benches"),
    ("nginx's own code", lambda c: c == "nginx"),
]
OTHER = "other crates and objects (below)"

def group(c):
    for name, test in GROUPS:
        if test(c):
            return name
    return OTHER

per = {}   # (proxy, kind) -> Counter of crate -> Ir per request
files = {}  # (proxy, kind) -> Counter of workspace file -> Ir per request
fns = {}  # (proxy, kind) -> Counter of (group, function) -> Ir per request
mem = {}  # (proxy, kind) -> Counter of memcpy & co's callers -> Ir per request
for proxy in proxies:
    for kind in ("send", "sse"):
        a, ca = parse(f"{dir}/{proxy}.{kind}.0.cg")
        b, cb = parse(f"{dir}/{proxy}.{kind}.{n}.cg")
        c, fs, fx, mx = (collections.Counter() for _ in range(4))
        for key in set(ca) | set(cb):
            if re.match(r"_*(mem|str|wmem|stp)", key[1] or "") and not re.match(r"_*(mem|str|wmem|stp)", key[0] or ""):
                mx[key[0]] += (cb.get(key, 0) - ca.get(key, 0)) / n
        mem[(proxy, kind)] = mx
        for key in set(a) | set(b):
            d = (b.get(key, 0) - a.get(key, 0)) / n
            cr = crate(*key)
            c[cr] += d
            fx[(group(cr), key[2])] += d
            if cr.startswith("workspace:"):
                fs[(cr, key[1])] += d
            elif cr == "std:gateway":
                fs[(cr, key[2])] += d
        per[(proxy, kind)] = c
        files[(proxy, kind)] = fs
        fns[(proxy, kind)] = fx

def grouped(c):
    g = collections.Counter()
    for cr, v in c.items():
        g[group(cr)] += v
    return g

cols = [("send", "nginx"), ("send", "bare"), ("send", "gateway"), ("sse", "nginx"), ("sse", "bare"), ("sse", "gateway")]
g = {(k, p): grouped(per[(p, k)]) for k, p in cols}
print(f"instructions per request (callgrind, user space only: the kernel's are not counted; {n} sequential keep-alive requests; canned responder; files in {dir})")
print()
print("| where the instructions' code comes from | SendMessage: nginx | bare pingora | gateway | gateway - bare | SSE stream (50 events): nginx | bare pingora | gateway | gateway - bare |")
print("|---|---|---|---|---|---|---|---|---|")
fmt = lambda v: f"{v:,.0f}"
for name in [x for x, _ in GROUPS] + [OTHER, "total"]:
    row = []
    for kind in ("send", "sse"):
        vals = [sum(g[(kind, p)].values()) if name == "total" else g[(kind, p)].get(name, 0) for p in ("nginx", "bare", "gateway")]
        row += [fmt(v) for v in vals] + [fmt(vals[2] - vals[1])]
    if name != "total" and all(x in ("0", "-0") for x in row):
        continue
    print(f"| {name} | " + " | ".join(row) + " |")
print()
for kind, label in (("send", "SendMessage"), ("sse", "SSE stream")):
    t = {p: sum(per[(p, kind)].values()) for p in proxies}
    print(f"{label}: gateway / bare {t['gateway'] / t['bare']:.2f}x, gateway / nginx {t['gateway'] / t['nginx']:.2f}x, bare / nginx {t['bare'] / t['nginx']:.2f}x; bare pingora without its read-ahead (the gateway's default): {t['bare-read-0']:,.0f}")
print()
print("other crates and objects, and the gateway's own code by crate (Ir per request, where some column has 100 or more):")
print()
print("| crate or object | SendMessage: nginx | bare | gateway | SSE: nginx | bare | gateway |")
print("|---|---|---|---|---|---|---|")
crates = set()
for c in per.values():
    crates |= {cr for cr, v in c.items() if abs(v) >= 100 and (group(cr) == OTHER or cr.startswith("workspace:"))}
for cr in sorted(crates, key=lambda cr: -per[("gateway", "send")].get(cr, 0)):
    print(f"| {cr} | " + " | ".join(fmt(per[(p, k)].get(cr, 0)) for k in ("send", "sse") for p in ("nginx", "bare", "gateway")) + " |")
print()
print("the gateway's own code by file, and Rust's standard library inlined into the gateway's functions by function (Ir per request, gateway, SendMessage / SSE stream; 500 or more):")
keys = set(files[("gateway", "send")]) | set(files[("gateway", "sse")])
for key in sorted(keys, key=lambda k: -(files[("gateway", "send")].get(k, 0) + files[("gateway", "sse")].get(k, 0))):
    s, x = files[("gateway", "send")].get(key, 0), files[("gateway", "sse")].get(key, 0)
    if max(abs(s), abs(x)) >= 500:
        print(f"  {key[0]} {key[1]}: {fmt(s)} / {fmt(x)}")

# The details: per group, the functions whose lines the gateway runs more
# of than bare pingora; who calls memcpy & co.
with open(f"{dir}/details.txt", "w") as out:
    for kind in ("send", "sse"):
        gw, br = fns[("gateway", kind)], fns[("bare", kind)]
        delta = collections.Counter({k: gw.get(k, 0) - br.get(k, 0) for k in set(gw) | set(br)})
        by_group = collections.defaultdict(list)
        for (grp, f), v in delta.items():
            by_group[grp].append((v, f))
        print(f"== {kind}: gateway minus bare pingora, Ir per request, by group and function (the function the line ran in)", file=out)
        for grp, items in sorted(by_group.items(), key=lambda x: -sum(v for v, _ in x[1])):
            print(f"{grp}: {sum(v for v, _ in items):,.0f}", file=out)
            for v, f in sorted(items, reverse=True)[:12]:
                if abs(v) >= 50:
                    print(f"    {v:10,.0f}  {f}", file=out)
        gm, bm = mem[("gateway", kind)], mem[("bare", kind)]
        print(f"== {kind}: calls to memcpy, memmove, memset, memcmp, str* by caller, Ir per request (inclusive): gateway / bare", file=out)
        for f in sorted(set(gm) | set(bm), key=lambda f: -gm.get(f, 0))[:25]:
            print(f"    {gm.get(f, 0):10,.0f} {bm.get(f, 0):10,.0f}  {f}", file=out)
print()
print(f"per function: {dir}/details.txt")

# System calls per request, from strace -f -c.
def syscalls(path):
    out = {}
    for line in open(path):
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) >= 5 and re.fullmatch(r"[\d.]+", f[0]) and f[3].isdigit() and f[-1] != "total":
            out[f[-1]] = int(f[3])
    return out
import os
straced = [p for p in ("nginx", "bare", "gateway") if os.path.exists(f"{dir}/{p}.send.0.strace")]
if straced:
    sc = {}
    for p in straced:
        for kind in ("send", "sse"):
            a, b = syscalls(f"{dir}/{p}.{kind}.0.strace"), syscalls(f"{dir}/{p}.{kind}.{n}.strace")
            sc[(p, kind)] = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}
    print()
    print(f"system calls per request (strace -f -c, {n} sequential requests, the same runs under strace instead of callgrind):")
    print()
    print("| system call | " + " | ".join(f"SendMessage: {p}" for p in straced) + " | " + " | ".join(f"SSE stream: {p}" for p in straced) + " |")
    print("|---|" + "---|" * (2 * len(straced)))
    rows = sorted({k for c in sc.values() for k, v in c.items() if abs(v) >= 0.05})
    for k in rows:
        print(f"| `{k}` | " + " | ".join(f"{sc[(p, kind)].get(k, 0):.2f}" for kind in ("send", "sse") for p in straced) + " |")
    print("| all | " + " | ".join(f"{sum(v for v in sc[(p, kind)].values() if v > 0):.2f}" for kind in ("send", "sse") for p in straced) + " |")
EOF
