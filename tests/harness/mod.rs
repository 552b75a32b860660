//! Small helpers that start real peers on free loopback ports and talk to them.

#![allow(dead_code)]

pub mod gateway;
pub mod http;
pub mod parent;
pub mod python_worker;
pub mod redis;
pub mod relay;
pub mod rust_worker;
pub mod stream;
pub mod tls;
pub mod worker;
pub mod ws;
