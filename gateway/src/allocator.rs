//! The gateway's heap allocator: mimalloc, or the C library's `malloc` when
//! `A2A_GATEWAY_ALLOCATOR=system` is set.
//!
//! pingora allocates about 70 times per proxied request (header maps and
//! their clones, header values, the hooks' boxed futures, a channel per
//! request) where nginx allocates from per-request pools. glibc's `malloc`
//! takes most of those through its slower paths (blocks freed on another
//! thread than the one that allocated them, consolidation), about 200
//! instructions a pair; mimalloc about a quarter of that. By
//! `benches/callgrind.sh`: bare pingora 93.1k to 83.2k instructions per
//! `SendMessage`, the gateway 105.3k to 92.8k (jemalloc: 86.6k and 97.6k).
//!
//! mimalloc is built without its `madvise(MADV_HUGEPAGE)` on the memory it
//! maps (libmimalloc-sys's `no_thp`): with it, on a host whose transparent
//! huge pages are `madvise` (the bench machine's), each open stream's two
//! 64 KiB read buffers, allocated but mostly untouched, became resident:
//! 184 KiB per stream in the `streams` bench against 66 KiB on glibc; without
//! it, 64. A host set to `always` gives huge pages unasked; there, start the
//! gateway with `MIMALLOC_ALLOW_THP=0` (mimalloc then turns them off for the
//! process at start-up).
//!
//! `system` is for tools that watch `malloc` (valgrind's memcheck,
//! heaptrack, an `LD_PRELOAD`ed allocator, the `streams` bench's allocation
//! counter). The choice is made once, at the process's first allocation
//! through Rust (while only the main thread exists), and never changes, so
//! every block is freed by the allocator that gave it out. Memory the C
//! library allocates must still be freed by the C library, as always.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use libmimalloc_sys as mi;

/// The environment variable that picks the allocator.
pub const ENV: &str = "A2A_GATEWAY_ALLOCATOR";
/// [`ENV`] for `getenv` (a test keeps the two the same).
const ENV_C: &std::ffi::CStr = c"A2A_GATEWAY_ALLOCATOR";

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// mimalloc's plain calls serve any alignment up to 16 when the size is at
/// least the alignment (std's `System` uses the same rule for `malloc`); its
/// `_aligned` calls take a slower path, so they are kept for larger
/// alignments.
const MI_MAX_ALIGN: usize = 16;

#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= MI_MAX_ALIGN && align <= size
}

/// The process's `#[global_allocator]`, declared by the `a2a-gateway` binary
/// and by the benches (so that bare pingora runs on the same allocator as
/// the gateway it is compared with).
#[derive(Debug)]
pub struct Allocator;

/// What [`ENV`] asks for, or the value it holds when it is neither
/// `mimalloc` nor `system` (unset or empty: mimalloc).
pub fn requested() -> Result<&'static str, String> {
    let value = std::env::var_os(ENV);
    match value.as_deref().map(|v| v.to_str()) {
        None | Some(Some("" | "mimalloc")) => Ok("mimalloc"),
        Some(Some("system")) => Ok("system"),
        Some(_) => Err(format!(
            "{ENV}={:?}: expected \"mimalloc\" (the default) or \"system\"",
            value.unwrap_or_default()
        )),
    }
}

/// The allocator this process runs on, when it declared [`Allocator`] as its
/// global allocator.
pub fn in_use() -> &'static str {
    match CHOICE.load(Ordering::Relaxed) {
        SYSTEM => "system",
        MIMALLOC => "mimalloc",
        _ => "undecided",
    }
}

#[inline]
fn system() -> bool {
    match CHOICE.load(Ordering::Relaxed) {
        MIMALLOC => false,
        SYSTEM => true,
        _ => decide(),
    }
}

/// Reads [`ENV`] with `getenv`, which does not allocate (`std::env` does,
/// and would call back into the allocator being decided). An unknown value
/// falls back to mimalloc here; `main` refuses it with [`requested`].
#[cold]
fn decide() -> bool {
    // SAFETY: the name is a NUL-terminated literal; getenv returns null or a
    // NUL-terminated string that stays valid while nothing changes the
    // environment, which nothing does before the first allocation returns.
    let value = unsafe { libc::getenv(ENV_C.as_ptr()) };
    let system = !value.is_null()
        // SAFETY: non-null, NUL-terminated (above).
        && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"system";
    // Two threads deciding at once would read the same environment and
    // store the same value.
    CHOICE.store(if system { SYSTEM } else { MIMALLOC }, Ordering::Relaxed);
    system
}

// SAFETY: every call goes to one allocator for the process's whole life
// (`CHOICE` is decided before the first block is handed out and never
// changes), and both allocators uphold `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        unsafe {
            if system() {
                System.alloc(layout)
            } else if plain(align, size) {
                mi::mi_malloc(size).cast()
            } else {
                mi::mi_malloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        unsafe {
            if system() {
                System.alloc_zeroed(layout)
            } else if plain(align, size) {
                mi::mi_zalloc(size).cast()
            } else {
                mi::mi_zalloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe {
            if system() {
                System.dealloc(ptr, layout)
            } else {
                mi::mi_free(ptr.cast())
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        unsafe {
            if system() {
                System.realloc(ptr, layout, new_size)
            } else if plain(align, new_size) {
                mi::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast(), new_size, align).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_usable_blocks_either_way() {
        // The unit-test binary does not declare the allocator global: call it
        // directly, under both choices it can make.
        for choice in [MIMALLOC, SYSTEM] {
            CHOICE.store(choice, Ordering::Relaxed);
            // Small and large alignments, sizes below and above them.
            for (size, align) in [(100, 64), (8, 8), (4, 16), (3000, 16), (24, 4096)] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; each block freed with its layout.
                unsafe {
                    let p = Allocator.alloc_zeroed(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{size}/{align}");
                    assert!((0..size).all(|i| *p.add(i) == 0));
                    p.write_bytes(7, size);
                    let q = Allocator.realloc(p, layout, size * 40);
                    assert!(!q.is_null());
                    assert_eq!(q as usize % align, 0, "{size}/{align} grown");
                    assert!((0..size).all(|i| *q.add(i) == 7));
                    Allocator.dealloc(q, Layout::from_size_align(size * 40, align).unwrap());
                    let r = Allocator.alloc(layout);
                    assert_eq!(r as usize % align, 0);
                    Allocator.dealloc(r, layout);
                }
            }
        }
        CHOICE.store(UNDECIDED, Ordering::Relaxed);
    }

    #[test]
    fn both_spellings_name_one_variable() {
        assert_eq!(ENV_C.to_str(), Ok(ENV));
    }

    /// The workspace denies `unsafe_code` rather than forbidding it so that
    /// this module can allow it; no other file may.
    #[test]
    fn no_other_file_allows_unsafe_code() {
        fn walk(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains(concat!("allow(", "unsafe_code)")) {
                        found.push(path);
                    }
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        for dir in ["gateway", "policies", "config", "benches", "tests"] {
            walk(&root.join(dir), &mut found);
        }
        let found: Vec<_> = found
            .iter()
            .map(|p| {
                p.strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(found, ["gateway/src/allocator.rs"]);
    }
}
