//! The HTTP status the gateway answers a failed exchange with.

/// Which side of the exchange failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The worker (connect, TLS, read or write towards it).
    Worker,
    /// The caller (its connection, or a request the gateway cannot serve).
    Caller,
    /// The gateway itself.
    Gateway,
}

/// What kind of failure it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A connect, TLS handshake, read or write did not finish in time.
    Timeout,
    /// The connection broke: a read or write failed, or it was closed.
    Broken,
    /// Anything else (refused connection, a malformed answer, …).
    Other,
    /// The failure names its own status (a policy refusal, a bad request).
    Status(u16),
}

/// The status to answer with, `None` when there is nobody to answer (the
/// caller's connection is gone). A worker that did not answer in time is a
/// gateway timeout (504), as nginx answers it; any other failure of the
/// worker is a bad gateway (502).
pub fn status(side: Side, kind: Kind) -> Option<u16> {
    Some(match (side, kind) {
        (_, Kind::Status(code)) => code,
        (Side::Worker, Kind::Timeout) => 504,
        (Side::Worker, _) => 502,
        (Side::Caller, Kind::Broken) => return None,
        // A caller that stalled or sent what cannot be served.
        (Side::Caller, Kind::Timeout | Kind::Other) => 400,
        (Side::Gateway, _) => 500,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        #[rustfmt::skip]
        let table = [
            (Side::Worker, Kind::Timeout, Some(504)),
            (Side::Worker, Kind::Broken, Some(502)),
            (Side::Worker, Kind::Other, Some(502)),
            (Side::Worker, Kind::Status(413), Some(413)),
            (Side::Caller, Kind::Broken, None),
            (Side::Caller, Kind::Timeout, Some(400)),
            (Side::Caller, Kind::Other, Some(400)),
            (Side::Caller, Kind::Status(400), Some(400)),
            (Side::Gateway, Kind::Other, Some(500)),
            (Side::Gateway, Kind::Timeout, Some(500)),
        ];
        for (side, kind, want) in table {
            assert_eq!(status(side, kind), want, "{side:?} {kind:?}");
        }
    }
}
