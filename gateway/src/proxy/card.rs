//! Agent cards, rewritten on their way to the caller: the interface URLs
//! point at the gateway (`crate::a2a::card`), and what a card declares
//! (the lease extension) tells the route whether its worker enforces leases.

use pingora::proxy::Session;

use super::classify::request_host;
use super::ctx::Ctx;
use super::Gateway;
use crate::a2a::card::CardRewrite;
use crate::metrics;

impl Gateway {
    /// The card as the caller must see it: rewritten, or as it was when it
    /// cannot be read (counted).
    pub(super) fn rewrite_card(
        &self,
        session: &Session,
        ctx: &Ctx,
        held: Vec<u8>,
        jsonrpc: bool,
    ) -> Vec<u8> {
        let Some(route) = &ctx.route else { return held };
        let base = self.gateway_base(session, ctx);
        let rw = CardRewrite {
            worker_base_path: &ctx.req.worker_root,
            gateway_base: &base,
            worker_authority: route.addr.authority(),
        };
        let mut doc: serde_json::Value =
            serde_json::from_slice(&held).unwrap_or(serde_json::Value::Null);
        let card = if jsonrpc {
            doc.get_mut("result")
        } else {
            Some(&mut doc)
        };
        let result = match card {
            Some(card) => {
                // The card says whether the worker enforces leases itself
                // (a body that is no card says nothing).
                if card.is_object() {
                    let declares = card_declares(card, policies::lease::LEASE_EXTENSION_URI);
                    route
                        .card_declares_lease
                        .store(declares, std::sync::atomic::Ordering::Relaxed);
                }
                rw.card_value(card)
            }
            None => Ok(0),
        }
        .map(|n| {
            (
                if n > 0 {
                    serde_json::to_vec(&doc).unwrap_or_else(|_| held.clone())
                } else {
                    held.clone()
                },
                n,
            )
        });
        match result {
            Ok((out, n)) => {
                metrics::CARDS_REWRITTEN
                    .with_label_values(&[
                        &route.name,
                        if n > 0 { "rewritten" } else { "unchanged" },
                    ])
                    .inc();
                out
            }
            Err(e) => {
                metrics::CARDS_REWRITTEN
                    .with_label_values(&[&route.name, "unreadable"])
                    .inc();
                tracing::debug!(route = %route.name, error = ?e, "agent card passed through unchanged");
                held
            }
        }
    }

    /// The gateway's own URL for this route, as the caller reached it.
    fn gateway_base(&self, session: &Session, ctx: &Ctx) -> String {
        let origin = match &self.public_url {
            Some(u) => u.clone(),
            None => {
                let host = request_host(session.req_header()).unwrap_or("localhost");
                // A caller on a `[server.tls]` listener reaches it by https.
                let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
                let scheme = if tls { "https" } else { "http" };
                format!("{scheme}://{host}")
            }
        };
        // The route's public prefix (what `Routes::find` matched).
        let prefix = ctx
            .route
            .as_ref()
            .and_then(|r| r.cfg.path_prefix.as_deref());
        format!("{origin}{}", prefix.unwrap_or(""))
    }
}

/// A card's `capabilities.extensions` names `uri`.
fn card_declares(card: &serde_json::Value, uri: &str) -> bool {
    card["capabilities"]["extensions"]
        .as_array()
        .is_some_and(|list| list.iter().any(|e| e["uri"].as_str() == Some(uri)))
}
