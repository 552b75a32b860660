//! The security suite (issue 43): one test per attack in which a caller
//! chooses a name the gateway then trusts (a content type, a tenant, a
//! header, a path, a `Host`), each against real workers. The threat model
//! they show is in `docs/behaviour.md#threat-model`.

mod admin;
mod credentials;
mod edges;
mod grpc_typed;
mod h2c_workers;
mod identity;
mod jwks;
mod logs;
mod tenants;
