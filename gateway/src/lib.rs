//! a2a-gateway: a pingora reverse proxy that gives unmodified A2A workers
//! the delegation guarantees of the a2a-rust SDK (cascade cancel first).
//!
//! The edges live here (hooks, framing, stores, background work); the
//! decisions live in the `policies` crate.

pub mod a2a;
pub mod admin;
pub mod allocator;
pub mod auth;
pub mod budget;
pub mod cancel;
pub mod cascade;
pub mod digest;
pub mod drain;
pub mod health;
pub mod lease;
pub mod link;
pub mod log_line;
pub mod log_writer;
pub mod metrics;
pub mod proxy;
pub mod redact;
pub mod reload;
pub mod replicas;
pub mod resolve;
pub mod route;
pub mod server;
pub mod store;
pub mod tls;
pub mod trace;
pub mod tracker;
pub mod tree;
pub mod worker_client;
