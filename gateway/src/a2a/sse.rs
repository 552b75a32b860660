//! An incremental, bounded SSE (`text/event-stream`) parser.
//!
//! Chunks from the worker are not aligned to events or even lines. The parser
//! keeps at most one partial line and one event's `data` between chunks, and
//! never more than its limit: an over-long line or event is dropped from
//! *tracking* (the bytes themselves always pass through to the caller
//! untouched: the proxy only reads them) and counted.

/// What the parser found that the caller of [`SseParser::feed`] cares about.
#[derive(Debug, PartialEq, Eq)]
pub enum SseItem<'a> {
    /// The `data` of one complete event (multi-line data joined with `\n`),
    /// with the event's `event:` field if it had one.
    Event {
        event: Option<&'a [u8]>,
        data: &'a [u8],
        /// Offset in the chunk being fed just past the blank line that
        /// ended the event: where a filter that edits events may cut.
        end: usize,
    },
    /// A line or event over the limit was skipped.
    Overlong,
}

/// Incremental SSE parser; one per streamed response.
#[derive(Debug)]
pub struct SseParser {
    limit: usize,
    /// The current, incomplete line.
    line: Vec<u8>,
    /// The current event's joined `data` lines.
    data: Vec<u8>,
    has_data: bool,
    /// The current event's `event:` field.
    event: Vec<u8>,
    /// The line being read is over the limit: skip to its end.
    skipping_line: bool,
    /// The event being read is over the limit: skip to its blank line.
    skipping_event: bool,
    /// The last byte seen was a CR, so an LF right after it ends nothing.
    after_cr: bool,
}

impl SseParser {
    /// A parser that holds at most `limit` bytes of one line and of one event.
    pub fn new(limit: usize) -> Self {
        SseParser {
            limit,
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            event: Vec::new(),
            skipping_line: false,
            skipping_event: false,
            after_cr: false,
        }
    }

    /// Feeds one chunk; `on_item` is called for each complete event (and each
    /// skipped over-long one), in order. Returns the offset just past the
    /// chunk's last blank line (an event boundary, keep-alives included), if
    /// it has one.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        mut on_item: impl FnMut(SseItem<'_>),
    ) -> Option<usize> {
        if chunk.is_empty() {
            return None;
        }
        let total = chunk.len();
        let mut boundary = None;
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while !chunk.is_empty() {
            let Some(end) = memchr2(b'\n', b'\r', chunk) else {
                self.push_partial(chunk, &mut on_item);
                return boundary;
            };
            let (piece, rest) = chunk.split_at(end);
            let mut skip = 1;
            if rest[0] == b'\r' {
                match rest.get(1) {
                    Some(b'\n') => skip = 2,
                    None => self.after_cr = true,
                    _ => {}
                }
            }
            chunk = &rest[skip..];
            let at = total - chunk.len();
            if piece.is_empty() && self.line.is_empty() && !self.skipping_line {
                boundary = Some(at);
            }
            if self.skipping_line {
                self.skipping_line = false;
                self.line.clear();
                continue;
            }
            if self.line.is_empty() {
                // A whole line in one chunk obeys the same limit as one that
                // was buffered across chunks (found by the fuzzer).
                if piece.len() > self.limit {
                    self.overlong(&mut on_item);
                } else if let Some((data, blank)) = self.lone_data_line(piece, chunk) {
                    // The usual event, one `data` line and its blank line in
                    // this chunk, is handed on from the chunk: no copy, and
                    // no buffer kept for the stream's life.
                    let end = at + blank;
                    let event = (!self.event.is_empty()).then_some(self.event.as_slice());
                    on_item(SseItem::Event { event, data, end });
                    self.event.clear();
                    // A CR that ends the chunk may be half a CRLF, as below.
                    self.after_cr = chunk == b"\r";
                    chunk = &chunk[blank..];
                    boundary = Some(end);
                } else {
                    self.line_done(piece, at, &mut on_item);
                }
            } else if self.line.len() + piece.len() > self.limit {
                self.line.clear();
                self.overlong(&mut on_item);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(piece);
                self.line_done(&line, at, &mut on_item);
                line.clear();
                self.line = line;
            }
        }
        boundary
    }

    /// When `line` is the one `data` line of an event and a blank line comes
    /// right after it in `rest`: its value, and the length of that blank line.
    fn lone_data_line<'a>(&self, line: &'a [u8], rest: &[u8]) -> Option<(&'a [u8], usize)> {
        if self.has_data || self.skipping_event {
            return None;
        }
        let blank = match rest {
            [b'\n', ..] => 1,
            [b'\r', b'\n', ..] => 2,
            [b'\r', ..] => 1,
            _ => return None,
        };
        match field_value(line) {
            Some((b"data", value)) if value.len() < self.limit => Some((value, blank)),
            _ => None,
        }
    }

    fn push_partial(&mut self, piece: &[u8], on_item: &mut impl FnMut(SseItem<'_>)) {
        if self.skipping_line {
            return;
        }
        if self.line.len() + piece.len() > self.limit {
            self.line.clear();
            self.skipping_line = true;
            self.overlong(on_item);
        } else {
            self.line.extend_from_slice(piece);
        }
    }

    fn overlong(&mut self, on_item: &mut impl FnMut(SseItem<'_>)) {
        if !self.skipping_event {
            self.skipping_event = true;
            on_item(SseItem::Overlong);
        }
        self.data.clear();
        self.has_data = false;
    }

    fn line_done(&mut self, line: &[u8], end: usize, on_item: &mut impl FnMut(SseItem<'_>)) {
        if line.is_empty() {
            // Dispatch.
            if self.skipping_event {
                self.skipping_event = false;
            } else if self.has_data {
                let event = (!self.event.is_empty()).then_some(self.event.as_slice());
                on_item(SseItem::Event {
                    event,
                    data: &self.data,
                    end,
                });
            }
            self.data.clear();
            self.event.clear();
            self.has_data = false;
            return;
        }
        if self.skipping_event {
            return;
        }
        let Some((field, value)) = field_value(line) else {
            return; // comment, e.g. keep-alive
        };
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > self.limit {
                    self.overlong(on_item);
                    return;
                }
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(&value[..value.len().min(64)]);
            }
            _ => {}
        }
    }
}

