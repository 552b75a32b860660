//! A small borrowed reader for the few JSON members policy reads from a
//! request body (and `observe` from a worker's answers): it walks an object member by member in one pass,
//! descending into the members it is asked about, handing over the raw
//! bytes of the ones it reads, and skipping everything else without
//! building it (strings with `memchr`).
//!
//! Two reasons it exists instead of serde's derived structs:
//! - **Duplicate keys.** A derived struct refuses a duplicate field, so a
//!   message whose metadata named `a2a-rust.com/budget` twice could not be
//!   read here and was proxied unread, while a worker that keeps metadata as
//!   a `serde_json::Value` (a2a-rust does) took the second grant, past the
//!   route's caps. Here the last occurrence wins, as it does in
//!   `serde_json::Value`, JavaScript's `JSON.parse` and Go's `encoding/json`:
//!   the gateway reads what such a worker reads.
//! - **Cost.** Reading the request was the largest single cost the gateway
//!   added to a proxied `SendMessage` (about 8k instructions with serde's
//!   `IgnoredAny` skipping the message text); in one pass it is about 3k
//!   less (`benches/callgrind.sh`).
//!
//! It accepts a superset of JSON: it does not check numbers, literals, the
//! UTF-8 of strings it skips, or that brackets pair by kind. A body it reads
//! that is not JSON is one the worker refuses; what matters is that it never
//! refuses a body a worker would accept (the tests compare it with
//! `serde_json::Value` on generated documents).

use std::borrow::Cow;

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The index of the first byte from `i` on that is not JSON whitespace.
pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_ws(b[i]) {
        i += 1;
    }
    i
}

/// Whether `b` holds nothing but JSON whitespace.
pub fn is_blank(b: &[u8]) -> bool {
    skip_ws(b, 0) == b.len()
}

/// Bytes of a string scanned a word at a time before [`string_end`] hands
/// the rest to `memchr2`: most strings in an A2A request (keys, ids, roles)
/// are shorter, and for them eight bytes per step cost less than
/// `memchr2`'s setup, which was nearly half of reading a `SendMessage`
/// (`benches/callgrind.sh`).
const SHORT_STRING: usize = 64;

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of each byte of `word` that equals `b`, read little-endian
/// (bits above the first match may be set spuriously; the lowest is exact).
fn bytes_equal(word: u64, b: u8) -> u64 {
    let x = word ^ (ONES * u64::from(b));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The end (exclusive) of the string whose opening quote is at `i`, and
/// whether it holds an escape (then its text must be decoded, not borrowed).
fn string_end(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    let short = b.len().min(j + SHORT_STRING);
    loop {
        let stop = match b.get(j..j + 8).filter(|_| j + 8 <= short) {
            Some(w) => {
                let word = u64::from_le_bytes(w.try_into().ok()?);
                let hits = bytes_equal(word, b'"') | bytes_equal(word, b'\\');
                if hits == 0 {
                    j += 8;
                    continue;
                }
                j + hits.trailing_zeros() as usize / 8
            }
            None if j < short => match b[j] {
                b'"' | b'\\' => j,
                _ => {
                    j += 1;
                    continue;
                }
            },
            None => break,
        };
        if b[stop] == b'"' {
            return Some((stop + 1, escaped));
        }
        // An escape: the next byte is never the string's end.
        escaped = true;
        j = stop + 2;
    }
    loop {
        let k = j + memchr::memchr2(b'"', b'\\', b.get(j..)?)?;
        if b[k] == b'"' {
            return Some((k + 1, escaped));
        }
        escaped = true;
        j = k + 2;
    }
}

/// The end (exclusive) of the value that starts at `i` (not whitespace).
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i).map(|(end, _)| end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?.0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        b'}' | b']' | b',' | b':' => None,
        // A number or a literal: up to the next delimiter.
        _ => {
            let mut j = i;
            while j < b.len()
                && !matches!(b[j], b',' | b'}' | b']' | b'"' | b'{' | b'[' | b':')
                && !is_ws(b[j])
            {
                j += 1;
            }
            Some(j)
        }
    }
}

