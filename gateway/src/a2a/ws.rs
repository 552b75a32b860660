//! An incremental, bounded WebSocket (RFC 6455) frame reader.
//!
//! After a `101 Switching Protocols` the proxy copies the raw bytes of both
//! directions unchanged; a [`WsParser`] per direction reads along. The
//! a2a-rust WebSocket binding sends one JSON-RPC 2.0 message per text
//! message (client→worker frames masked, worker→client not), so what the
//! caller wants is each complete text message, unmasked and reassembled.
//!
//! Chunks are not aligned to frames, headers or even masking keys. Between
//! chunks the parser keeps at most one frame header (14 bytes, in a fixed
//! array) and one text message's payload, never more than its limit: a
//! message over the limit is skipped frame by frame, not buffered, and
//! counted once. The common case, a whole unfragmented unmasked text frame
//! inside one chunk, is handed out as a slice of the chunk, with no copy.
//! Once the stream stops being valid WebSocket framing the parser says so
//! once and reads nothing more of that direction.

/// What the parser found that the caller of [`WsParser::feed`] cares about,
/// as the parser hands it out: the text borrowed from the chunk or the
/// parser's buffer, valid during the callback.
pub type WsItem<'a> = Item<&'a [u8]>;

/// A [`WsItem`] that owns its text, to keep it past the callback (tests,
/// fuzzing, tools).
pub type OwnedWsItem = Item<Vec<u8>>;

/// One thing read from a direction of a WebSocket; `T` holds a text
/// message ([`WsItem`], [`OwnedWsItem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<T> {
    /// A complete text message (fragments reassembled, unmasked).
    Text(T),
    /// A complete binary message (not A2A; counted, not read, whatever its
    /// size).
    Binary,
    /// A close frame, with its status code when it has one.
    Close(Option<u16>),
    /// A ping frame.
    Ping,
    /// A pong frame.
    Pong,
    /// A text message over the limit was skipped (its frames still pass
    /// through); counted once per message, when its size first passes the
    /// limit.
    Overlong,
    /// A compressed (RSV1) message: permessage-deflate was negotiated
    /// although the gateway declines it; skipped. Counted once, at its first
    /// frame.
    Compressed,
    /// The stream is not valid WebSocket framing (bad opcode, reserved bits,
    /// control frame over 125 bytes or fragmented, continuation without a
    /// start, …): the parser stops reading this direction for good (yields
    /// this once).
    Invalid(&'static str),
}

impl WsItem<'_> {
    /// The same item, owning its text.
    pub fn to_owned_item(self) -> OwnedWsItem {
        match self {
            Item::Text(t) => Item::Text(t.to_vec()),
            Item::Binary => Item::Binary,
            Item::Close(c) => Item::Close(c),
            Item::Ping => Item::Ping,
            Item::Pong => Item::Pong,
            Item::Overlong => Item::Overlong,
            Item::Compressed => Item::Compressed,
            Item::Invalid(why) => Item::Invalid(why),
        }
    }
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// The longest frame header: 2 bytes, a 64-bit length, a masking key.
const MAX_HEADER: usize = 14;

/// One parsed frame header.
#[derive(Debug, Clone, Copy)]
struct Header {
    fin: bool,
    rsv1: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    len: u64,
}

#[derive(Debug)]
enum HeaderParse {
    /// The header is `n` bytes long (as far as can be told yet) and the
    /// bytes at hand are fewer.
    Need(usize),
    /// A header of that many bytes.
    Done(Header, usize),
    Invalid(&'static str),
}

/// Reads a frame header from the start of `b`, checking everything that the
/// header alone decides.
fn parse_header(b: &[u8]) -> HeaderParse {
    let (Some(&b0), Some(&b1)) = (b.first(), b.get(1)) else {
        return HeaderParse::Need(2);
    };
    let fin = b0 & 0x80 != 0;
    let rsv1 = b0 & 0x40 != 0;
    let opcode = b0 & 0x0F;
    if b0 & 0x30 != 0 {
        return HeaderParse::Invalid("reserved bit RSV2 or RSV3 set");
    }
    let control = opcode & 0x08 != 0;
    match opcode {
        OP_CONTINUATION | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG => {}
        _ => return HeaderParse::Invalid("reserved opcode"),
    }
    if control && !fin {
        return HeaderParse::Invalid("fragmented control frame");
    }
    if control && rsv1 {
        return HeaderParse::Invalid("RSV1 set on a control frame");
    }
    if rsv1 && opcode == OP_CONTINUATION {
        return HeaderParse::Invalid("RSV1 set on a continuation frame");
    }
    let masked = b1 & 0x80 != 0;
    let len7 = b1 & 0x7F;
    if control && len7 > 125 {
        return HeaderParse::Invalid("control frame over 125 bytes");
    }
    if opcode == OP_CLOSE && len7 == 1 {
        return HeaderParse::Invalid("close frame with a 1-byte payload");
    }
    let ext = match len7 {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let total = 2 + ext + if masked { 4 } else { 0 };
    let Some(rest) = b.get(2..total) else {
        return HeaderParse::Need(total);
    };
    let (ext_bytes, key) = rest.split_at(ext);
    let len = match ext_bytes {
        [a, b] => u64::from(u16::from_be_bytes([*a, *b])),
        [a, b, c, d, e, f, g, h] => {
            let len = u64::from_be_bytes([*a, *b, *c, *d, *e, *f, *g, *h]);
            if len >> 63 != 0 {
                return HeaderParse::Invalid("64-bit payload length with the top bit set");
            }
            len
        }
        _ => u64::from(len7),
    };
    let mask = match key {
        [a, b, c, d] => Some([*a, *b, *c, *d]),
        _ => None,
    };
    HeaderParse::Done(
        Header {
            fin,
            rsv1,
            opcode,
            mask,
            len,
        },
        total,
    )
}

/// The data message in progress, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    /// Between messages.
    None,
    /// A text message being collected into `buf`.
    Text,
    /// A binary message: skipped, reported at its end.
    Binary,
    /// An over-long or compressed message: skipped, already reported.
    Skip,
}

/// Where in the byte stream the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a frame header (`head[..head_len]` so far).
    Header,
    /// Reading a frame's payload.
    Payload,
    /// The stream is not WebSocket framing; read no more.
    Stopped,
}

