//! One JSON-RPC request over a WebSocket, for tests and benches.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

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
