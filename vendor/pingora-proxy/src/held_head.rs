// a2a-gateway patch: this whole file (see patches/README.md, "One write per request").

//! An upstream connection that can send a request's head together with its
//! body.
//!
//! pingora-core's HTTP/1 client writes a request's head and flushes it, then
//! writes the body; upstream connections have no write buffer, so that is
//! one `sendto` for the head and one more for the body (and two segments
//! for the upstream to take in) for every request with a body, where nginx
//! makes one `writev`. This wrapper can keep the head (the writes up to the
//! next flush) and send it with the first write after that flush, the
//! body's, in one vectored write.

use async_trait::async_trait;
use pingora_core::protocols::raw_connect::ProxyDigest;
use pingora_core::protocols::tls::TlsRef;
use pingora_core::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection (`inner`) that can hold back a request's head.
#[derive(Debug)]
pub struct HeldHead {
    inner: Stream,
    /// Set for a head to hold: writes are kept in `pending` until the next
    /// flush, which sends nothing and clears this.
    hold: AtomicBool,
    /// Written but not sent yet: goes out with the next write or flush.
    pending: Vec<u8>,
}

impl HeldHead {
    pub fn wrap(inner: Stream) -> Stream {
        Box::new(HeldHead {
            inner,
            hold: AtomicBool::new(false),
            pending: Vec::new(),
        })
    }

    /// What is written to `stream` up to its next flush (the request head)
    /// stays unsent past that flush and leaves with the next write (the
    /// body's first bytes). Only for a body that is about to be written (read
    /// whole already, no `Expect: 100-continue`). No effect on another kind
    /// of stream.
    pub fn hold_head(stream: &Stream) {
        if let Some(held) = Self::of(stream) {
            held.hold.store(true, Ordering::Relaxed);
        }
    }

    /// Whether `stream` holds bytes not sent yet (a head whose body never
    /// came): such a connection must not be reused.
    pub fn has_pending(stream: &Stream) -> bool {
        Self::of(stream)
            .is_some_and(|held| !held.pending.is_empty() || held.hold.load(Ordering::Relaxed))
    }

    /// The `HeldHead` that `stream` is, if it is one.
    fn of(stream: &Stream) -> Option<&HeldHead> {
        // `Box<dyn IO>` is itself an `IO`: ask the connection inside it.
        let io: &dyn pingora_core::protocols::IO = &**stream;
        io.as_any().downcast_ref::<HeldHead>()
    }

    /// Sends what is pending, alone.
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for HeldHead {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for HeldHead {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.hold.load(Ordering::Relaxed) {
            this.pending.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        // The held head, then `buf`, in one write; what of `buf` went out
        // with it is reported as written.
        while !this.pending.is_empty() {
            let bufs = [io::IoSlice::new(&this.pending), io::IoSlice::new(buf)];
            let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, &bufs))?;
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            if n < this.pending.len() {
                this.pending.drain(..n);
                continue;
            }
            let of_buf = n - this.pending.len();
            this.pending.clear();
            if of_buf > 0 {
                return Poll::Ready(Ok(of_buf));
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.hold.load(Ordering::Relaxed) || !self.pending.is_empty() {
            // A vectored write may write less than all: the first buffer.
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return self.poll_write(cx, first);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.hold.swap(false, Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_send_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A head whose body never came is not sent (the request was
        // abandoned; an upstream acting on heads alone must not see it).
        self.hold.store(false, Ordering::Relaxed);
        self.pending.clear();
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for HeldHead {
    async fn shutdown(&mut self) {
        // As `poll_shutdown`: an abandoned head is not sent.
        self.hold.store(false, Ordering::Relaxed);
        self.pending.clear();
        Shutdown::shutdown(&mut *self.inner).await
    }
}

impl UniqueID for HeldHead {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeldHead {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora_core::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeldHead {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeldHead {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for HeldHead {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for HeldHead {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }

    fn poll_read_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.inner.poll_read_ready(cx)
    }
}
