//! Arbitrary bytes, split at a fuzzer-chosen point (and fed byte by byte),
//! into the WebSocket frame parser: no panic, memory bounded by the limit,
//! and the items never depend on where the chunks fall.
#![no_main]

use a2a_gateway::a2a::ws::{OwnedWsItem, WsItem, WsParser};
use libfuzzer_sys::fuzz_target;

/// Small, so that the fuzzer reaches the over-the-limit paths.
const MAX: usize = 1024;

type Got = OwnedWsItem;

fn parse(chunks: &[&[u8]]) -> (Vec<Got>, bool) {
    let mut p = WsParser::new(MAX);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |item| {
            if let WsItem::Text(t) = item {
                assert!(t.len() <= MAX, "a text message over the limit");
            }
            out.push(item.to_owned_item());
        });
        // Bounded memory: the parser's size is fixed and its one buffer
        // never reserves past the limit, whatever lengths the frames claim
        // (`-malloc_limit_mb` catches any other big allocation).
        assert!(p.buffered_capacity() <= MAX, "{}", p.buffered_capacity());
    }
    let stopped = p.is_stopped();
    let invalid = out.iter().filter(|g| matches!(g, Got::Invalid(_))).count();
    assert!(invalid <= 1, "Invalid yielded {invalid} times");
    assert_eq!(stopped, invalid == 1);
    if stopped {
        assert!(matches!(out.last(), Some(Got::Invalid(_))));
    }
    (out, stopped)
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let at = (cut as usize * data.len()) / 255;
    let whole = parse(&[data]);
    let (a, b) = data.split_at(at.min(data.len()));
    assert_eq!(parse(&[a, b]), whole, "split at {at}");
    if data.len() <= 512 {
        let bytes: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(parse(&bytes), whole, "byte by byte");
    }
});
