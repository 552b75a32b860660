# syntax=docker/dockerfile:1
#
#   docker build -t a2a-gateway .
#   docker run --rm -p 8080:8080 \
#       -v "$PWD/gateway.toml:/etc/a2a-gateway/gateway.toml:ro" a2a-gateway
#
# The built-in /etc/a2a-gateway/gateway.toml is config/examples/minimal.toml
# with a [server] section that listens on 0.0.0.0:8080, since loopback inside
# a container is unreachable from outside. Its admin endpoint is on
# 127.0.0.1:9090, inside the container only: /tasks and /budgets show
# tenants, tasks and callers, and an admin listener off loopback needs a
# token (admin = "0.0.0.0:9090" with admin_token_env, docs/operations.md).
# Its worker, http://127.0.0.1:9000, is the container itself: mount your own
# config, and give it `listen = "0.0.0.0:8080"` too. `docker run a2a-gateway check-config
# /etc/a2a-gateway/gateway.toml` validates a mounted file.

FROM rust:1-bookworm AS builder
# pingora's zlib-ng (libz-ng-sys) is built with cmake.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p a2a-gateway --locked \
    && install -D -m 0755 target/release/a2a-gateway /out/a2a-gateway
RUN { printf '[server]\nlisten = "0.0.0.0:8080"\nadmin = "127.0.0.1:9090"\n\n'; \
      cat config/examples/minimal.toml; } > /out/gateway.toml

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 a2agw \
    && useradd --system --uid 10001 --gid a2agw --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin a2agw
COPY --from=builder /out/a2a-gateway /usr/local/bin/a2a-gateway
COPY --from=builder /out/gateway.toml /etc/a2a-gateway/gateway.toml
USER 10001:10001
# mimalloc (the gateway's allocator) turns transparent huge pages off for
# the process: on a host set to `always` they would make each open stream's
# mostly untouched read buffers resident (docs/operations.md, "Memory and
# the allocator").
ENV MIMALLOC_ALLOW_THP=0
# The admin port stays inside the container (127.0.0.1:9090 above): only
# the proxy port is exposed. An admin listener elsewhere needs a token.
EXPOSE 8080
# The image has no curl: the binary asks its own admin endpoint. A config
# whose admin is not 127.0.0.1:9090 names it: `a2a-gateway health ADDR`
# (docker run --health-cmd, or the orchestrator's own probes).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["a2a-gateway", "health"]
ENTRYPOINT ["a2a-gateway"]
CMD ["--config", "/etc/a2a-gateway/gateway.toml"]
