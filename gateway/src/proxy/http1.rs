//! HTTP/1 conformance the gateway sees to in its own hooks, on top of what
//! pingora's request reader already does (see `docs/behaviour.md`, "HTTP/1
//! conformance"):
//!
//! - an HTTP/1.1 request without `Host` is refused with 400 (RFC 9112,
//!   section 3.2); pingora refuses two `Host`s, one with userinfo, or one
//!   that differs from an absolute-form target, but passes none at all;
//! - a `Content-Length` given as a list of equal values (`5, 5`, or the same
//!   value on two lines), which pingora accepts, is collapsed to one value
//!   before the worker sees it (RFC 9110, section 8.6); unequal values are
//!   refused by pingora before any hook runs;
//! - pipelined requests are served in order (pingora's per-session opt-in),
//!   rather than dropped after the first answer, whose head would have said
//!   `keep-alive` (pingora decides not to reuse the connection only after
//!   the answer is written).

use http::header::{CONTENT_LENGTH, HOST};
use http::{HeaderValue, Version};
use pingora::http::RequestHeader;
use pingora::proxy::Session;

/// Why a request head is refused before it is routed to a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http1Fault {
    /// An HTTP/1.1 request without a `Host` header.
    MissingHost,
    /// `Content-Length` values that differ or are not numbers (pingora
    /// refuses these first; kept so that the gateway never forwards a list
    /// it could not collapse).
    ContentLength,
}

/// Applies the gateway's HTTP/1 rules to the request head: turns pipelining
/// on for the caller's connection, collapses a `Content-Length` list, and
/// says whether the head must be refused.
pub fn conform(session: &mut Session) -> Result<(), Http1Fault> {
    // Serve requests the caller pipelined, one after another (a no-op on
    // HTTP/2). Carried to the connection's next requests by pingora.
    session.set_pipelining_enabled(true);
    let req = session.req_header_mut();
    collapse_content_length(req)?;
    missing_host(req)
}

/// RFC 9112, section 3.2: "A server MUST respond with a 400 (Bad Request)
/// status code to any HTTP/1.1 request message that lacks a Host header
/// field". HTTP/1.0 requests may lack it; HTTP/2 carries `:authority`.
fn missing_host(req: &RequestHeader) -> Result<(), Http1Fault> {
    if req.version == Version::HTTP_11 && !req.headers.contains_key(HOST) {
        return Err(Http1Fault::MissingHost);
    }
    Ok(())
}

/// A `Content-Length` given as more than one value (a comma-separated list,
/// or more than one line) becomes one line with the value, if every value
/// is the same number; otherwise the request is refused. A single value is
/// left as it was sent.
fn collapse_content_length(req: &mut RequestHeader) -> Result<(), Http1Fault> {
    let mut lines = req.headers.get_all(CONTENT_LENGTH).iter();
    let Some(first) = lines.next() else {
        return Ok(());
    };
    if lines.next().is_none() && !first.as_bytes().contains(&b',') {
        return Ok(());
    }
    let n = one_length(
        req.headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .map(|v| v.as_bytes()),
    )
    .ok_or(Http1Fault::ContentLength)?;
    req.insert_header(CONTENT_LENGTH, HeaderValue::from(n))
        .map_err(|_| Http1Fault::ContentLength)?;
    Ok(())
}

/// The one number every comma-separated element of `lines` spells (digits
/// only, around optional whitespace, as pingora reads them), or `None`.
fn one_length<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Option<u64> {
    let mut found = None;
    for line in lines {
        for element in line.split(|b| *b == b',') {
            let digits = element.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            match found {
                Some(m) if m != n => return None,
                _ => found = Some(n),
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(version: Version, headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/", None).unwrap();
        req.set_version(version);
        for (k, v) in headers {
            req.append_header(k.to_string(), *v).unwrap();
        }
        req
    }

    fn lengths(req: &RequestHeader) -> Vec<&str> {
        req.headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn equal_lengths_become_one() {
        #[rustfmt::skip]
        let cases: [&[(&str, &str)]; 4] = [
            &[("content-length", "5, 5")],
            &[("content-length", "5,5,5")],
            &[("content-length", "5"), ("content-length", "5")],
            &[("content-length", " 05 ,\t5"), ("content-length", "5")],
        ];
        for headers in cases {
            let mut req = head(Version::HTTP_11, headers);
            assert_eq!(collapse_content_length(&mut req), Ok(()), "{headers:?}");
            assert_eq!(lengths(&req), ["5"], "{headers:?}");
        }
    }

    #[test]
    fn one_length_is_left_as_sent() {
        for v in ["5", "05"] {
            let mut req = head(Version::HTTP_11, &[("content-length", v)]);
            assert_eq!(collapse_content_length(&mut req), Ok(()));
            assert_eq!(lengths(&req), [v]);
        }
        let mut req = head(Version::HTTP_11, &[]);
        assert_eq!(collapse_content_length(&mut req), Ok(()));
        assert!(lengths(&req).is_empty());
    }

    #[test]
    fn unequal_or_unreadable_lengths_are_refused() {
        #[rustfmt::skip]
        let cases: [&[(&str, &str)]; 5] = [
            &[("content-length", "5, 6")],
            &[("content-length", "5"), ("content-length", "6")],
            &[("content-length", "5, ")],
            &[("content-length", "5, +5")],
            &[("content-length", "5, 99999999999999999999999")],
        ];
        for headers in cases {
            let mut req = head(Version::HTTP_11, headers);
            assert_eq!(
                collapse_content_length(&mut req),
                Err(Http1Fault::ContentLength),
                "{headers:?}"
            );
        }
    }

    #[test]
    fn host_is_required_of_http_1_1_only() {
        let none: &[(&str, &str)] = &[];
        assert_eq!(
            missing_host(&head(Version::HTTP_11, none)),
            Err(Http1Fault::MissingHost)
        );
        assert_eq!(missing_host(&head(Version::HTTP_10, none)), Ok(()));
        assert_eq!(missing_host(&head(Version::HTTP_2, none)), Ok(()));
        // An empty Host is allowed (a target without an authority).
        assert_eq!(
            missing_host(&head(Version::HTTP_11, &[("host", "")])),
            Ok(())
        );
    }
}
