//! Copying out of memory that someone else may write at the same time.
//!
//! A [`MappedPiece`](super::MappedPiece) may lie in a buffer another
//! process exported to us (a shared-memory train's payload): that process
//! may write it while we copy, and a plain copy (`memcpy`, `memmove`)
//! racing with a write is a data race, undefined behaviour in the Rust
//! memory model, whatever the hardware does. A race-tolerant copy reads
//! the source only with atomic loads: a concurrent write then changes
//! which bytes we copy, never anything else (the reader validates nothing
//! in a payload; it is data).
//!
//! On x86-64 the bulk is one `rep movsb` in inline assembly, which the
//! compiler cannot see into: its effect is that of a sequence of relaxed
//! atomic byte loads and plain byte stores, which is what the Rust
//! abstract machine is told (an assembly block must behave as some Rust
//! code could), and it copies at `memcpy`'s speed on parts with fast
//! strings. Elsewhere, under Miri (which cannot run assembly), and for an
//! overlapping copy, the source is read with relaxed atomic loads of
//! aligned `u64` words (bytes at the unaligned ends), as the
//! shared-memory ring copies its slots.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Copies `len` bytes from `src` to `dst`, reading the source only through
/// atomic loads (see the module's docs), with `memmove` semantics when
/// the ranges overlap.
///
/// # Safety
///
/// `src..src + len` is mapped and readable (it may be read-only memory:
/// only loads of at most a pointer's size touch it); `dst..dst + len` is
/// valid for writes, and no Rust reference to it is live. Nothing else is
/// required of concurrent writers of the source.
pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    let (s, d) = (src as usize, dst as usize);
    let overlap = s < d.wrapping_add(len) && d < s.wrapping_add(len);
    if len == 0 {
        return;
    }
    if overlap && d > s {
        // SAFETY: the caller's promise.
        unsafe { words_backward(src, dst, len) };
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if !overlap {
        // SAFETY: the caller's promise; the ranges do not overlap.
        unsafe { rep_movsb(src, dst, len) };
        return;
    }
    // SAFETY: the caller's promise; a forward copy is a memmove when
    // `dst` is below `src`.
    unsafe { words_forward(src, dst, len) };
}

/// `rep movsb`: `len` bytes from `src` to `dst`, in ascending order.
///
/// # Safety
///
/// As [`copy`], and the ranges do not overlap.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn rep_movsb(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: reads `len` bytes at `src` and writes `len` bytes at `dst`,
    // both valid (the caller's promise), and nothing else; the direction
    // flag is clear at any Rust code (the ABI's guarantee). The block
    // reads the source through no Rust reference, so a concurrent writer
    // of the source changes the copied bytes and nothing else: the block
    // behaves as a loop of relaxed atomic byte loads and plain stores.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags)
        );
    }
}

/// The byte at `p`, with one relaxed atomic load.
///
/// # Safety
///
/// `p` is readable (as [`copy`]'s source).
#[inline(always)]
unsafe fn load8(p: *const u8) -> u8 {
    // SAFETY: readable (the caller's promise); a relaxed atomic load of a
    // byte is allowed on read-only memory (see "Atomic accesses to
    // read-only memory" in `std::sync::atomic`), and never writes.
    unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed)
}

/// The aligned `u64` at `p`, with one relaxed atomic load.
///
/// # Safety
///
/// `p` is 8-aligned and its 8 bytes are readable (as [`copy`]'s source).
#[inline(always)]
unsafe fn load64(p: *const u8) -> u64 {
    // SAFETY: aligned and readable (the caller's promise); as in `load8`
    // (a pointer-sized relaxed load is allowed on read-only memory).
    unsafe { AtomicU64::from_ptr(p.cast_mut().cast::<u64>()) }.load(Ordering::Relaxed)
}

/// [`copy`] in ascending order, word by word where the source is aligned.
///
/// # Safety
///
/// As [`copy`]; overlapping ranges only with `dst` at or below `src`.
unsafe fn words_forward(src: *const u8, dst: *mut u8, len: usize) {
    let head = src.align_offset(8).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`: inside both ranges.
        unsafe { dst.add(i).write(load8(src.add(i))) };
        i += 1;
    }
    while i + 8 <= len {
        // SAFETY: `src + i` is 8-aligned (past the head), its 8 bytes and
        // `dst + i`'s inside the ranges. Every source byte a store may
        // overwrite (overlap, `dst <= src`) lies below `src + i + 8` and
        // was read already.
        unsafe { dst.add(i).cast::<u64>().write_unaligned(load64(src.add(i))) };
        i += 8;
    }
    while i < len {
        // SAFETY: `i < len`.
        unsafe { dst.add(i).write(load8(src.add(i))) };
        i += 1;
    }
}

/// [`copy`] in descending order (overlapping ranges with `dst` above
/// `src`: a memmove), word by word where the source is aligned.
///
/// # Safety
///
/// As [`copy`].
unsafe fn words_backward(src: *const u8, dst: *mut u8, len: usize) {
    // Bytes past the last aligned word of the source.
    let tail = (src as usize).wrapping_add(len) % 8;
    let mut i = len;
    let stop = len - tail.min(len);
    while i > stop {
        i -= 1;
        // SAFETY: `i < len`. Every source byte the store may overwrite
        // lies above `src + i` and was read already.
        unsafe { dst.add(i).write(load8(src.add(i))) };
    }
    while i >= 8 {
        i -= 8;
        // SAFETY: `src + i` is 8-aligned (`src + len - tail` is, and `i`
        // moves by 8), inside the ranges; as above for the overlap.
        unsafe { dst.add(i).cast::<u64>().write_unaligned(load64(src.add(i))) };
    }
    while i > 0 {
        i -= 1;
        // SAFETY: `i < len`.
        unsafe { dst.add(i).write(load8(src.add(i))) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length, alignment and overlap against `copy_within`.
    #[test]
    fn copies_like_memmove() {
        for len in 0..40usize {
            for so in 0..9usize {
                for doff in 0..20usize {
                    let mut want: Vec<u8> = (0..64u8).collect();
                    let mut got = want.clone();
                    want.copy_within(so..so + len, doff);
                    let p = got.as_mut_ptr();
                    // SAFETY: both ranges inside `got` (64 bytes), no
                    // reference to it live meanwhile.
                    unsafe { copy(p.add(so), p.add(doff), len) };
                    assert_eq!(got, want, "len {len} src {so} dst {doff}");
                }
            }
        }
    }

    /// Disjoint buffers of every alignment, long enough for the bulk path.
    #[test]
    fn copies_between_buffers() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for (so, doff, len) in [(0, 0, 4096), (1, 3, 4000), (7, 0, 4993), (3, 5, 17), (0, 1, 0)] {
            let mut dst = vec![0u8; 5008];
            // SAFETY: in bounds of both vectors, distinct allocations.
            unsafe { copy(src.as_ptr().add(so), dst.as_mut_ptr().add(doff), len) };
            assert_eq!(&dst[doff..doff + len], &src[so..so + len]);
            assert!(dst[..doff].iter().all(|&b| b == 0));
            assert!(dst[doff + len..].iter().all(|&b| b == 0));
        }
    }
}