/// Incremental WebSocket frame parser; one per direction of an upgraded
/// connection.
#[derive(Debug)]
pub struct WsParser {
    max_message: usize,
    state: State,
    /// A frame header split across chunks.
    head: [u8; MAX_HEADER],
    head_len: usize,
    /// The frame whose payload is being read.
    frame: Header,
    /// Payload bytes of `frame` still to come.
    remaining: u64,
    /// Payload bytes of `frame` read so far, modulo 4 (the masking key index).
    key_at: usize,
    msg: Msg,
    /// The text message being collected, unmasked; never over `max_message`.
    buf: Vec<u8>,
    /// The first two payload bytes of a control frame (a close's status).
    ctrl: [u8; 2],
    ctrl_len: usize,
}

impl WsParser {
    /// A parser that holds at most `max_message` bytes of one text message.
    pub fn new(max_message: usize) -> Self {
        WsParser {
            max_message,
            state: State::Header,
            head: [0; MAX_HEADER],
            head_len: 0,
            frame: Header {
                fin: true,
                rsv1: false,
                opcode: OP_CONTINUATION,
                mask: None,
                len: 0,
            },
            remaining: 0,
            key_at: 0,
            msg: Msg::None,
            buf: Vec::new(),
            ctrl: [0; 2],
            ctrl_len: 0,
        }
    }

    /// True once the stream turned out not to be WebSocket framing
    /// ([`WsItem::Invalid`] was yielded): later chunks are ignored.
    pub fn is_stopped(&self) -> bool {
        self.state == State::Stopped
    }

    /// Bytes reserved for collecting text messages: at most `max_message`,
    /// whatever is fed (for tests, fuzzing and metrics).
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Feeds one chunk; `on_item` is called for each complete message or
    /// control frame (and each skipped or invalid thing), in order.
    pub fn feed(&mut self, mut chunk: &[u8], mut on_item: impl FnMut(WsItem<'_>)) {
        while !chunk.is_empty() {
            match self.state {
                State::Stopped => return,
                State::Header => chunk = self.read_header(chunk, &mut on_item),
                State::Payload => chunk = self.read_payload(chunk, &mut on_item),
            }
        }
    }

    /// Consumes header bytes from `chunk`; returns the rest.
    fn read_header<'c>(
        &mut self,
        chunk: &'c [u8],
        on_item: &mut impl FnMut(WsItem<'_>),
    ) -> &'c [u8] {
        if self.head_len == 0 {
            // Usual case: the whole header is in this chunk.
            match parse_header(chunk) {
                HeaderParse::Done(h, n) => {
                    let rest = chunk.get(n..).unwrap_or_default();
                    self.begin_frame(h, on_item);
                    return self.payload_if_empty(rest, on_item);
                }
                HeaderParse::Invalid(why) => {
                    self.stop(why, on_item);
                    return &[];
                }
                HeaderParse::Need(_) => {}
            }
        }
        // Collect the header in `head`, a few bytes at a time.
        let mut chunk = chunk;
        loop {
            match parse_header(&self.head[..self.head_len]) {
                HeaderParse::Need(n) => {
                    let take = n.saturating_sub(self.head_len).min(chunk.len());
                    if take == 0 {
                        return chunk;
                    }
                    let (part, rest) = chunk.split_at(take);
                    self.head[self.head_len..self.head_len + take].copy_from_slice(part);
                    self.head_len += take;
                    chunk = rest;
                }
                HeaderParse::Done(h, _) => {
                    self.head_len = 0;
                    self.begin_frame(h, on_item);
                    return self.payload_if_empty(chunk, on_item);
                }
                HeaderParse::Invalid(why) => {
                    self.stop(why, on_item);
                    return &[];
                }
            }
        }
    }