/// A JSON string token (quotes included) as text; `None` when it is not a
/// string or not valid. Borrowed unless it holds an escape.
pub fn string(raw: &[u8]) -> Option<Cow<'_, str>> {
    if raw.len() < 2 || raw[0] != b'"' || raw[raw.len() - 1] != b'"' {
        return None;
    }
    let inner = &raw[1..raw.len() - 1];
    if memchr::memchr(b'\\', inner).is_none() {
        std::str::from_utf8(inner).ok().map(Cow::Borrowed)
    } else {
        serde_json::from_slice::<String>(raw).ok().map(Cow::Owned)
    }
}

/// The bytes below 0x20 in `word` (the high bit of each, read
/// little-endian; as in [`bytes_equal`], only the lowest is exact).
fn bytes_below_space(word: u64) -> u64 {
    word.wrapping_sub(ONES * 0x20) & !word & HIGHS
}

/// The first byte at or after `j` that is a quote, a backslash or a
/// control character (below 0x20): where a plain string ends, or what
/// makes it not plain. A word at a time; `None` at the end of `b`.
pub fn plain_end(b: &[u8], mut j: usize) -> Option<usize> {
    while let Some(w) = b.get(j..j + 8) {
        let word = u64::from_le_bytes(w.try_into().ok()?);
        let hits = bytes_equal(word, b'"') | bytes_equal(word, b'\\') | bytes_below_space(word);
        if hits != 0 {
            return Some(j + hits.trailing_zeros() as usize / 8);
        }
        j += 8;
    }
    b[j..]
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|k| j + k)
}

/// The string `rest` starts with, as text (borrowed unless it holds an
/// escape), and its length: [`take`] and [`string`] in one scan. `None`
/// when `rest` does not start with a string or it is not valid JSON text
/// (unlike [`string`], a raw control character refuses it too, as
/// serde_json does).
pub fn take_string(rest: &[u8]) -> Option<(usize, Cow<'_, str>)> {
    if rest.first() != Some(&b'"') {
        return None;
    }
    let stop = plain_end(rest, 1)?;
    match rest[stop] {
        b'"' => Some((
            stop + 1,
            Cow::Borrowed(std::str::from_utf8(&rest[1..stop]).ok()?),
        )),
        b'\\' => {
            let (end, _) = string_end(rest, 0)?;
            let text = serde_json::from_slice::<String>(&rest[..end]).ok()?;
            Some((end, Cow::Owned(text)))
        }
        _ => None,
    }
}

/// The key `rest` starts with, as bytes (escapes decoded; not checked as
/// UTF-8 unless it has one), and its length. `None` when `rest` does not
/// start with a string or it is not valid JSON text.
pub fn take_key(rest: &[u8]) -> Option<(usize, Cow<'_, [u8]>)> {
    if rest.first() != Some(&b'"') {
        return None;
    }
    let stop = plain_end(rest, 1)?;
    if rest[stop] == b'"' {
        return Some((stop + 1, Cow::Borrowed(&rest[1..stop])));
    }
    let (n, key) = take_string(rest)?;
    Some((n, Cow::Owned(key.into_owned().into_bytes())))
}

/// A key's text as bytes: its escapes decoded, its UTF-8 not checked (a key
/// is only compared with the ASCII names policy reads).
fn key(raw: &[u8], escaped: bool) -> Option<Cow<'_, [u8]>> {
    if !escaped {
        Some(Cow::Borrowed(&raw[1..raw.len() - 1]))
    } else {
        serde_json::from_slice::<String>(raw)
            .ok()
            .map(|s| Cow::Owned(s.into_bytes()))
    }
}

/// The length of the value `rest` starts with; `None` when malformed.
pub fn skip(rest: &[u8]) -> Option<usize> {
    value_end(rest, 0)
}

/// Puts the value `rest` starts with (its raw bytes) in `slot`; its length.
pub fn take<'a>(rest: &'a [u8], slot: &mut Option<&'a [u8]>) -> Option<usize> {
    let n = skip(rest)?;
    *slot = Some(&rest[..n]);
    Some(n)
}

