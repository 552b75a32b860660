//! One JSON-RPC request over a WebSocket, for tests and benches.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Upgrades to `url` (`ws://…`) as an A2A 1.0 client (`A2A-Version: 1.0`,
/// which a2a-rust's WebSocket binding requires on the upgrade).
pub async fn connect(url: &str) -> Result<WebSocketStream<MaybeTlsStream<TcpStream>>, String> {
    let mut req = url
        .into_client_request()
        .map_err(|e| format!("{url}: {e}"))?;
    req.headers_mut()
        .insert("a2a-version", http::HeaderValue::from_static("1.0"));
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .map_err(|e| format!("WebSocket connect {url}: {e}"))?;
    Ok(ws)
}

/// Sends `body` (a JSON-RPC request whose id is `id`) and reads frames until
/// the answer with that id, which it returns; other frames (stream events,
/// answers to other ids, pings) are skipped. `Err` says how the socket ended
/// instead.
pub async fn round_trip<S>(
    ws: &mut WebSocketStream<S>,
    id: u64,
    body: String,
) -> Result<Value, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(Message::text(body))
        .await
        .map_err(|e| format!("send: {e}"))?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                if v["id"].as_u64() == Some(id) {
                    return Ok(v);
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("read: {e}")),
            None => return Err("the socket ended".into()),
        }
    }
}
