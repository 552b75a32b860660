//! Rewriting agent cards so that clients come back through the gateway.
//!
//! A card names the URLs its interfaces listen on; a client that read the
//! worker's card unchanged would bypass the gateway on its next call. Every
//! HTTP(S) interface URL is moved under the gateway's base URL, keeping the
//! part of its path below the worker's base path. Signatures cover the
//! original URLs, so they are dropped (`docs/behaviour.md` says why).

use serde_json::Value;

/// Where the card came from and where clients should go instead.
#[derive(Clone, Debug)]
pub struct CardRewrite<'a> {
    /// The worker's base path (`""` or `/x/y`), removed from interface paths.
    pub worker_base_path: &'a str,
    /// The gateway URL clients use for this route (`https://gw/route`), no
    /// trailing slash.
    pub gateway_base: &'a str,
    /// The worker's `host:port`: a `ws(s)://` interface there (a2a-rust's
    /// WebSocket binding on the route's own worker) is moved to the gateway
    /// too; WebSocket URLs elsewhere are left alone.
    pub worker_authority: &'a str,
}

/// Why a card was passed through unchanged.
#[derive(Debug, PartialEq, Eq)]
pub enum CardError {
    NotJson,
    NotAnObject,
}

impl CardRewrite<'_> {
    /// Rewrites one URL, or `None` when it is not an `http(s)` URL (gRPC
    /// targets, `ws://` endpoints and other schemes are left alone).
    pub fn url(&self, url: &str) -> Option<String> {
        let (rest, websocket) = match url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
        {
            Some(rest) => (rest, false),
            None => (
                url.strip_prefix("ws://")
                    .or_else(|| url.strip_prefix("wss://"))?,
                true,
            ),
        };
        let authority = rest.find('/').map_or(rest, |i| &rest[..i]);
        if websocket && !authority.eq_ignore_ascii_case(self.worker_authority) {
            return None;
        }
        let path = rest.find('/').map_or("", |i| &rest[i..]);
        let base = self.worker_base_path;
        let suffix = match path.strip_prefix(base) {
            Some(s) if !base.is_empty() && (s.is_empty() || s.starts_with(['/', '?'])) => s,
            _ => path,
        };
        if websocket {
            let base = self
                .gateway_base
                .strip_prefix("https://")
                .map(|b| format!("wss://{b}"))
                .or_else(|| {
                    self.gateway_base
                        .strip_prefix("http://")
                        .map(|b| format!("ws://{b}"))
                })
                .unwrap_or_else(|| self.gateway_base.to_string());
            return Some(format!("{base}{suffix}"));
        }
        Some(format!("{}{}", self.gateway_base, suffix))
    }

    fn interface(&self, iface: &mut Value) -> usize {
        let binding = iface
            .get("protocolBinding")
            .or_else(|| iface.get("transport"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if binding.eq_ignore_ascii_case("GRPC") {
            return 0;
        }
        match iface.get_mut("url") {
            Some(Value::String(u)) => match self.url(u) {
                Some(new) => {
                    *u = new;
                    1
                }
                None => 0,
            },
            _ => 0,
        }
    }

    /// Rewrites a card (well-known or extended). Returns the new body and how
    /// many URLs were rewritten.
    pub fn card(&self, body: &[u8]) -> Result<(Vec<u8>, usize), CardError> {
        let mut card: Value = serde_json::from_slice(body).map_err(|_| CardError::NotJson)?;
        let n = self.card_value(&mut card)?;
        Ok((
            serde_json::to_vec(&card).unwrap_or_else(|_| body.to_vec()),
            n,
        ))
    }

    /// Rewrites a card in place (for a card inside a JSON-RPC `result`).
    pub fn card_value(&self, card: &mut Value) -> Result<usize, CardError> {
        let obj = card.as_object_mut().ok_or(CardError::NotAnObject)?;
        let mut n = 0;
        for key in ["supportedInterfaces", "additionalInterfaces"] {
            if let Some(Value::Array(list)) = obj.get_mut(key) {
                for iface in list {
                    n += self.interface(iface);
                }
            }
        }
        // v0.3 top-level `url` (with `preferredTransport`).
        let top_binding = obj
            .get("preferredTransport")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !top_binding.eq_ignore_ascii_case("GRPC") {
            if let Some(Value::String(u)) = obj.get_mut("url") {
                if let Some(new) = self.url(u) {
                    *u = new;
                    n += 1;
                }
            }
        }
        if n > 0 {
            obj.remove("signatures");
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn url_table() {
        let rw = CardRewrite {
            worker_base_path: "/api",
            gateway_base: "https://gw.example/research",
            worker_authority: "127.0.0.1:9000",
        };
        let table = [
            (
                "http://127.0.0.1:9000/api",
                Some("https://gw.example/research"),
            ),
            (
                "http://127.0.0.1:9000/api/",
                Some("https://gw.example/research/"),
            ),
            (
                "http://127.0.0.1:9000/api/v1",
                Some("https://gw.example/research/v1"),
            ),
            (
                "http://127.0.0.1:9000/apix",
                Some("https://gw.example/research/apix"),
            ),
            ("https://other:1/", Some("https://gw.example/research/")),
            ("http://h", Some("https://gw.example/research")),
            ("ws://127.0.0.1:9001/ws", None),
            (
                "ws://127.0.0.1:9000/ws",
                Some("wss://gw.example/research/ws"),
            ),
            (
                "wss://127.0.0.1:9000/api/ws",
                Some("wss://gw.example/research/ws"),
            ),
            ("grpc://x", None),
        ];
        for (from, want) in table {
            assert_eq!(rw.url(from).as_deref(), want, "{from}");
        }
    }

    #[test]
    fn card_rewrite() {
        let rw = CardRewrite {
            worker_base_path: "",
            gateway_base: "http://gw:8080/r",
            worker_authority: "127.0.0.1:9002",
        };
        let card = json!({
            "name": "w",
            "url": "http://127.0.0.1:9000",
            "supportedInterfaces": [
                {"url": "http://127.0.0.1:9000", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": "http://127.0.0.1:9000/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0", "tenant": "acme"},
                {"url": "http://127.0.0.1:9001", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "ws://127.0.0.1:9002/ws", "protocolBinding": "https://a2a-rust.com/bindings/websocket/v1"}
            ],
            "additionalInterfaces": [{"url": "http://127.0.0.1:9000", "transport": "JSONRPC"}],
            "signatures": [{"protected": "x", "signature": "y"}]
        });
        let (out, n) = rw.card(card.to_string().as_bytes()).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(n, 5);
        assert_eq!(out["url"], "http://gw:8080/r");
        assert_eq!(out["supportedInterfaces"][0]["url"], "http://gw:8080/r");
        assert_eq!(
            out["supportedInterfaces"][1]["url"],
            "http://gw:8080/r/rest"
        );
        assert_eq!(out["supportedInterfaces"][1]["tenant"], "acme");
        assert_eq!(
            out["supportedInterfaces"][2]["url"],
            "http://127.0.0.1:9001"
        );
        assert_eq!(out["supportedInterfaces"][3]["url"], "ws://gw:8080/r/ws");
        assert_eq!(out["additionalInterfaces"][0]["url"], "http://gw:8080/r");
        assert!(out.get("signatures").is_none());
        assert_eq!(out["name"], "w");
    }

    #[test]
    fn bad_cards() {
        let rw = CardRewrite {
            worker_base_path: "",
            gateway_base: "http://gw",
            worker_authority: "w:1",
        };
        assert_eq!(rw.card(b"<html>").unwrap_err(), CardError::NotJson);
        assert_eq!(rw.card(b"[1]").unwrap_err(), CardError::NotAnObject);
    }
}
