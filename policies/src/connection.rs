//! How the gateway's calls to a worker share HTTP/2 connections.
//!
//! pingora gives every call to an HTTP/2 upstream a connection of its own
//! unless told otherwise. For unary gRPC calls that costs both ends a
//! connection's worth of reads, writes and wake-ups per call; sharing one
//! connection among the calls in flight is what gRPC clients do, and what a
//! gRPC worker expects. Streaming calls keep a connection each: their
//! events flow for as long as the task runs, and each keeps its own
//! reader, flow and failure.
//!
//! A shared connection must not let one call hold up the others: HTTP/2
//! flow control gives each stream a receive window and the connection one
//! more, and a call whose caller reads slowly leaves its stream's window
//! unread. The connection's window is therefore every stream's window
//! together, so that what one stream holds never starves the rest (the
//! memory this allows is what as many connections of one stream each
//! would allow).

/// The receive window of one call's stream on a connection to a worker
/// (pingora's default, 8 MiB).
pub const STREAM_WINDOW: u32 = 8 << 20;

/// The largest window HTTP/2 allows (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// How one call's connection to its worker is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2Sharing {
    /// Calls that may share the connection at once.
    pub streams: usize,
    /// The connection's receive window.
    pub connection_window: u32,
}

/// The sharing for an HTTP/2 call whose answer is a stream (`Some(true)`),
/// a single message (`Some(false)`), or is not known (`None`: a method the
/// gateway does not name): only unary calls share, up to `limit`
/// (`limits.worker_h2_streams`) at once.
pub fn h2_sharing(streaming: Option<bool>, limit: usize) -> H2Sharing {
    let streams = match streaming {
        Some(false) => limit.max(1),
        Some(true) | None => 1,
    };
    let window = (streams as u64 * u64::from(STREAM_WINDOW)).min(u64::from(MAX_WINDOW));
    H2Sharing {
        streams,
        connection_window: window as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unary_calls_share_and_the_window_covers_every_stream() {
        let table: &[(Option<bool>, usize, usize, u32)] = &[
            (Some(false), 100, 100, 100 * STREAM_WINDOW),
            (Some(false), 1, 1, STREAM_WINDOW),
            // A limit of none is one.
            (Some(false), 0, 1, STREAM_WINDOW),
            // Past 255 streams of 8 MiB the window is HTTP/2's largest.
            (Some(false), 255, 255, 255 * STREAM_WINDOW),
            (Some(false), 256, 256, MAX_WINDOW),
            (Some(false), 1000, 1000, MAX_WINDOW),
            (Some(true), 100, 1, STREAM_WINDOW),
            (None, 100, 1, STREAM_WINDOW),
        ];
        for &(streaming, limit, streams, window) in table {
            assert_eq!(
                h2_sharing(streaming, limit),
                H2Sharing {
                    streams,
                    connection_window: window
                },
                "{streaming:?} {limit}"
            );
        }
    }
}
