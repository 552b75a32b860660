//! Whether the process's long-running background services still run, for
//! `/healthz`.
//!
//! pingora runs each background service's `start` in a task of its own
//! runtime: one that returns, or panics (tokio catches the panic), is gone
//! without a trace while the proxy goes on serving, with no tracker writing
//! task records, no reaper cancelling lapsed leases, or no drainer. Each
//! such service is started inside [`Watched`], which records in
//! [`Services`] that it stopped unless the server is shutting down; the
//! admin endpoint's `/healthz` then answers 503 naming it, so that a
//! liveness probe restarts the process.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_util::FutureExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

/// A background service that stopped while the process was not shutting
/// down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The service's name (`tracker`, `leases`, `drain`, `config reload`).
    pub service: &'static str,
    /// `panicked` or `returned` (the panic's message is in the log only:
    /// `/healthz` needs no token).
    pub how: &'static str,
}

/// The background services of this process that stopped unexpectedly.
#[derive(Debug, Default)]
pub struct Services {
    stopped: Mutex<Vec<Stopped>>,
}

impl Services {
    /// Those that stopped, in the order they did.
    pub fn stopped(&self) -> Vec<Stopped> {
        self.lock().clone()
    }

    fn record(&self, stopped: Stopped) {
        self.lock().push(stopped);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Stopped>> {
        // Every change under the lock is one push.
        self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `/healthz`'s reason for 503, or `None` while every service runs.
    pub fn unhealthy(&self) -> Option<String> {
        let stopped = self.stopped();
        if stopped.is_empty() {
            return None;
        }
        let named: Vec<String> = stopped
            .iter()
            .map(|s| format!("{} ({})", s.service, s.how))
            .collect();
        Some(format!(
            "unhealthy: background service stopped: {}; see the log\n",
            named.join(", ")
        ))
    }
}

/// Runs a background service and records in [`Services`] when its `start`
/// returns or panics while the server is not shutting down.
pub struct Watched {
    name: &'static str,
    inner: Arc<dyn BackgroundService + Send + Sync>,
    services: Arc<Services>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched").field("name", &self.name).finish()
    }
}

impl Watched {
    pub fn new(
        name: &'static str,
        inner: Arc<dyn BackgroundService + Send + Sync>,
        services: Arc<Services>,
    ) -> Watched {
        Watched {
            name,
            inner,
            services,
        }
    }
}

/// A panic's message, if it has one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[async_trait]
impl BackgroundService for Watched {
    async fn start(&self, shutdown: ShutdownWatch) {
        let watch = shutdown.clone();
        let ended = AssertUnwindSafe(self.inner.start(shutdown))
            .catch_unwind()
            .await;
        if *watch.borrow() {
            return;
        }
        let how = match &ended {
            Ok(()) => {
                tracing::error!(
                    service = self.name,
                    "a background service returned while the gateway runs; /healthz answers 503"
                );
                "returned"
            }
            Err(payload) => {
                tracing::error!(
                    service = self.name,
                    panic = panic_message(payload.as_ref()),
                    "a background service panicked; /healthz answers 503"
                );
                "panicked"
            }
        };
        self.services.record(Stopped {
            service: self.name,
            how,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;
    #[async_trait]
    impl BackgroundService for Panics {
        async fn start(&self, _shutdown: ShutdownWatch) {
            tokio::task::yield_now().await;
            panic!("boom");
        }
    }

    struct Returns;
    #[async_trait]
    impl BackgroundService for Returns {
        async fn start(&self, _shutdown: ShutdownWatch) {}
    }

    /// Returns once the shutdown flag is set, as the drainer does.
    struct UntilShutdown;
    #[async_trait]
    impl BackgroundService for UntilShutdown {
        async fn start(&self, mut shutdown: ShutdownWatch) {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    return;
                }
            }
        }
    }

    /// A service that panics or returns is named, in order; one that
    /// returns for a shutdown is not; `unhealthy` names each.
    #[tokio::test]
    async fn stopped_services_are_named_unless_shutting_down() {
        let services = Arc::new(Services::default());
        assert_eq!(services.unhealthy(), None);
        let (tx, rx) = tokio::sync::watch::channel(false);
        let watched = |name, inner: Arc<dyn BackgroundService + Send + Sync>| {
            Watched::new(name, inner, services.clone())
        };
        let down = watched("down", Arc::new(UntilShutdown));
        let down = tokio::spawn(async move { down.start(rx).await });
        watched("leases", Arc::new(Panics))
            .start(tx.subscribe())
            .await;
        watched("tracker", Arc::new(Returns))
            .start(tx.subscribe())
            .await;
        assert_eq!(
            services.stopped(),
            vec![
                Stopped {
                    service: "leases",
                    how: "panicked"
                },
                Stopped {
                    service: "tracker",
                    how: "returned"
                },
            ]
        );
        assert_eq!(
            services.unhealthy().as_deref(),
            Some(
                "unhealthy: background service stopped: leases (panicked), tracker (returned); see the log\n"
            )
        );
        tx.send(true).unwrap();
        down.await.unwrap();
        watched("drain", Arc::new(Returns))
            .start(tx.subscribe())
            .await;
        assert_eq!(services.stopped().len(), 2, "{:?}", services.stopped());
    }

    #[test]
    fn panic_messages() {
        let s: Box<dyn std::any::Any + Send> = Box::new("static");
        assert_eq!(panic_message(s.as_ref()), "static");
        let s: Box<dyn std::any::Any + Send> = Box::new(String::from("owned"));
        assert_eq!(panic_message(s.as_ref()), "owned");
        let s: Box<dyn std::any::Any + Send> = Box::new(3u8);
        assert_eq!(panic_message(s.as_ref()), "(no message)");
    }
}