/// A line's field and value (one leading space dropped); `None` for a
/// comment (a line starting with `:`, e.g. a keep-alive).
fn field_value(line: &[u8]) -> Option<(&[u8], &[u8])> {
    match line.iter().position(|&b| b == b':') {
        Some(0) => None,
        Some(i) => {
            let v = &line[i + 1..];
            Some((&line[..i], v.strip_prefix(b" ").unwrap_or(v)))
        }
        None => Some((line, &b""[..])),
    }
}

/// The first LF or CR (SIMD-accelerated: this runs over every streamed byte).
fn memchr2(a: u8, b: u8, hay: &[u8]) -> Option<usize> {
    memchr::memchr2(a, b, hay)
}

/// Whether an answer's `Content-Type` is `text/event-stream` (any case,
/// parameters allowed).
pub fn is_event_stream(headers: &http::HeaderMap) -> bool {
    super::content_type_starts_with(headers, "text/event-stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_and_ends() {
        let mut p = SseParser::new(1024);
        let mut ends = Vec::new();
        let chunk = b"data: a\n\n: ping\n\ndata: b\r\n\r\ndata: c";
        let last = p.feed(chunk, |item| {
            if let SseItem::Event { end, .. } = item {
                ends.push(end);
            }
        });
        assert_eq!(ends, vec![9, 28]);
        assert_eq!(&chunk[..9], b"data: a\n\n");
        assert_eq!(last, Some(28));
        ends.clear();
        assert_eq!(p.feed(b"\n", |_| {}), None);
        let last = p.feed(b"\ndata: d\n", |item| {
            if let SseItem::Event { end, .. } = item {
                ends.push(end);
            }
        });
        assert_eq!((ends, last), (vec![1], Some(1)));
    }

    #[derive(Debug, PartialEq)]
    enum Got {
        Ev(Option<String>, String),
        Overlong,
    }

    fn run(limit: usize, chunks: &[&[u8]]) -> Vec<Got> {
        let mut p = SseParser::new(limit);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |item| {
                out.push(match item {
                    SseItem::Event { event, data, .. } => Got::Ev(
                        event.map(|e| String::from_utf8_lossy(e).into_owned()),
                        String::from_utf8_lossy(data).into_owned(),
                    ),
                    SseItem::Overlong => Got::Overlong,
                })
            });
        }
        out
    }

    fn ev(data: &str) -> Got {
        Got::Ev(None, data.to_string())
    }

    #[test]
    fn framing_table() {
        let table: Vec<(&str, &[u8], Vec<Got>)> = vec![
            ("lf", b"data: a\n\n", vec![ev("a")]),
            ("crlf", b"data: a\r\n\r\n", vec![ev("a")]),
            ("cr", b"data: a\r\r", vec![ev("a")]),
            ("no space", b"data:a\n\n", vec![ev("a")]),
            ("multi-line data", b"data: a\ndata: b\n\n", vec![ev("a\nb")]),
            (
                "id and event",
                b"id: 7\nevent: message\ndata: x\n\n",
                vec![Got::Ev(Some("message".into()), "x".into())],
            ),
            ("comment only", b": keep-alive\n\n", vec![]),
            (
                "comment between",
                b"data: a\n: ping\n\ndata: b\n\n",
                vec![ev("a"), ev("b")],
            ),
            ("no trailing blank", b"data: a\n", vec![]),
            (
                "two events",
                b"data: 1\n\ndata: 2\n\n",
                vec![ev("1"), ev("2")],
            ),
            ("empty data", b"data\n\n", vec![ev("")]),
        ];
        for (name, input, want) in table {
            assert_eq!(run(1024, &[input]), want, "{name}");
        }
    }

    #[test]
    fn every_split_gives_the_same_events() {
        let input: &[u8] = b"id: 1\r\nevent: message\r\ndata: {\"a\":1}\r\n\r\n: ping\r\n\r\ndata: x\ndata: y\n\ndata: z\r\r";
        let whole = run(1024, &[input]);
        assert_eq!(whole.len(), 3);
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let got = run(1024, &[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn overlong_line_is_skipped_and_counted_once() {
        let long = format!("data: {}\n\ndata: ok\n\n", "x".repeat(100));
        assert_eq!(run(32, &[long.as_bytes()]), vec![Got::Overlong, ev("ok")]);
        // The same, byte by byte: the parser never holds more than the limit.
        let bytes: Vec<&[u8]> = long.as_bytes().chunks(1).collect();
        assert_eq!(run(32, &bytes), vec![Got::Overlong, ev("ok")]);
    }

    #[test]
    fn overlong_line_whole_or_split_is_the_same() {
        // The fuzzer's case: an over-long comment line between two data lines.
        let input = format!("data: a\n:{}\ndata: b\n\n", "x".repeat(300));
        let whole = run(256, &[input.as_bytes()]);
        assert_eq!(whole, vec![Got::Overlong]);
        for i in 0..=input.len() {
            let (a, b) = input.as_bytes().split_at(i);
            assert_eq!(run(256, &[a, b]), whole, "split at {i}");
        }
    }

    #[test]
    fn overlong_event_of_short_lines() {
        let mut s = String::new();
        for _ in 0..10 {
            s.push_str("data: 0123456789\n");
        }
        s.push_str("\ndata: ok\n\n");
        assert_eq!(run(64, &[s.as_bytes()]), vec![Got::Overlong, ev("ok")]);
    }

    #[test]
    fn a_lone_data_line_event_is_handed_on_without_a_copy() {
        // What A2A workers send: one `data` line per event.
        let inputs: [&[u8]; 4] = [
            b"event: message\ndata: {\"a\":1}\n\n",
            b"data: {\"a\":1}\r\n\r\n",
            b"data: {\"a\":1}\r\r",
            b"data: {\"a\":1}\n\ndata: {\"a\":1}\n\n",
        ];
        for input in inputs {
            let mut p = SseParser::new(1024);
            let mut got = Vec::new();
            let last = p.feed(input, |item| {
                if let SseItem::Event { data, end, .. } = item {
                    got.push((data.to_vec(), end));
                }
            });
            let ends: Vec<usize> = got.iter().map(|(_, end)| *end).collect();
            assert!(got.iter().all(|(data, _)| data == b"{\"a\":1}"));
            assert_eq!(ends.last().copied(), Some(input.len()));
            assert_eq!(last, Some(input.len()));
            assert_eq!(p.data.capacity(), 0, "no event buffer kept");
        }
        // A CR that ends the chunk ends the event there, and an LF that
        // starts the next chunk is the rest of its CRLF.
        let mut p = SseParser::new(1024);
        let mut n = 0;
        assert_eq!(p.feed(b"data: a\n\r", |_| n += 1), Some(9));
        assert_eq!(n, 1);
        assert_eq!(p.feed(b"\ndata: b\n\n", |_| n += 1), Some(10));
        assert_eq!(n, 2);
        assert_eq!(p.data.capacity(), 0);
    }

    #[test]
    fn memory_stays_bounded() {
        let mut p = SseParser::new(64);
        let junk = vec![b'x'; 10_000];
        for _ in 0..100 {
            p.feed(&junk, |_| {});
        }
        assert!(
            p.line.capacity() <= 128,
            "line grew to {}",
            p.line.capacity()
        );
        assert!(p.data.capacity() <= 128);
    }
}
