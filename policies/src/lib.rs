//! Delegation-policy decisions for a2a-gateway, as pure functions over data.
//!
//! Nothing in this crate does I/O, spawns, awaits or reads a clock: every
//! function that depends on time takes `now` as an argument. That keeps the
//! rules that decide whether a worker's task gets a `CancelTask` testable in
//! tables, and lets the gateway's edges (pingora hooks, stores, background
//! services) stay thin.

pub mod budget;
pub mod carry;
pub mod cascade;
pub mod connection;
pub mod delegation;
pub mod failure;
pub mod lease;
pub mod owner;
pub mod reading;
pub mod task_state;
pub mod track;

pub use cascade::{CascadeMode, CascadePolicy, Decision, Event, Seen};
pub use task_state::TaskState;
