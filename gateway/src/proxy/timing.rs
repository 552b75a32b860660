//! Splitting a request's time between the proxy and the worker behind it,
//! for `a2agw_proxy_seconds`, and the worker's time to first byte
//! (`a2agw_worker_ttfb_seconds`) with the status it answered.
//!
//! End to end, a caller's latency is mostly the worker's, and a worker that
//! stalls for 50 ms hides anything the gateway adds. The moments kept here
//! take the worker's part out: what is left is what the gateway itself
//! (pingora included) held the request for, on the caller's side of the
//! worker and on the way back. Bytes waiting in a socket for pingora to read
//! them are not in it: the marks start at the heads pingora has read. The
//! benches time their bare pingora pass-through with the same type, so the
//! two compare like for like.

use std::time::{Duration, Instant};

use pingora::http::ResponseHeader;
use pingora::Error;

/// The moments of one request that its time in the proxy is taken from,
/// marked from the `ProxyHttp` hooks named on each method.
#[derive(Debug, Default)]
pub struct ProxyTimes {
    head: Option<Instant>,
    upstream: Option<Instant>,
    answer: Option<Instant>,
    /// From `upstream` to the worker's first answer head.
    ttfb: Option<Duration>,
    /// The status of the worker's last answer head.
    worker_status: Option<u16>,
}

impl ProxyTimes {
    /// The caller's request head was read: call first in `request_filter`.
    pub fn head(&mut self) {
        self.head = Some(Instant::now());
    }

    /// The worker connection is ready to take the request: call first in
    /// `upstream_request_filter` (again when pingora retries; the last
    /// counts, so a failed first connection is the proxy's time).
    pub fn upstream(&mut self) {
        self.upstream = Some(Instant::now());
        self.ttfb = None;
    }

    /// The worker's answer head arrived: call first in `response_filter`.
    /// A stream (SSE) or an upgrade is not marked: its time after the head
    /// is the stream's, not the proxy's.
    ///
    /// Every answer head also marks the worker's time to first byte (the
    /// first head after the last `upstream` mark) and its status.
    pub fn answer(&mut self, resp: &ResponseHeader) {
        let now = Instant::now();
        let status = resp.status.as_u16();
        if self.ttfb.is_none() {
            self.ttfb = self.upstream.map(|u| now.saturating_duration_since(u));
        }
        self.worker_status = Some(status);
        if status != 101 && !crate::a2a::sse::is_event_stream(&resp.headers) {
            self.answer = Some(now);
        }
    }

    /// The worker's time to first byte: from its connection taking the
    /// request (`upstream`) to its answer head. `None` when no worker answer
    /// head came (refused by the gateway, failed before it).
    pub fn worker_ttfb(&self) -> Option<Duration> {
        self.ttfb
    }

    /// The status of the worker's last answer head, if one came (not what
    /// the caller got: a failure after it is not in it).
    pub fn worker_status(&self) -> Option<u16> {
        self.worker_status
    }

    /// Time since the caller's request head was read (`None` before it).
    pub fn since_head(&self) -> Option<Duration> {
        self.head.map(|h| h.elapsed())
    }

    /// The proxy's own part of a request ending now (`logging`): from its
    /// head to the worker taking it, plus from the worker's answer head to
    /// the answer written to the caller. `None` for a request that failed
    /// (`error`), that the worker never answered (refused, answered by the
    /// proxy itself), or that streamed.
    pub fn own(&self, error: Option<&Error>) -> Option<Duration> {
        if error.is_some() {
            return None;
        }
        let (head, upstream, answer) = (self.head?, self.upstream?, self.answer?);
        Some(upstream.saturating_duration_since(head) + answer.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, content_type: Option<&str>) -> ResponseHeader {
        let mut r = ResponseHeader::build(status, None).unwrap();
        if let Some(ct) = content_type {
            r.insert_header("content-type", ct).unwrap();
        }
        r
    }

    #[test]
    fn counts_only_answered_non_streaming_requests() {
        let json = resp(200, Some("application/json"));
        let sse = resp(200, Some("text/event-stream; charset=utf-8"));
        let upgrade = resp(101, None);
        let failed = Error::new(pingora::ErrorType::ConnectRefused);
        // (marks: head, upstream, answer; the answer; error) → counted?
        let cases: [(bool, bool, &ResponseHeader, Option<&Error>, bool); 7] = [
            (true, true, &json, None, true),
            (true, true, &resp(404, None), None, true),
            (true, true, &sse, None, false),
            (true, true, &upgrade, None, false),
            (true, true, &json, Some(&failed), false),
            (true, false, &json, None, false),
            (false, true, &json, None, false),
        ];
        for (i, (head, upstream, answer, error, counted)) in cases.into_iter().enumerate() {
            let mut t = ProxyTimes::default();
            if head {
                t.head();
            }
            if upstream {
                t.upstream();
            }
            t.answer(answer);
            assert_eq!(t.own(error).is_some(), counted, "case {i}");
        }
    }

    #[test]
    fn marks_the_workers_first_byte_and_status() {
        let mut t = ProxyTimes::default();
        t.answer(&resp(200, None));
        assert_eq!(t.worker_ttfb(), None, "no upstream mark: not proxied");
        t.upstream();
        std::thread::sleep(Duration::from_millis(5));
        t.answer(&resp(101, None));
        let first = t.worker_ttfb().unwrap();
        assert!(first >= Duration::from_millis(5), "{first:?}");
        t.answer(&resp(503, None));
        assert_eq!(t.worker_ttfb(), Some(first), "the first head counts");
        assert_eq!(t.worker_status(), Some(503), "the last head's status");
    }

    #[test]
    fn leaves_out_the_time_between_the_worker_taking_the_request_and_answering() {
        let mut t = ProxyTimes::default();
        t.head();
        t.upstream();
        std::thread::sleep(Duration::from_millis(30));
        t.answer(&resp(200, Some("application/json")));
        let own = t.own(None).unwrap();
        assert!(own < Duration::from_millis(30), "{own:?}");
    }
}