/// Walks the object `raw` holds (after optional whitespace) in one pass:
/// calls `f(key, rest)` for each member in document order, `rest` starting
/// at the member's value, and `f` returns that value's length, having read
/// it with [`take`], skipped it with [`skip`] or descended into it with
/// `object` itself (which returns the length of what it read). So a value
/// is scanned once however deep the reader goes, and a later duplicate key
/// overwrites what an earlier one set. Returns the index just past the
/// closing brace; `None` when `raw` does not start with an object or the
/// object is malformed (members seen before the fault have been visited).
pub fn object<'a>(
    raw: &'a [u8],
    mut f: impl FnMut(&[u8], &'a [u8]) -> Option<usize>,
) -> Option<usize> {
    let b = raw;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return Some(i + 1);
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (key_end, escaped) = string_end(b, i)?;
        let key = key(&b[i..key_end], escaped)?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let n = f(&key, &b[i..])?;
        i = skip_ws(b, i + n);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Calls `f(raw element)` for each element of the array `raw` holds (after
/// optional whitespace). Returns the index just past the closing bracket;
/// `None` when `raw` does not start with an array or it is malformed.
pub fn array<'a>(raw: &'a [u8], mut f: impl FnMut(&'a [u8])) -> Option<usize> {
    let b = raw;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'[') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        let end = value_end(b, i)?;
        f(&b[i..end]);
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b']') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// Whether the raw value is an object (it starts with `{`).
pub fn is_object(raw: &[u8]) -> bool {
    raw.first() == Some(&b'{')
}

#[cfg(test)]
mod tests {
    use super::*;

    type Members = Option<Vec<(String, String)>>;

    fn members(doc: &str) -> Members {
        let mut out = Vec::new();
        let end = object(doc.as_bytes(), |k, rest| {
            let mut v = None;
            let n = take(rest, &mut v)?;
            out.push((
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(v?.to_vec()).unwrap(),
            ));
            Some(n)
        })?;
        is_blank(&doc.as_bytes()[end..]).then_some(out)
    }

    #[test]
    fn objects() {
        let kv = |pairs: &[(&str, &str)]| -> Members {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        let table: Vec<(&str, Members)> = vec![
            ("{}", kv(&[])),
            (" { } ", kv(&[])),
            (r#"{"a":1}"#, kv(&[("a", "1")])),
            (
                "{ \"a\" :\t[1, {\"b\": \"]}\"}] ,\n\"c\":null}",
                kv(&[("a", r#"[1, {"b": "]}"}]"#), ("c", "null")]),
            ),
            (
                r#"{"a\"b":"x\\","c":"\"}"}"#,
                kv(&[("a\"b", r#""x\\""#), ("c", r#""\"}""#)]),
            ),
            (r#"{"\u0061":true}"#, kv(&[("a", "true")])),
            (r#"{"a":1,"a":2}"#, kv(&[("a", "1"), ("a", "2")])),
            (r#"{"a":-1.5e3}"#, kv(&[("a", "-1.5e3")])),
            ("{", None),
            (r#"{"a"}"#, None),
            (r#"{"a":}"#, None),
            (r#"{"a":1,}"#, None),
            (r#"{"a":"unterminated}"#, None),
            (r#"{"a":[1,2}"#, None),
            (r#"{a:1}"#, None),
            (r#"[{"a":1}]"#, None),
            ("", None),
        ];
        for (doc, want) in table {
            assert_eq!(members(doc), want, "{doc}");
        }
    }

    #[test]
    fn arrays() {
        let mut got = Vec::new();
        let doc = br#" [ {"a":1} , "x", [2,[3]], null ] "#;
        let end = array(doc, |v| got.push(String::from_utf8(v.to_vec()).unwrap())).unwrap();
        assert!(is_blank(&doc[end..]));
        assert_eq!(got, [r#"{"a":1}"#, r#""x""#, "[2,[3]]", "null"]);
        assert_eq!(array(b"[]", |_| panic!("no element")), Some(2));
        assert_eq!(array(b"[1,", |_| {}), None);
        assert_eq!(array(b"{}", |_| {}), None);
    }

    /// Strings and keys of every length around [`SHORT_STRING`], with an
    /// escape (or an escaped quote, or a two-byte UTF-8 character) at every
    /// position: the short scan and `memchr2` must hand over at the same
    /// byte whatever straddles it, and a string cut short is refused.
    #[test]
    fn strings_across_the_short_scan() {
        for len in 0..SHORT_STRING * 2 + 3 {
            for esc in std::iter::once(None).chain((0..len).map(Some)) {
                for escape in [r"\\", r#"\""#, r"\n", "é"] {
                    let mut text: String = "x".repeat(len);
                    if let Some(at) = esc {
                        text.replace_range(at..at + 1, escape);
                    }
                    let doc = format!(r#"{{"{text}":"{text}","z":[1]}}"#);
                    serde_json::from_str::<serde_json::Value>(&doc).expect("valid JSON");
                    let raw = format!(r#""{text}""#);
                    let decoded: String = serde_json::from_str(&raw).unwrap();
                    let got = members(&doc).unwrap_or_else(|| panic!("{doc}"));
                    assert_eq!(got[0].0, decoded, "{doc}");
                    assert_eq!(got[0].1, raw, "{doc}");
                    assert_eq!(got[1], ("z".into(), "[1]".into()), "{doc}");
                    assert_eq!(
                        string(raw.as_bytes()).as_deref(),
                        Some(decoded.as_str()),
                        "{doc}"
                    );
                    let (n, text) = take_string(&doc.as_bytes()[1..]).unwrap();
                    assert_eq!((n, text.as_ref()), (raw.len(), decoded.as_str()), "{doc}");
                    assert_eq!(
                        matches!(text, Cow::Borrowed(_)),
                        esc.is_none() || escape == "é"
                    );
                    // Cut inside its last key, the document is refused.
                    assert_eq!(members(&doc[..doc.len() - 7]), None, "{doc}");
                    // And so it is when cut before the first key's closing
                    // quote, or right after the backslash of its escape.
                    let key_end = 2 + text.len();
                    for cut in [key_end, esc.map_or(key_end, |at| 2 + at + 1)] {
                        let bytes = &doc.as_bytes()[..cut];
                        assert_eq!(object(bytes, |_, v| skip(v)), None, "{doc} cut at {cut}");
                    }
                }
            }
        }
    }

    #[test]
    fn strings() {
        assert_eq!(string(br#""abc""#).as_deref(), Some("abc"));
        assert!(matches!(string(br#""abc""#), Some(Cow::Borrowed(_))));
        assert_eq!(string(br#""a\nb\u00e9""#).as_deref(), Some("a\nb\u{e9}"));
        assert_eq!(string(b"12"), None);
        assert_eq!(string(b"null"), None);
        assert_eq!(string(b"\""), None);
        assert_eq!(string(b"\"\xff\""), None);
        assert_eq!(string(br#""bad \x escape""#), None);
        assert_eq!(take_string(br#""abc","#), Some((5, Cow::Borrowed("abc"))));
        assert_eq!(
            take_string(br#""a\nb" "#).map(|(n, s)| (n, s.into_owned())),
            Some((6, "a\nb".into()))
        );
        assert_eq!(take_string(b"12"), None);
        assert_eq!(take_string(b"\"abc"), None);
        assert_eq!(take_string(b"\"\xff\""), None);
        assert_eq!(take_string(b"\"a\x01b\""), None);
        assert_eq!(
            take_key(br#""a\u0062":1"#),
            Some((9, Cow::Owned(b"ab".to_vec())))
        );
        assert_eq!(take_key(br#""ab":1"#), Some((4, Cow::Borrowed(&b"ab"[..]))));
        assert_eq!(take_key(b"\"a\x01b\":1"), None);
        assert_eq!(take_key(b"ab"), None);
        // A quote, a backslash or a control character at every place of a
        // string longer than a word: found where it is.
        for len in 0..20 {
            for at in 0..len {
                for (c, want) in [
                    (b'"', Some(1 + at)),
                    (b'\\', Some(1 + at)),
                    (0x1f, Some(1 + at)),
                ] {
                    let mut b = vec![b'"'];
                    b.extend(std::iter::repeat_n(b'x', len));
                    b[1 + at] = c;
                    b.push(b'"');
                    assert_eq!(plain_end(&b, 1), want, "{len} {at} {c}");
                }
            }
            let mut b = vec![b'"'];
            b.extend(std::iter::repeat_n(0x7f_u8, len));
            b.extend([0x80, 0xff, b' ']);
            assert_eq!(plain_end(&b, 1), None, "{len}");
            b.push(b'"');
            assert_eq!(plain_end(&b, 1), Some(len + 4), "{len}");
        }
        assert_eq!(
            take_string(b"\"a\\u0001b\"").map(|(_, s)| s.into_owned()),
            Some("a\u{1}b".into())
        );
    }
}
