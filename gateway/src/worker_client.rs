//! The gateway's own connections to workers: one pool for every call it
//! makes itself, besides the requests it proxies (pingora's proxy pools
//! those): `CancelTask`, the `GetTask` probe and history read, the
//! `ListTasks` lookup (`cancel.rs`), and blocking sends carried as streams
//! (`proxy/carry.rs`). So a worker sees one set of the gateway's
//! connections, reused across all of them, whatever replica the call is
//! for: each connection is pooled under its peer (address, TLS settings).

use std::time::Duration;

use pingora::connectors::http::Connector;
use pingora::connectors::TransportConnector;
use pingora::protocols::http::client::HttpSession;
use pingora::upstreams::peer::HttpPeer;

/// The gateway's connections to workers. Shared (`Arc`) by the canceller
/// and the carrier.
pub struct WorkerClient {
    http: Connector,
    /// Bare (TLS) streams, for WebSocket calls over a socket of the
    /// gateway's own.
    transport: TransportConnector,
}

impl std::fmt::Debug for WorkerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerClient").finish_non_exhaustive()
    }
}

impl Default for WorkerClient {
    fn default() -> Self {
        WorkerClient {
            http: Connector::new(None),
            transport: TransportConnector::new(None),
        }
    }
}

impl WorkerClient {
    /// A session to `peer` (HTTP/1 or HTTP/2 as its options say), pooled or
    /// new; whether it was reused.
    pub async fn session(&self, peer: &HttpPeer) -> pingora::Result<(HttpSession, bool)> {
        self.http.get_http_session(peer).await
    }

    /// Gives a session whose exchange ended cleanly back to the pool, kept
    /// idle for at most `idle`.
    pub async fn release(&self, session: HttpSession, peer: &HttpPeer, idle: Duration) {
        self.http
            .release_http_session(session, peer, Some(idle))
            .await;
    }

    /// The connector of bare streams (a WebSocket's upgrade and frames).
    pub fn transport(&self) -> &TransportConnector {
        &self.transport
    }
}
