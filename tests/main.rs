//! Integration tests of a2a-gateway against real peers: a2a-rust 0.15 agents
//! and agents on the official Python `a2a-sdk` 1.3.0.
//!
//! One test binary; `harness` holds the helpers that start each peer.

mod admin;
mod auth;
mod blocking_send;
mod budgets;
mod cascade;
mod cluster;
mod delegation;
mod demo;
mod faults;
mod gateway_basics;
mod grpc;
mod grpc_harness;
mod grpc_policy;
mod hardening;
mod harness;
mod http1;
mod leases;
mod leave_at_once;
mod logs;
mod metrics;
mod outbox;
mod parent_selftest;
mod poll_lease;
mod python_selftest;
mod redis_tls;
mod reload;
mod replica_dns;
mod replicas;
mod security;
mod sentinel;
mod shutdown;
mod sse_recorded;
mod store_conformance;
mod strict_reading;
mod timeouts;
mod tls;
mod traces;
mod upstream_connections;
mod websocket;
mod worker_selftest;
mod ws_frames;
