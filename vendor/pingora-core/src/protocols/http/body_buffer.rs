// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use bytes::{Bytes, BytesMut};

/// A buffer with size limit. When the total amount of data written to the buffer is below the limit
/// all the data will be held in the buffer. Otherwise, the buffer will report to be truncated.
///
/// a2a-gateway patch (see PATCHED.md, "Request bodies kept without a copy"):
/// a body written in one chunk, as nearly every request body is, is kept as
/// the `Bytes` it came in (a reference, no copy) and handed back the same
/// way; only a second chunk makes it copy, into one joined buffer.
pub struct FixedBuffer {
    held: Held,
    capacity: usize,
}

/// What a [`FixedBuffer`] holds (as large as pingora's `BytesMut` and flag).
enum Held {
    Empty,
    /// The body while it is one chunk.
    Single(Bytes),
    /// The body once a second chunk came.
    Joined(BytesMut),
    /// Over the limit: nothing kept.
    Truncated,
}

impl FixedBuffer {
    pub fn new(capacity: usize) -> Self {
        FixedBuffer {
            held: Held::Empty,
            capacity,
        }
    }

    fn len(&self) -> usize {
        match &self.held {
            Held::Single(b) => b.len(),
            Held::Joined(b) => b.len(),
            Held::Empty | Held::Truncated => 0,
        }
    }

    pub fn write_to_buffer(&mut self, data: &Bytes) {
        if self.is_truncated() || data.is_empty() {
            return;
        }
        if self.len() + data.len() > self.capacity {
            // Buffered data is no longer usable for a retry, so release its allocation.
            self.held = Held::Truncated;
            return;
        }
        self.held = match std::mem::replace(&mut self.held, Held::Empty) {
            Held::Empty => Held::Single(data.clone()),
            Held::Single(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(data);
                Held::Joined(joined)
            }
            Held::Joined(mut joined) => {
                joined.extend_from_slice(data);
                Held::Joined(joined)
            }
            Held::Truncated => Held::Truncated,
        };
    }

    pub fn clear(&mut self) {
        self.held = Held::Empty;
    }
    /// Lets go of what is held, which then counts as truncated until the next
    /// [`Self::clear`]: for when no retry can use it any more (a2a-gateway
    /// patch, see PATCHED.md, "Heads handed on, not copied").
    pub fn release(&mut self) {
        self.held = Held::Truncated;
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_truncated(&self) -> bool {
        matches!(self.held, Held::Truncated)
    }
    pub fn get_buffer(&self) -> Option<Bytes> {
        // TODO: return None if truncated?
        match &self.held {
            Held::Single(b) => Some(b.clone()),
            Held::Joined(b) => Some(Bytes::copy_from_slice(b)),
            Held::Empty | Held::Truncated => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_storage_when_truncated() {
        let mut buffer = FixedBuffer::new(4);
        buffer.write_to_buffer(&Bytes::from_static(b"1234"));
        assert!(matches!(buffer.held, Held::Single(_)));

        buffer.write_to_buffer(&Bytes::from_static(b"5"));

        assert!(buffer.is_truncated());
        assert!(matches!(buffer.held, Held::Truncated));
        assert!(buffer.get_buffer().is_none());
    }

    // a2a-gateway patch: the body kept without a copy (see PATCHED.md).
    #[test]
    fn one_chunk_is_kept_as_it_came() {
        let mut buffer = FixedBuffer::new(64);
        let chunk = Bytes::from(b"hello world".to_vec());
        buffer.write_to_buffer(&chunk);
        let got = buffer.get_buffer().unwrap();
        assert_eq!(got, chunk);
        assert_eq!(got.as_ptr(), chunk.as_ptr(), "no copy");
        // An empty chunk changes nothing.
        buffer.write_to_buffer(&Bytes::new());
        assert_eq!(buffer.get_buffer().unwrap().as_ptr(), chunk.as_ptr());
    }

    #[test]
    fn more_chunks_are_joined_in_order() {
        let mut buffer = FixedBuffer::new(10);
        assert!(buffer.get_buffer().is_none());
        for part in [&b"ab"[..], b"cde", b"", b"fghij"] {
            buffer.write_to_buffer(&Bytes::copy_from_slice(part));
        }
        assert!(!buffer.is_truncated());
        assert_eq!(
            buffer.get_buffer().unwrap(),
            Bytes::from_static(b"abcdefghij")
        );
        // One byte over the limit: truncated, storage released.
        buffer.write_to_buffer(&Bytes::from_static(b"k"));
        assert!(buffer.is_truncated());
        assert!(buffer.get_buffer().is_none());
        assert!(matches!(buffer.held, Held::Truncated));
        // Cleared for the next request: usable again, one chunk or more.
        buffer.clear();
        assert!(!buffer.is_truncated() && buffer.is_empty());
        buffer.write_to_buffer(&Bytes::from_static(b"xy"));
        assert_eq!(buffer.get_buffer().unwrap(), Bytes::from_static(b"xy"));
        buffer.write_to_buffer(&Bytes::from_static(b"z"));
        assert_eq!(buffer.get_buffer().unwrap(), Bytes::from_static(b"xyz"));
    }
}
