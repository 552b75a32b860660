//! The heap allocation counter the benches put under a proxy process
//! (`#[path]`-included by `benches/streams.rs` and `benches/grpc.rs`): an
//! `LD_PRELOAD` shim, compiled here with `cc`, that counts `malloc`,
//! `calloc`, `realloc`, `posix_memalign`/`aligned_alloc`/`memalign` calls
//! and the bytes asked into a file mapped shared, so that the bench reads
//! them with a plain `read` while the proxy runs. The proxy must run on the C
//! library's `malloc` for it ([`ENV`] below: mimalloc, the binaries' default,
//! is linked in and never calls `malloc`). It counts the real binaries, as
//! they are released, rather than a counting allocator in a test build.

use std::path::{Path, PathBuf};

/// The variable naming the counter file the shim maps.
pub const COUNTER_ENV: &str = "A2AGW_ALLOC_COUNTER";

/// The environment a counted process needs besides `LD_PRELOAD`: the C
/// library's `malloc` instead of mimalloc.
pub const ALLOCATOR_ENV: (&str, &str) = (a2a_gateway::allocator::ENV, "system");

/// Counts allocation calls (words 0: malloc/calloc/memalign family, 1:
/// realloc, 2: bytes asked) in a file mapped shared.
const SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <stddef.h>
#include <stdlib.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static unsigned long fallback[3];
static unsigned long *ctr = fallback;
__attribute__((constructor)) static void init(void) {
    const char *p = getenv("A2AGW_ALLOC_COUNTER");
    if (!p) return;
    int fd = open(p, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, 4096) != 0) { close(fd); return; }
    void *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED) ctr = m;
}
static inline void count(int which, size_t n) {
    __atomic_fetch_add(&ctr[which], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&ctr[2], n, __ATOMIC_RELAXED);
}
void *malloc(size_t n) { count(0, n); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { count(0, a * b); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { count(p ? 1 : 0, n); return __libc_realloc(p, n); }
void *memalign(size_t al, size_t n) { count(0, n); return __libc_memalign(al, n); }
void *aligned_alloc(size_t al, size_t n) { count(0, n); return __libc_memalign(al, n); }
int posix_memalign(void **out, size_t al, size_t n) {
    count(0, n);
    void *p = __libc_memalign(al, n);
    if (!p) return 12;
    *out = p;
    return 0;
}
"#;

/// Compiles the shim into `dir`; its path.
pub fn build_shim(dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("count_alloc.c");
    let so = dir.join("count_alloc.so");
    std::fs::write(&src, SHIM_C).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .map_err(|e| format!("cc: {e} (a C compiler is needed for the allocation counter)"))?;
    if !out.status.success() {
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(so)
}

/// (allocation calls, realloc calls, bytes asked) so far, from a counter
/// file the shim maps.
pub fn read_counter(counter: &Path) -> Option<[u64; 3]> {
    let bytes = std::fs::read(counter).ok()?;
    let word = |i: usize| {
        let b: [u8; 8] = bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?;
        Some(u64::from_ne_bytes(b))
    };
    Some([word(0)?, word(1)?, word(2)?])
}