    /// A frame with an empty payload ends at its header, even when no byte
    /// follows in this chunk.
    fn payload_if_empty<'c>(
        &mut self,
        rest: &'c [u8],
        on_item: &mut impl FnMut(WsItem<'_>),
    ) -> &'c [u8] {
        if self.state == State::Payload && self.remaining == 0 {
            self.end_frame(on_item);
        }
        rest
    }

    /// Checks a header against the message in progress and sets up reading
    /// its payload.
    fn begin_frame(&mut self, h: Header, on_item: &mut impl FnMut(WsItem<'_>)) {
        let control = h.opcode & 0x08 != 0;
        if !control {
            match (h.opcode, self.msg) {
                (OP_CONTINUATION, Msg::None) => {
                    return self.stop("continuation frame without a message to continue", on_item)
                }
                (OP_TEXT | OP_BINARY, Msg::Text | Msg::Binary | Msg::Skip) => {
                    return self.stop("new data frame inside a fragmented message", on_item)
                }
                _ => {}
            }
            if h.rsv1 {
                // Only a first frame can carry RSV1 (checked in the header).
                self.msg = Msg::Skip;
                on_item(WsItem::Compressed);
            } else {
                match h.opcode {
                    OP_TEXT => self.msg = Msg::Text,
                    OP_BINARY => self.msg = Msg::Binary,
                    _ => {}
                }
                let fits = (self.buf.len() as u64)
                    .checked_add(h.len)
                    .is_some_and(|n| n <= self.max_message as u64);
                if self.msg == Msg::Text && !fits {
                    self.msg = Msg::Skip;
                    self.buf.clear();
                    on_item(WsItem::Overlong);
                }
            }
        }
        self.frame = h;
        self.remaining = h.len;
        self.key_at = 0;
        self.ctrl_len = 0;
        self.state = State::Payload;
    }

    /// Consumes payload bytes of the current frame from `chunk`; returns the
    /// rest.
    fn read_payload<'c>(
        &mut self,
        chunk: &'c [u8],
        on_item: &mut impl FnMut(WsItem<'_>),
    ) -> &'c [u8] {
        let take = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(chunk.len());
        let (data, rest) = chunk.split_at(take);
        let whole_frame = self.remaining == self.frame.len && take as u64 == self.remaining;
        self.remaining -= take as u64;
        let control = self.frame.opcode & 0x08 != 0;
        if control {
            let room = self.ctrl.len().saturating_sub(self.ctrl_len);
            for (i, &b) in data.iter().take(room).enumerate() {
                let b = b ^ self.key_byte(i);
                if let Some(slot) = self.ctrl.get_mut(self.ctrl_len) {
                    *slot = b;
                    self.ctrl_len += 1;
                }
            }
        } else if self.msg == Msg::Text {
            if whole_frame && self.frame.fin && self.frame.mask.is_none() && self.buf.is_empty() {
                // The whole message is in this chunk as it is: no copy.
                self.msg = Msg::None;
                self.state = State::Header;
                on_item(WsItem::Text(data));
                return rest;
            }
            self.append(data);
        }
        self.key_at = (self.key_at + take) & 3;
        if self.remaining == 0 {
            self.end_frame(on_item);
        }
        rest
    }

    fn key_byte(&self, i: usize) -> u8 {
        match self.frame.mask {
            Some(key) => key[(self.key_at + i) & 3],
            None => 0,
        }
    }

    /// Appends (unmasked) payload of a text frame to `buf`, growing it
    /// without ever reserving past `max_message`.
    fn append(&mut self, data: &[u8]) {
        let start = self.buf.len();
        let need = start + data.len();
        if need > self.buf.capacity() {
            let target = need
                .max(self.buf.capacity().saturating_mul(2))
                .min(self.max_message);
            self.buf.reserve_exact(target.max(need) - start);
        }
        self.buf.extend_from_slice(data);
        if let Some(key) = self.frame.mask {
            let at = self.key_at;
            let key = [
                key[at & 3],
                key[(at + 1) & 3],
                key[(at + 2) & 3],
                key[(at + 3) & 3],
            ];
            let fresh = self.buf.get_mut(start..).unwrap_or_default();
            unmask(fresh, key);
        }
    }

    /// The current frame's payload is all read.
    fn end_frame(&mut self, on_item: &mut impl FnMut(WsItem<'_>)) {
        self.state = State::Header;
        match self.frame.opcode {
            OP_CLOSE => on_item(WsItem::Close(
                (self.ctrl_len == 2).then(|| u16::from_be_bytes(self.ctrl)),
            )),
            OP_PING => on_item(WsItem::Ping),
            OP_PONG => on_item(WsItem::Pong),
            _ if self.frame.fin => {
                match self.msg {
                    Msg::Text => on_item(WsItem::Text(&self.buf)),
                    Msg::Binary => on_item(WsItem::Binary),
                    Msg::Skip | Msg::None => {}
                }
                self.buf.clear();
                self.msg = Msg::None;
            }
            _ => {}
        }
    }

    fn stop(&mut self, why: &'static str, on_item: &mut impl FnMut(WsItem<'_>)) {
        self.state = State::Stopped;
        self.buf = Vec::new();
        self.msg = Msg::None;
        on_item(WsItem::Invalid(why));
    }
}

