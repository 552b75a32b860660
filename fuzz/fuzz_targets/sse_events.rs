//! Arbitrary bytes, split at a fuzzer-chosen point (and fed byte by byte),
//! into the SSE parser: no panic, no event over the limit, and the events
//! never depend on where the chunks fall.
#![no_main]

use a2a_gateway::a2a::sse::{SseItem, SseParser};
use libfuzzer_sys::fuzz_target;

/// Small, so that the fuzzer reaches the over-the-limit paths.
const LIMIT: usize = 256;

#[derive(Debug, PartialEq, Eq)]
enum Got {
    Event(Option<Vec<u8>>, Vec<u8>),
    Overlong,
}

fn parse(chunks: &[&[u8]]) -> Vec<Got> {
    let mut p = SseParser::new(LIMIT);
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |item| {
            out.push(match item {
                SseItem::Event { event, data, .. } => {
                    assert!(data.len() <= LIMIT, "an event over the limit");
                    Got::Event(event.map(<[u8]>::to_vec), data.to_vec())
                }
                SseItem::Overlong => Got::Overlong,
            })
        });
    }
    out
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
