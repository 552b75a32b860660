//! Integration tests of a2a-gateway against real peers: a2a-rust 0.15 agents,
//! agents on the official Python `a2a-sdk`, and a real `redis-server`.
//!
//! One test binary; `harness` holds the helpers that start each peer.

mod cascade;
mod harness;
mod sse_recorded;
mod worker_selftest;
mod python_selftest;
