//! A2A framing: what a request is, and what the worker's answer says.
//!
//! Everything here works on bytes and borrowed strings, never on a full JSON
//! tree: the proxy's hot path runs these functions once per chunk or event.

pub mod card;
pub mod classify;
pub mod extensions;
pub mod grpc;
pub mod json;
pub mod observe;
pub mod request;
pub mod sse;
pub mod ws;

pub use classify::{classify, A2aMethod, Binding, Call};
pub use observe::Observation;
