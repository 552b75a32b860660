//! HTTP/1 conformance the gateway enforces in its own hooks (issue: "No
//! policy bypass", item 4).