/// XORs `data` with the masking key, `key[0]` first: eight bytes at a time
/// (the compiler does not vectorise a byte-wise cycle), then the tail.
fn unmask(data: &mut [u8], key: [u8; 4]) {
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut words = data.chunks_exact_mut(8);
    for w in &mut words {
        let v = u64::from_ne_bytes(<[u8; 8]>::try_from(&*w).unwrap_or_default()) ^ wide;
        w.copy_from_slice(&v.to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so the key is back at `key[0]`.
    for (b, k) in words.into_remainder().iter_mut().zip(key.iter().cycle()) {
        *b ^= k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmask_matches_the_bytewise_definition() {
        let key = [0x12, 0x34, 0x56, 0x78];
        for len in [0, 1, 3, 4, 7, 8, 9, 15, 16, 17, 100] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut fast = data.clone();
            unmask(&mut fast, key);
            let slow: Vec<u8> = data
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect();
            assert_eq!(fast, slow, "len {len}");
        }
    }

    type Got = OwnedWsItem;

    fn got(item: WsItem<'_>) -> Got {
        item.to_owned_item()
    }

    fn run_with(p: &mut WsParser, chunks: &[&[u8]]) -> Vec<Got> {
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |item| out.push(got(item)));
        }
        out
    }

    fn run(max: usize, chunks: &[&[u8]]) -> Vec<Got> {
        run_with(&mut WsParser::new(max), chunks)
    }

    fn text(s: &str) -> Got {
        Got::Text(s.as_bytes().to_vec())
    }

    const FIN: u8 = 0x80;
    const RSV1: u8 = 0x40;
    const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// How to write the payload length.
    #[derive(Clone, Copy)]
    enum Len {
        /// The shortest form, as RFC 6455 asks.
        Min,
        /// Always the 16-bit form.
        L16,
        /// Always the 64-bit form.
        L64,
    }

    /// One frame: `b0` is FIN | RSV | opcode.
    fn frame_len(b0: u8, mask: Option<[u8; 4]>, payload: &[u8], form: Len) -> Vec<u8> {
        let m = if mask.is_some() { 0x80 } else { 0 };
        let mut f = vec![b0];
        let n = payload.len();
        match form {
            Len::Min if n < 126 => f.push(m | n as u8),
            Len::Min if n <= 0xFFFF => {
                f.push(m | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            Len::L16 => {
                f.push(m | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            Len::Min | Len::L64 => {
                f.push(m | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        match mask {
            Some(key) => {
                f.extend_from_slice(&key);
                f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
            }
            None => f.extend_from_slice(payload),
        }
        f
    }

    fn frame(b0: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
        frame_len(b0, mask, payload, Len::Min)
    }

    fn cat(frames: &[Vec<u8>]) -> Vec<u8> {
        frames.concat()
    }

    #[test]
    fn frame_kinds_table() {
        let long = "x".repeat(300);
        let longer = "y".repeat(70_000);
        let table: Vec<(&str, Vec<u8>, Vec<Got>)> = vec![
            (
                "text",
                frame(FIN | OP_TEXT, None, b"{\"a\":1}"),
                vec![text("{\"a\":1}")],
            ),
            (
                "masked text",
                frame(FIN | OP_TEXT, Some(KEY), b"{\"a\":1}"),
                vec![text("{\"a\":1}")],
            ),
            (
                "empty text",
                frame(FIN | OP_TEXT, None, b""),
                vec![text("")],
            ),
            (
                "empty masked text",
                frame(FIN | OP_TEXT, Some(KEY), b""),
                vec![text("")],
            ),
            (
                "16-bit length",
                frame(FIN | OP_TEXT, Some(KEY), long.as_bytes()),
                vec![text(&long)],
            ),
            (
                "64-bit length",
                frame(FIN | OP_TEXT, None, longer.as_bytes()),
                vec![text(&longer)],
            ),
            (
                "non-minimal 16-bit length",
                frame_len(FIN | OP_TEXT, None, b"hi", Len::L16),
                vec![text("hi")],
            ),
            (
                "non-minimal 64-bit length, masked",
                frame_len(FIN | OP_TEXT, Some(KEY), b"hi", Len::L64),
                vec![text("hi")],
            ),
            (
                "binary",
                frame(FIN | OP_BINARY, None, b"\x00\xff"),
                vec![Got::Binary],
            ),
            (
                "masked binary",
                frame(FIN | OP_BINARY, Some(KEY), b"\x00\xff"),
                vec![Got::Binary],
            ),
            (
                "big binary is not over any limit",
                frame(FIN | OP_BINARY, None, longer.as_bytes()),
                vec![Got::Binary],
            ),
            (
                "close, no code",
                frame(FIN | OP_CLOSE, None, b""),
                vec![Got::Close(None)],
            ),
            (
                "close 1000",
                frame(FIN | OP_CLOSE, None, &1000u16.to_be_bytes()),
                vec![Got::Close(Some(1000))],
            ),
            (
                "masked close 1001 with reason",
                frame(FIN | OP_CLOSE, Some(KEY), b"\x03\xe9going away"),
                vec![Got::Close(Some(1001))],
            ),
            ("ping", frame(FIN | OP_PING, None, b""), vec![Got::Ping]),
            (
                "masked ping with payload",
                frame(FIN | OP_PING, Some(KEY), &[7; 125]),
                vec![Got::Ping],
            ),
            (
                "pong",
                frame(FIN | OP_PONG, Some(KEY), b"p"),
                vec![Got::Pong],
            ),
            (
                "fragmented text",
                cat(&[
                    frame(OP_TEXT, None, b"{\"a\""),
                    frame(OP_CONTINUATION, None, b":"),
                    frame(FIN | OP_CONTINUATION, None, b"1}"),
                ]),
                vec![text("{\"a\":1}")],
            ),
            (
                "fragmented masked text with control frames between",
                cat(&[
                    frame(OP_TEXT, Some(KEY), b"{\"a\""),
                    frame(FIN | OP_PING, Some([1, 2, 3, 4]), b"ping"),
                    frame(OP_CONTINUATION, Some([9, 8, 7, 6]), b":"),
                    frame(FIN | OP_PONG, Some(KEY), b""),
                    frame(FIN | OP_CONTINUATION, Some(KEY), b"1}"),
                ]),
                vec![Got::Ping, Got::Pong, text("{\"a\":1}")],
            ),
            (
                "empty first fragment",
                cat(&[
                    frame(OP_TEXT, None, b""),
                    frame(FIN | OP_CONTINUATION, None, b"ab"),
                ]),
                vec![text("ab")],
            ),
            (
                "fragmented binary",
                cat(&[
                    frame(OP_BINARY, None, b"a"),
                    frame(FIN | OP_PING, None, b""),
                    frame(FIN | OP_CONTINUATION, None, b"b"),
                ]),
                vec![Got::Ping, Got::Binary],
            ),
            (
                "compressed text, then plain",
                cat(&[
                    frame(FIN | RSV1 | OP_TEXT, None, b"\xf2\x48\x05\x00"),
                    frame(FIN | OP_TEXT, None, b"ok"),
                ]),
                vec![Got::Compressed, text("ok")],
            ),
            (
                "fragmented compressed binary",
                cat(&[
                    frame(RSV1 | OP_BINARY, Some(KEY), b"\xf2\x48"),
                    frame(FIN | OP_CONTINUATION, Some(KEY), b"\x05\x00"),
                ]),
                vec![Got::Compressed],
            ),
            (
                "several messages",
                cat(&[
                    frame(FIN | OP_TEXT, None, b"1"),
                    frame(FIN | OP_BINARY, None, b"2"),
                    frame(FIN | OP_TEXT, Some(KEY), b"3"),
                    frame(FIN | OP_CLOSE, None, &1000u16.to_be_bytes()),
                ]),
                vec![text("1"), Got::Binary, text("3"), Got::Close(Some(1000))],
            ),
        ];
        for (name, input, want) in table {
            let mut p = WsParser::new(100_000);
            assert_eq!(run_with(&mut p, &[&input]), want, "{name}");
            assert!(!p.is_stopped(), "{name}");
            assert_eq!(p.state, State::Header, "{name}");
            // Byte by byte, the same.
            let bytes: Vec<&[u8]> = input.chunks(1).collect();
            assert_eq!(run(100_000, &bytes), want, "{name}, byte by byte");
        }
    }

    #[test]
    fn invalid_table() {
        let table: Vec<(&str, Vec<u8>, &str)> = vec![
            ("opcode 3", frame(FIN | 0x3, None, b""), "reserved opcode"),
            ("opcode 7", frame(FIN | 0x7, None, b""), "reserved opcode"),
            ("opcode 0xB", frame(FIN | 0xB, None, b""), "reserved opcode"),
            ("opcode 0xF", frame(FIN | 0xF, None, b""), "reserved opcode"),
            (
                "RSV2",
                frame(FIN | 0x20 | OP_TEXT, None, b"a"),
                "reserved bit RSV2 or RSV3 set",
            ),
            (
                "RSV3",
                frame(FIN | 0x10 | OP_TEXT, None, b"a"),
                "reserved bit RSV2 or RSV3 set",
            ),
            (
                "RSV1 on a ping",
                frame(FIN | RSV1 | OP_PING, None, b""),
                "RSV1 set on a control frame",
            ),
            (
                "RSV1 on a continuation",
                cat(&[
                    frame(RSV1 | OP_TEXT, None, b"a"),
                    frame(FIN | RSV1 | OP_CONTINUATION, None, b"b"),
                ]),
                "RSV1 set on a continuation frame",
            ),
            (
                "ping of 126 bytes",
                frame(FIN | OP_PING, None, &[0; 126]),
                "control frame over 125 bytes",
            ),
            (
                "close with a 16-bit length",
                frame_len(FIN | OP_CLOSE, None, b"\x03\xe8", Len::L16),
                "control frame over 125 bytes",
            ),
            (
                "fragmented ping",
                frame(OP_PING, None, b""),
                "fragmented control frame",
            ),
            (
                "close with one byte",
                frame(FIN | OP_CLOSE, None, b"\x03"),
                "close frame with a 1-byte payload",
            ),
            (
                "continuation first",
                frame(FIN | OP_CONTINUATION, None, b"a"),
                "continuation frame without a message to continue",
            ),
            (
                "continuation after a finished message",
                cat(&[
                    frame(FIN | OP_TEXT, None, b"a"),
                    frame(FIN | OP_CONTINUATION, None, b"b"),
                ]),
                "continuation frame without a message to continue",
            ),
            (
                "text inside a fragmented text",
                cat(&[frame(OP_TEXT, None, b"a"), frame(FIN | OP_TEXT, None, b"b")]),
                "new data frame inside a fragmented message",
            ),
            (
                "binary inside a skipped text",
                cat(&[
                    frame(OP_TEXT, None, &[b'a'; 200]),
                    frame(FIN | OP_BINARY, None, b"b"),
                ]),
                "new data frame inside a fragmented message",
            ),
            (
                "64-bit length with the top bit set",
                {
                    let mut f = vec![FIN | OP_BINARY, 127];
                    f.extend_from_slice(&(1u64 << 63).to_be_bytes());
                    f
                },
                "64-bit payload length with the top bit set",
            ),
        ];
        for (name, input, why) in table {
            let valid_after = frame(FIN | OP_TEXT, None, b"after");
            let mut whole = input.clone();
            whole.extend_from_slice(&valid_after);
            for chunks in [
                vec![&whole[..]],
                whole.chunks(1).collect::<Vec<_>>(),
                vec![&input[..], &valid_after[..]],
            ] {
                let mut p = WsParser::new(100);
                let out = run_with(&mut p, &chunks);
                assert_eq!(out.last(), Some(&Got::Invalid(why)), "{name}: {out:?}");
                assert_eq!(
                    out.iter().filter(|g| matches!(g, Got::Invalid(_))).count(),
                    1,
                    "{name}"
                );
                assert!(p.is_stopped(), "{name}");
                // Nothing more is read from this direction.
                assert!(run_with(&mut p, &[&valid_after]).is_empty(), "{name}");
                assert_eq!(p.buf.capacity(), 0, "{name}");
            }
        }
    }

    /// Several frames of every kind, masked and not, with a 16-bit length,
    /// fragments and control frames between them.
    fn sample() -> (Vec<u8>, Vec<Got>) {
        let long = "L".repeat(130);
        let bytes = cat(&[
            frame(FIN | OP_TEXT, None, b"{\"jsonrpc\":\"2.0\",\"id\":1}"),
            frame(FIN | OP_TEXT, Some(KEY), b"{\"masked\":true}"),
            frame(OP_TEXT, Some([0xa1, 0xb2, 0xc3, 0xd4]), b"frag-"),
            frame(FIN | OP_PING, Some(KEY), b"hb"),
            frame(FIN | OP_CONTINUATION, Some([5, 6, 7, 8]), b"ment"),
            frame(FIN | OP_TEXT, None, long.as_bytes()),
            frame(FIN | OP_BINARY, Some(KEY), b"\x01\x02\x03"),
            frame(FIN | OP_TEXT, None, b""),
            frame(FIN | OP_PONG, None, b""),
            frame(FIN | OP_CLOSE, Some(KEY), b"\x03\xe8bye"),
        ]);
        let want = vec![
            text("{\"jsonrpc\":\"2.0\",\"id\":1}"),
            text("{\"masked\":true}"),
            Got::Ping,
            text("frag-ment"),
            text(&long),
            Got::Binary,
            text(""),
            Got::Pong,
            Got::Close(Some(1000)),
        ];
        (bytes, want)
    }

    #[test]
    fn every_split_gives_the_same_items() {
        let (input, want) = sample();
        assert_eq!(run(1024, &[&input]), want);
        for i in 0..=input.len() {
            assert_eq!(run(1024, &[&input[..i], &input[i..]]), want, "split at {i}");
            for j in i..=input.len() {
                let got = run(1024, &[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, want, "split at {i},{j}");
            }
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(1024, &bytes), want, "byte by byte");
        let empties: Vec<&[u8]> = input.chunks(3).flat_map(|c| [c, &[][..]]).collect();
        assert_eq!(run(1024, &empties), want, "with empty chunks between");
    }

    #[test]
    fn unmasked_whole_frame_is_not_copied() {
        let input = cat(&[
            frame(FIN | OP_TEXT, None, b"one"),
            frame(FIN | OP_PING, None, b""),
            frame(FIN | OP_TEXT, None, b"two"),
        ]);
        let range = input.as_ptr_range();
        let mut p = WsParser::new(1024);
        let mut n = 0;
        p.feed(&input, |item| {
            if let WsItem::Text(t) = item {
                assert!(range.contains(&t.as_ptr()), "a copy");
                n += 1;
            }
        });
        assert_eq!(n, 2);
        assert_eq!(p.buf.capacity(), 0, "the buffer was never used");

        // Header split from its payload: the payload is still not copied.
        let f = frame(FIN | OP_TEXT, None, b"three");
        p.feed(&f[..1], |_| panic!("nothing yet"));
        let rest = &f[1..];
        let range = rest.as_ptr_range();
        let mut seen = false;
        p.feed(rest, |item| {
            let WsItem::Text(t) = item else {
                panic!("{item:?}")
            };
            assert_eq!(t, b"three");
            assert!(range.contains(&t.as_ptr()), "a copy");
            seen = true;
        });
        assert!(seen);
        assert_eq!(p.buf.capacity(), 0);
    }

    #[test]
    fn masked_frames_reuse_one_buffer() {
        let mut p = WsParser::new(1024);
        let a = frame(FIN | OP_TEXT, Some(KEY), &[b'a'; 100]);
        assert_eq!(run_with(&mut p, &[&a]), vec![text(&"a".repeat(100))]);
        let cap = p.buf.capacity();
        let ptr = p.buf.as_ptr();
        assert!((100..=1024).contains(&cap), "{cap}");
        let b = frame(FIN | OP_TEXT, Some([1, 2, 3, 4]), &[b'b'; 100]);
        for _ in 0..10 {
            assert_eq!(run_with(&mut p, &[&b]), vec![text(&"b".repeat(100))]);
        }
        assert_eq!(p.buf.capacity(), cap);
        assert_eq!(p.buf.as_ptr(), ptr, "not reallocated");
    }

    #[test]
    fn overlong_messages_are_skipped_and_counted_once() {
        let ok = frame(FIN | OP_TEXT, None, b"ok");
        // At the limit: fine; one over: skipped.
        assert_eq!(
            run(8, &[&frame(FIN | OP_TEXT, Some(KEY), b"12345678")]),
            vec![text("12345678")]
        );
        let input = cat(&[frame(FIN | OP_TEXT, Some(KEY), b"123456789"), ok.clone()]);
        assert_eq!(run(8, &[&input]), vec![Got::Overlong, text("ok")]);
        // Fragments each under the limit, over it together: one Overlong,
        // and control frames between them still come through.
        let input = cat(&[
            frame(OP_TEXT, None, b"12345"),
            frame(FIN | OP_PING, None, b""),
            frame(OP_CONTINUATION, None, b"6789"),
            frame(OP_CONTINUATION, None, b"abcd"),
            frame(FIN | OP_CONTINUATION, None, b"efgh"),
            ok.clone(),
        ]);
        let want = vec![Got::Ping, Got::Overlong, text("ok")];
        assert_eq!(run(8, &[&input]), want);
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(8, &bytes), want);
        // A zero limit still passes empty messages.
        assert_eq!(run(0, &[&frame(FIN | OP_TEXT, None, b"")]), vec![text("")]);
    }

    /// A tiny deterministic generator, for junk.
    fn junk(n: usize, mut seed: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as u8
            })
            .collect()
    }

    #[test]
    fn memory_stays_bounded() {
        const MAX: usize = 4096;
        // A text frame that says it is 2^62 bytes long, then megabytes.
        let mut p = WsParser::new(MAX);
        let mut head = vec![FIN | OP_TEXT, 0x80 | 127];
        head.extend_from_slice(&(1u64 << 62).to_be_bytes());
        head.extend_from_slice(&KEY);
        let mut out = run_with(&mut p, &[&head]);
        let mb = junk(1 << 20, 1);
        for _ in 0..8 {
            out.extend(run_with(&mut p, &[&mb]));
        }
        assert_eq!(out, vec![Got::Overlong]);
        assert!(!p.is_stopped());
        assert_eq!(p.buf.capacity(), 0);

        // The same for a binary message: never buffered.
        let mut p = WsParser::new(MAX);
        head[0] = OP_BINARY;
        run_with(&mut p, &[&head, &mb, &mb]);
        assert_eq!(p.buf.capacity(), 0);

        // A fragmented text message of small frames, megabytes long.
        let mut p = WsParser::new(MAX);
        let mut out = run_with(&mut p, &[&frame(OP_TEXT, Some(KEY), &[b'x'; 100])]);
        let more = frame(OP_CONTINUATION, Some(KEY), &[b'x'; 1000]);
        for _ in 0..3000 {
            out.extend(run_with(&mut p, &[&more]));
            assert!(p.buf.capacity() <= MAX, "{}", p.buf.capacity());
        }
        out.extend(run_with(
            &mut p,
            &[&frame(FIN | OP_CONTINUATION, None, b"")],
        ));
        assert_eq!(out, vec![Got::Overlong]);

        // Fragments growing a message up to exactly the limit.
        let mut p = WsParser::new(MAX);
        let mut chunks = vec![frame(OP_TEXT, Some(KEY), &[b'y'; 7])];
        for _ in 0..(MAX - 7) / 7 {
            chunks.push(frame(OP_CONTINUATION, Some(KEY), &[b'y'; 7]));
        }
        let used: usize = 7 * (1 + (MAX - 7) / 7);
        chunks.push(frame(
            FIN | OP_CONTINUATION,
            Some(KEY),
            &vec![b'y'; MAX - used],
        ));
        let chunks: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
        assert_eq!(run_with(&mut p, &chunks), vec![text(&"y".repeat(MAX))]);
        assert!(p.buf.capacity() <= MAX, "{}", p.buf.capacity());

        // Random junk, in odd-sized chunks, from many seeds: it stops or
        // keeps reading, but never holds more than the limit.
        for seed in 0..200 {
            let mut p = WsParser::new(MAX);
            let data = junk(64 << 10, seed);
            for c in data.chunks(1 + seed as usize % 97) {
                p.feed(c, |_| {});
            }
            assert!(p.buf.capacity() <= MAX, "seed {seed}");
            assert!(p.head_len < MAX_HEADER);
        }
    }

    /// Frames recorded between an a2a-protocol-client 0.15 WebSocket client
    /// and an a2a-protocol-server 0.15 worker (`tests/ws_frames.rs` writes
    /// them): the bytes after the `101`, one direction per file.
    const CLIENT_TO_WORKER: &[u8] =
        include_bytes!("../../../tests/fixtures/ws/client_to_worker.bin");
    const WORKER_TO_CLIENT: &[u8] =
        include_bytes!("../../../tests/fixtures/ws/worker_to_client.bin");

    fn json_texts(items: &[Got]) -> Vec<serde_json::Value> {
        items
            .iter()
            .filter_map(|g| match g {
                Got::Text(t) => Some(serde_json::from_slice(t).expect("a JSON text message")),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn recorded_frames() {
        for (name, raw, masked) in [
            ("client to worker", CLIENT_TO_WORKER, true),
            ("worker to client", WORKER_TO_CLIENT, false),
        ] {
            assert_eq!(raw[1] & 0x80 != 0, masked, "{name}: masking");
            let want = run(4 << 20, &[raw]);
            assert!(
                !want
                    .iter()
                    .any(|g| matches!(g, Got::Invalid(_) | Got::Overlong | Got::Compressed)),
                "{name}: {want:?}"
            );
            for i in 0..=raw.len() {
                assert_eq!(
                    run(4 << 20, &[&raw[..i], &raw[i..]]),
                    want,
                    "{name}: split at {i}"
                );
            }
            let bytes: Vec<&[u8]> = raw.chunks(1).collect();
            assert_eq!(run(4 << 20, &bytes), want, "{name}: byte by byte");

            let msgs = json_texts(&want);
            assert!(msgs.len() >= 2, "{name}: {want:?}");
            for m in &msgs {
                assert_eq!(m["jsonrpc"], "2.0", "{name}: {m}");
            }
            if masked {
                let methods: Vec<&str> = msgs.iter().filter_map(|m| m["method"].as_str()).collect();
                assert_eq!(methods, ["SendStreamingMessage", "GetTask"], "{name}");
            } else {
                assert!(msgs.iter().all(|m| m.get("result").is_some()), "{name}");
                assert!(
                    msgs.iter()
                        .any(|m| m["result"]["status"] == "stream_complete"),
                    "{name}"
                );
            }
        }
    }
}
