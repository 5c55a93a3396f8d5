//! The shared region of one channel and its two single-producer
//! single-consumer rings of datagrams.
//!
//! # Layout
//!
//! One sealed memfd of [`REGION_LEN`] bytes, created by the side that
//! connects:
//!
//! ```text
//! 0       header page: magic "SVSHMRG1", version, slot count, slot size
//! 4096    ring 0 (connector -> acceptor)
//! 4096+R  ring 1 (acceptor -> connector)            R = RING_LEN
//!
//! ring:   +128  tail   u64  (next slot the consumer reads; consumer writes)
//!         +256  sleep  u32  (consumer: 1 = about to sleep, ring the doorbell)
//!         +4096 SLOTS slots of SLOT_LEN bytes (64-byte aligned)
//! slot:   +0  header (`wire::SlotHeader`): seq u32 (publication: the
//!             slot's index + 1, mod 2^32), len u16 (datagram bytes), ext
//!             u16 (extension bytes; len + ext <= MAX_PAYLOAD), kind u16,
//!             flags u16, src_port u16, dst_port u16
//!         +16 with FLAG_ADDRS: src [16], dst [16] (IPv6 form), then the
//!             bytes at +48; without: the bytes at +16, and the addresses
//!             are those of the ring's previous slot
//!         bytes: len bytes of datagram, then ext bytes of extension
//!             (written and read as whole u64 words; the last one's
//!             bytes past the end are padding)
//! ```
//!
//! A small datagram (an 8-byte RC SEND is 24 bytes) to the same
//! addresses as the one before lies with its header in the slot's first
//! 64-byte line, which is also the line the consumer polls: one cache
//! line moves per message, as in a flag ping-pong. (Version 2 published a
//! head index on a line of its own and kept a 64-byte header apart from
//! the datagram: three lines per message, and the ring alone took ~2x a
//! flag's one-way time.)
//!
//! The slot kinds (all integers in the header in host byte order, the
//! extensions little-endian):
//!
//! - [`KIND_DATAGRAM`]: a datagram (`ext` is 0).
//! - [`KIND_TRAIN`]: a train's ONLY packet, then its [`TrainDesc`]: `npkts
//!   u32, count u32`, then `count` pieces of `token u64, offset u64, len
//!   u32` (20 bytes each), `1 <= count <=` [`TRAIN_MAX_PIECES`]. Token
//!   [`PROCESS_TOKEN`] (0) names the producer process's own address
//!   space: `offset` is an address there.
//! - [`KIND_FORGET`]: no datagram (`len` 0); the extension is a list of
//!   buffer tokens (u64 each, at most [`FORGET_MAX`]) the producer no
//!   longer refers to: the consumer unmaps them.
//! - [`KIND_CAPS`]: no datagram (`len` 0); the extension is a capability
//!   word (u32) the producer learnt after the rendezvous.
//!
//! Which buffer a token names, how the consumer gets it, and what the
//! capabilities mean is the link's business (`shm/trains.rs`,
//! `shm/hello.rs`).
//!
//! The producer fills slot `i % SLOTS` (its `i` a free-running u64
//! count) and publishes it with a release store of `i + 1` into the
//! slot's `seq`; the consumer waits for the `seq` it expects with acquire,
//! copies the slot out, and frees what it read with a release store of
//! its count into `tail` (when it finds the ring empty, and at least every
//! [`FREE_EVERY`] slots).
//!
//! # Trust
//!
//! The peer process writes this memory concurrently and may be hostile or
//! broken. Each side keeps its own count privately and only *writes* it
//! into the region. What is read from the peer is checked: the `tail`
//! (`0 <= head - tail <= SLOTS`); a slot's `seq`, which is either the one
//! expected (published), or what a correct producer left there a lap
//! before (or 0 on the first lap; not yet published), or else proof of a
//! broken peer; slot positions are always taken modulo [`SLOTS`] from the
//! private count; the header is read once, as two words (`len`/`ext`,
//! then `kind`/`flags`/ports), and the lengths (datagram plus extension),
//! kind and flags are checked on those private copies against
//! [`MAX_PAYLOAD`] and the known values before any byte is copied; the
//! addresses and bytes are copied out once into private memory, and only
//! that copy is used: extensions are parsed from it ([`TrainDesc::decode`],
//! [`decode_forget`]), the engine sees only it. Nothing is read from the
//! slot twice, so a peer changing a slot mid-read can only change what we
//! read, never where or how much. The memfd is sealed against shrinking
//! (checked on open), so the peer cannot truncate it under us (SIGBUS).
//!
//! # Memory model
//!
//! Every access of this module to the region, in either direction, is an
//! atomic load or store of an aligned word (no Rust reference to the
//! region's bytes is ever created, only `AtomicU64`/`AtomicU32` views of
//! single words): the peer may write any byte at any time, and a plain
//! or volatile access racing with a write is undefined behaviour in the
//! Rust memory model (volatile says nothing about concurrency), which
//! would let the compiler assume, for example, that two reads of a slot
//! agree. The ordering that matters is on the `seq` (release by the
//! producer, acquire by the consumer), `tail` (release, acquire) and
//! `sleep` (with SeqCst fences) words; the header, address and byte
//! words are relaxed. Datagrams are copied in and out word by word (u64):
//! on x86-64 a relaxed atomic load or store is a plain `mov`, so this
//! costs only the wider SIMD copies the compiler may not use for atomics
//! (measured with `ring_pingpong` in `docs/testing.md`).
//!
//! Each word has one size, which a peer (and the tests, playing one) uses
//! too: `seq` u32 at +0, `len`/`ext` one u32 at +4, `kind` to `dst_port`
//! one u64 at +8, and u64 words from +16 to the end of the slot; the
//! control words as in the table. The ring's tests run under Miri, which
//! checks every access for data races, on a region in private memory
//! (Miri cannot map a memfd): see `docs/testing.md`.

mod ext;

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::sys;
use super::wire::SlotHeader;
pub use crate::soft::proto::train::TRAIN_MAX_PIECES;
use zerocopy::IntoBytes;

pub use ext::{decode_forget, encode_forget, DescPiece, TrainDesc};

/// Slots per ring (a power of two).
pub const SLOTS: u64 = 512;
/// Largest datagram a slot carries: a RoCEv2 packet at MTU 4096 with
/// every header (the UDP link's limit).
pub const MAX_PAYLOAD: usize = 4096 + 256;
/// Bytes of a slot's fixed header (`wire::SlotHeader`); the addresses, when
/// the slot carries them, follow it.
const SLOT_HDR: usize = SlotHeader::LEN;
/// Where a slot's bytes start when it carries its addresses.
const SLOT_DATA_ADDRS: usize = SLOT_HDR + 32;
/// Bytes per slot (the longest slot, rounded up to whole cache lines).
pub const SLOT_LEN: usize = (SLOT_DATA_ADDRS + MAX_PAYLOAD).div_ceil(64) * 64;
/// Control block before the slots of a ring.
const RING_CTRL: usize = 4096;
/// Bytes per ring.
pub const RING_LEN: usize = RING_CTRL + SLOTS as usize * SLOT_LEN;
/// Bytes of the whole region.
pub const REGION_LEN: usize = 4096 + 2 * RING_LEN;

const MAGIC: u64 = u64::from_le_bytes(*b"SVSHMRG1");
/// 3: publication by a sequence word in each slot, a 16-byte header,
/// addresses only when they change (2: a head index, a 64-byte header).
const VERSION: u32 = 3;

/// Slot flag: the slot carries its source and destination addresses
/// (otherwise they are those of the ring's previous slot).
pub const FLAG_ADDRS: u16 = 1;
/// Slot kind: a datagram.
pub const KIND_DATAGRAM: u16 = 0;
/// Slot kind: a train (ONLY packet, then a [`TrainDesc`]).
pub const KIND_TRAIN: u16 = 1;
/// Slot kind: tokens the consumer may unmap.
pub const KIND_FORGET: u16 = 2;
/// Slot kind: a capability word (u32 LE extension, no datagram).
pub const KIND_CAPS: u16 = 3;
/// The token of a descriptor piece in the producer process's own address
/// space (`offset` is the address), not in an exported buffer.
pub const PROCESS_TOKEN: u64 = 0;
/// Most tokens one forget slot carries.
pub const FORGET_MAX: usize = MAX_PAYLOAD / 8;
/// Bytes of one piece in a train descriptor.
const DESC_PIECE: usize = 20;
/// Bytes of a train descriptor's header.
const DESC_HDR: usize = 8;
/// Longest train descriptor.
pub const DESC_MAX: usize = DESC_HDR + TRAIN_MAX_PIECES * DESC_PIECE;
const OFF_TAIL: usize = 128;
const OFF_SLEEP: usize = 256;
/// The consumer frees what it read at least this often (and whenever it
/// finds the ring empty).
pub const FREE_EVERY: u64 = SLOTS / 8;

/// Offset of ring `r`'s tail index in the region.
pub fn tail_offset(r: usize) -> u64 {
    (4096 + r * RING_LEN + OFF_TAIL) as u64
}

/// Offset of slot `i` (taken modulo [`SLOTS`]) of ring `r`; its header
/// is laid out as [`slot_header`] builds it.
pub fn slot_offset(r: usize, i: u64) -> u64 {
    (4096 + r * RING_LEN + RING_CTRL) as u64 + (i % SLOTS) * SLOT_LEN as u64
}

/// The `seq` word that publishes slot `i` (its count, not its position).
fn seq_of(i: u64) -> u32 {
    i.wrapping_add(1) as u32
}

/// The 16 header bytes of slot `i` as a producer writes them (`seq`
/// included; for tests and tools that play a peer writing the region by
/// hand). Addresses, if `flags` has [`FLAG_ADDRS`], follow at byte 16.
pub fn slot_header(i: u64, len: u16, ext: u16, kind: u16, flags: u16, meta: &SlotMeta) -> [u8; SLOT_HDR] {
    let h = SlotHeader {
        seq: seq_of(i),
        len,
        ext,
        kind,
        flags,
        src_port: meta.src_port,
        dst_port: meta.dst_port,
    };
    let mut b = [0u8; SLOT_HDR];
    b.copy_from_slice(h.as_bytes());
    b
}

const _: () = assert!(SLOTS.is_power_of_two());
const _: () = assert!(SLOT_LEN.is_multiple_of(64) && MAX_PAYLOAD.is_multiple_of(8));
// Lengths fit the header's u16 words.
const _: () = assert!(MAX_PAYLOAD <= u16::MAX as usize);
const _: () = assert!(RING_LEN.is_multiple_of(4096));

/// The aligned `u64` of the region at `p`, as an atomic: the only way
/// this module reads or writes the region's words.
///
/// # Safety
///
/// `p` is 8-aligned and its 8 bytes lie inside a region that outlives
/// `'a`. (Every access to the word, ours and a correct peer's, is atomic
/// and of this size: see the module's docs.)
unsafe fn at64<'a>(p: *mut u8) -> &'a AtomicU64 {
    // SAFETY: aligned, valid for reads and writes for 'a (the caller's
    // promise); concurrent accesses are atomic.
    unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }
}

/// Copies `words` u64 words from the region at `src` into private memory
/// at `dst`, each with one relaxed atomic load: a peer writing them
/// meanwhile changes what we copy, and nothing else.
///
/// # Safety
///
/// `src` is 8-aligned and `src..src + 8 * words` lies inside a live
/// region; `dst..dst + 8 * words` is private memory we may write (any
/// alignment), not in the region.
unsafe fn load_words(src: *mut u8, dst: *mut u8, words: usize) {
    for k in 0..words {
        // SAFETY: word `k` is inside the source range, 8-aligned (the
        // caller's promise).
        let w = unsafe { at64(src.add(8 * k)) }.load(Ordering::Relaxed);
        // SAFETY: inside the destination range (the caller's promise).
        unsafe { dst.add(8 * k).cast::<u64>().write_unaligned(w) };
    }
}

/// Stores the bytes of `parts`, one after the other, into the region at
/// `dst` as u64 words, each with one relaxed atomic store; the last word
/// is padded with zeros. Returns the words stored (`total.div_ceil(8)`).
///
/// # Safety
///
/// `dst` is 8-aligned and the region holds `total.div_ceil(8)` words from
/// it, `total` the parts' summed length.
unsafe fn store_words<'p>(dst: *mut u8, parts: impl IntoIterator<Item = &'p [u8]>) -> usize {
    let mut k = 0;
    let mut put = |w: u64| {
        // SAFETY: one of the total.div_ceil(8) words the caller vouched
        // for: each call stores the next of them, for 8 bytes of the
        // parts (or the last, padded, bytes).
        unsafe { at64(dst.add(8 * k)) }.store(w, Ordering::Relaxed);
        k += 1;
    };
    // A word being assembled across parts: `fill` bytes of `acc`.
    let (mut acc, mut fill) = ([0u8; 8], 0);
    for part in parts {
        let mut p = part;
        if fill > 0 {
            let n = (8 - fill).min(p.len());
            acc[fill..fill + n].copy_from_slice(&p[..n]);
            fill += n;
            p = &p[n..];
            if fill < 8 {
                continue;
            }
            // (`fill` is set again below, for what follows the word.)
            put(u64::from_ne_bytes(acc));
        }
        let mut words = p.chunks_exact(8);
        for w in &mut words {
            put(u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])));
        }
        let rest = words.remainder();
        acc[..rest.len()].copy_from_slice(rest);
        fill = rest.len();
    }
    if fill > 0 {
        acc[fill..].fill(0);
        put(u64::from_ne_bytes(acc));
    }
    k
}

/// [`at64`] for an aligned `u32`.
///
/// # Safety
///
/// As [`at64`], 4-aligned, 4 bytes.
unsafe fn at32<'a>(p: *mut u8) -> &'a AtomicU32 {
    // SAFETY: as in `at64`.
    unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
}

/// A mapped channel region.
#[derive(Debug)]
pub struct Region {
    mem: Mem,
}

/// What holds a region's bytes.
#[derive(Debug)]
enum Mem {
    /// The channel's memfd, mapped shared.
    Shared { map: MmapRaw, file: File },
    /// Private memory standing in for the mapping: the tests' region
    /// under Miri, which cannot map a memfd (see [`Region::in_heap`]).
    #[cfg(test)]
    Heap(std::sync::Arc<[AtomicU64]>),
}

impl Region {
    /// Creates a new region in a sealed memfd.
    ///
    /// # Errors
    ///
    /// Failure to create, size, seal or map the memfd.
    pub fn create() -> io::Result<Region> {
        let file = sys::memfd("softverbs-shm")?;
        file.set_len(REGION_LEN as u64)?;
        sys::seal_size(&file)?;
        let region = Self::map(file)?;
        region.format();
        Ok(region)
    }

    /// Writes the header page's format words.
    fn format(&self) {
        let base = self.base();
        // SAFETY: the words lie in the header page, inside the region
        // (REGION_LEN bytes from `base`), aligned for their size (`base`
        // is 8-aligned); the region lives as long as `self`.
        unsafe {
            at64(base).store(MAGIC, Ordering::Relaxed);
            at32(base.add(8)).store(VERSION, Ordering::Relaxed);
            at32(base.add(12)).store(SLOTS as u32, Ordering::Relaxed);
            at32(base.add(16)).store(SLOT_LEN as u32, Ordering::Relaxed);
        }
    }

    /// Maps a region received from a peer, after checking that it cannot
    /// shrink under us (sealed), has the full size, and carries our
    /// format.
    ///
    /// # Errors
    ///
    /// `InvalidData` for an unsealed, short or foreign region; mapping
    /// errors.
    pub fn open(file: File) -> io::Result<Region> {
        let seals = sys::seals(&file)?;
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "shm region is not sealed"));
        }
        if file.metadata()?.len() < REGION_LEN as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "shm region too short"));
        }
        let region = Self::map(file)?;
        let base = region.base();
        // SAFETY: the header page lies inside the mapping (length checked
        // above, and it cannot shrink: sealed), which lives as long as
        // `region`; aligned atomic loads (the peer may be writing).
        let (magic, version, slots, slot_len) = unsafe {
            (
                at64(base).load(Ordering::Relaxed),
                at32(base.add(8)).load(Ordering::Relaxed),
                at32(base.add(12)).load(Ordering::Relaxed),
                at32(base.add(16)).load(Ordering::Relaxed),
            )
        };
        if magic != MAGIC || version != VERSION || u64::from(slots) != SLOTS || slot_len as usize != SLOT_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shm region of another format",
            ));
        }
        Ok(region)
    }

    fn map(file: File) -> io::Result<Region> {
        // Prefaulted: otherwise the first lap of each ring takes a page
        // fault per slot on both sides (~5 µs per message for the first
        // 512 messages each way); this costs ~1 ms once per channel.
        let map = MmapOptions::new()
            .len(REGION_LEN)
            .populate()
            .map_raw(file.as_raw_fd())?;
        Ok(Region {
            mem: Mem::Shared { map, file },
        })
    }

    /// A region in private memory, formatted as [`Region::create`] does:
    /// for tests that run under Miri, which cannot map a memfd (the ring
    /// code does not tell the two apart). [`Region::alias`] gives the
    /// peer's view of it.
    #[cfg(test)]
    pub(crate) fn in_heap() -> Region {
        let words = std::sync::Arc::<[AtomicU64]>::new_zeroed_slice(REGION_LEN / 8);
        // SAFETY: zero bytes are a valid AtomicU64.
        let words = unsafe { words.assume_init() };
        let region = Region { mem: Mem::Heap(words) };
        region.format();
        region
    }

    /// A second view of the same memory, as the peer has it (the memfd
    /// opened again, or the same private memory): for tests.
    #[cfg(test)]
    pub(crate) fn alias(&self) -> Region {
        match &self.mem {
            Mem::Shared { file, .. } => Region::open(file.try_clone().expect("dup the memfd")).expect("open the memfd"),
            Mem::Heap(words) => Region {
                mem: Mem::Heap(std::sync::Arc::clone(words)),
            },
        }
    }

    /// The memfd (to pass to the peer, or for a test to scribble on).
    ///
    /// # Panics
    ///
    /// Only for a test's region in private memory, which has none.
    pub fn file(&self) -> &File {
        match &self.mem {
            Mem::Shared { file, .. } => file,
            #[cfg(test)]
            Mem::Heap(_) => panic!("a test region in private memory has no memfd"),
        }
    }

    /// The first byte of the region: page-aligned for a mapping,
    /// 8-aligned for a test's private memory; `REGION_LEN` bytes follow.
    fn base(&self) -> *mut u8 {
        match &self.mem {
            Mem::Shared { map, .. } => map.as_mut_ptr(),
            // Written through: the words are atomics (interior
            // mutability). `Arc::as_ptr` makes no reference to the whole
            // slice (which Miri would retag, 4.5 MiB, on every access).
            #[cfg(test)]
            Mem::Heap(words) => std::sync::Arc::as_ptr(words).cast::<u8>().cast_mut(),
        }
    }

    /// Pointer to byte `off` of ring `r`'s block.
    fn ring_ptr(&self, r: usize, off: usize) -> *mut u8 {
        debug_assert!(r < 2 && off < RING_LEN);
        // SAFETY: 4096 + r * RING_LEN + off < REGION_LEN for r < 2 and
        // off < RING_LEN, so the result stays inside the mapping.
        unsafe { self.base().add(4096 + (r & 1) * RING_LEN + off % RING_LEN) }
    }

    fn index(&self, r: usize, off: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned (8-aligned base, ring blocks of whole pages,
        // `off` is OFF_TAIL), in the region, which lives as long as `self`.
        unsafe { at64(self.ring_ptr(r, off)) }
    }

    fn sleep_flag(&self, r: usize) -> &AtomicU32 {
        // SAFETY: as in `index`.
        unsafe { at32(self.ring_ptr(r, OFF_SLEEP)) }
    }

    fn slot_ptr(&self, r: usize, i: u64) -> *mut u8 {
        self.ring_ptr(r, RING_CTRL + (i % SLOTS) as usize * SLOT_LEN)
    }

    /// The `seq` word of slot `i` of ring `r`.
    fn seq_word(&self, r: usize, i: u64) -> &AtomicU32 {
        // SAFETY: as in `index`: a slot starts on a 64-byte boundary of
        // its ring (RING_CTRL and SLOT_LEN are multiples of 64) inside the
        // region, which lives as long as `self`.
        unsafe { at32(self.slot_ptr(r, i)) }
    }
}

/// Metadata of a datagram in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMeta {
    /// Source address (the sender's GID as an address).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn ip_of(b: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(b);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Why a push failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// Every slot is in use: retry later.
    Full,
    /// The datagram is longer than [`MAX_PAYLOAD`].
    TooLong,
    /// The consumer's index is impossible: the peer is broken.
    Corrupt,
}

/// The writing end of one ring.
#[derive(Debug)]
pub struct Producer {
    ring: usize,
    head: u64,
    tail: u64,
    /// The addresses the last slot written carried or inherited.
    addrs: Option<(IpAddr, IpAddr)>,
}

impl Producer {
    /// The producer of ring `ring` of a fresh region.
    pub fn new(ring: usize) -> Producer {
        Producer {
            ring: ring & 1,
            head: 0,
            tail: 0,
            addrs: None,
        }
    }

    /// A producer continuing ring `ring` of a live region where it stands
    /// (after the consumer's published tail, the slots published since):
    /// for tests and tools that play a peer writing a ring while its real
    /// producer is silent.
    pub fn resume(region: &Region, ring: usize) -> Producer {
        let ring = ring & 1;
        let tail = region.index(ring, OFF_TAIL).load(Ordering::Acquire);
        let mut head = tail;
        while head - tail < SLOTS && region.seq_word(ring, head).load(Ordering::Acquire) == seq_of(head) {
            head += 1;
        }
        Producer {
            ring,
            head,
            tail,
            addrs: None,
        }
    }

    /// Free slots, reading the consumer's index again when fewer than
    /// `want` are known free.
    ///
    /// # Errors
    ///
    /// [`PushError::Corrupt`] if the consumer's index is impossible.
    pub fn room(&mut self, region: &Region, want: u64) -> Result<u64, PushError> {
        if SLOTS - (self.head - self.tail) < want {
            let tail = region.index(self.ring, OFF_TAIL).load(Ordering::Acquire);
            // Untrusted: the consumer can only have freed what we filled.
            if tail > self.head || self.head - tail > SLOTS {
                return Err(PushError::Corrupt);
            }
            self.tail = tail;
        }
        Ok(SLOTS - (self.head - self.tail))
    }

    /// Copies one datagram into the next slot and publishes it.
    ///
    /// # Errors
    ///
    /// [`PushError`]; nothing was written then.
    pub fn push(&mut self, region: &Region, meta: &SlotMeta, data: &[u8]) -> Result<(), PushError> {
        self.push_ext(region, meta, KIND_DATAGRAM, data, &[])
    }

    /// Copies a slot of kind `kind` (`data`, then the extension `ext`)
    /// into the next slot and publishes it.
    ///
    /// # Errors
    ///
    /// [`PushError`]; nothing was written then.
    pub fn push_ext(
        &mut self,
        region: &Region,
        meta: &SlotMeta,
        kind: u16,
        data: &[u8],
        ext: &[u8],
    ) -> Result<(), PushError> {
        self.push_parts(region, meta, kind, &[data], ext)
    }

    /// [`Producer::push_ext`] with the slot's bytes before the extension
    /// given in pieces (`parts`, one after the other): a datagram is
    /// copied into the slot straight from where its pieces are.
    ///
    /// # Errors
    ///
    /// [`PushError`]; nothing was written then.
    pub fn push_parts(
        &mut self,
        region: &Region,
        meta: &SlotMeta,
        kind: u16,
        parts: &[&[u8]],
        ext: &[u8],
    ) -> Result<(), PushError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len + ext.len() > MAX_PAYLOAD {
            return Err(PushError::TooLong);
        }
        if self.room(region, 1)? == 0 {
            return Err(PushError::Full);
        }
        let slot = region.slot_ptr(self.ring, self.head);
        let same = self.addrs == Some((meta.src, meta.dst));
        let (flags, at) = if same {
            (0, SLOT_HDR)
        } else {
            (FLAG_ADDRS, SLOT_DATA_ADDRS)
        };
        // Lengths fit u16: checked above against MAX_PAYLOAD.
        let (lens, rest) = SlotHeader {
            seq: seq_of(self.head),
            len: len as u16,
            ext: ext.len() as u16,
            kind,
            flags,
            src_port: meta.src_port,
            dst_port: meta.dst_port,
        }
        .words();
        // SAFETY: `slot` starts a SLOT_LEN-byte slot inside the region
        // (index taken modulo SLOTS), 64-byte aligned; every store below
        // is an aligned atomic one inside it: the header after the `seq`
        // word (u32 at 4, u64 at 8), the addresses (u64s at 16..48), and
        // the bytes as u64 words from `at` (16 or 48), which end at most
        // at `SLOT_DATA_ADDRS + MAX_PAYLOAD <= SLOT_LEN` (len + ext <=
        // MAX_PAYLOAD, checked above, and MAX_PAYLOAD is a whole number of
        // words). Atomic, because the peer may access the slot meanwhile
        // (a broken one): that garbles what it reads, and nothing here.
        unsafe {
            at32(slot.add(SlotHeader::LENS)).store(lens, Ordering::Relaxed);
            at64(slot.add(SlotHeader::REST)).store(rest, Ordering::Relaxed);
            if !same {
                let (src, dst) = (ip16(meta.src), ip16(meta.dst));
                store_words(slot.add(SLOT_HDR), [&src[..], &dst[..]]);
            }
            store_words(slot.add(at), parts.iter().copied().chain([ext]));
        }
        region
            .seq_word(self.ring, self.head)
            .store(seq_of(self.head), Ordering::Release);
        self.head += 1;
        self.addrs = Some((meta.src, meta.dst));
        crate::soft::probe::mark(crate::soft::probe::Point::TxLink);
        Ok(())
    }

    /// `(slots published, slots known freed)`.
    pub fn position(&self) -> (u64, u64) {
        (self.head, self.tail)
    }

    /// After publishing in ring `ring`: whether its consumer said it is
    /// going to sleep (then the caller rings its doorbell). Pairs with
    /// [`Consumer::prepare_sleep`] (store flag, fence, load `seq`). Reads
    /// no producer state, so its caller needs no lock on the producer.
    pub fn consumer_sleeping(region: &Region, ring: usize) -> bool {
        fence(Ordering::SeqCst);
        region.sleep_flag(ring).load(Ordering::Relaxed) != 0
    }
}

/// Cache lines of a slot [`Consumer::prefetch_next`] fetches: a train's
/// header, ONLY packet and one-piece descriptor take two; the third
/// covers a slot that carries its addresses.
const PREFETCH_LINES: usize = 3;

/// A prefetch of the line at `p` into every cache level (no effect off
/// x86-64, and under Miri, which has no such instruction).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHT0 is a hint that reads nothing the program sees
    // and never faults, whatever the address; `p` points into the region
    // anyway (a slot of it).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// What [`Consumer::pop`] (a reader of datagrams only) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Popped {
    /// A datagram, now in the caller's buffer.
    Datagram(SlotMeta),
    /// A slot with an impossible length, or of another kind than
    /// [`KIND_DATAGRAM`]: skipped.
    BadLength,
}

/// What [`Consumer::pop_slot`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A datagram, now the caller's buffer.
    Datagram(SlotMeta),
    /// A train: the caller's buffer holds its ONLY packet (the first
    /// `usize` bytes), then its descriptor ([`TrainDesc::decode`]).
    Train(SlotMeta, usize),
    /// Tokens to forget: the caller's buffer holds them
    /// ([`decode_forget`]).
    Forget,
    /// A capability word: the caller's buffer holds it (4 bytes).
    Caps,
    /// An impossible length or an unknown kind: skipped.
    Bad,
}

/// The reading end of one ring.
#[derive(Debug)]
pub struct Consumer {
    ring: usize,
    /// Slots read.
    tail: u64,
    /// Slots freed: the tail last published.
    freed: u64,
    /// The producer published an impossible `seq`: stop reading.
    broken: bool,
    sleeping: bool,
    /// The addresses of the last slot read (what a slot without
    /// [`FLAG_ADDRS`] has).
    addrs: (IpAddr, IpAddr),
    /// `addrs` changed (or are the initial ones) since
    /// [`Consumer::take_fresh`] last ran.
    fresh: bool,
}

impl Consumer {
    /// The consumer of ring `ring` of a fresh region.
    pub fn new(ring: usize) -> Consumer {
        Consumer {
            ring: ring & 1,
            tail: 0,
            freed: 0,
            broken: false,
            sleeping: false,
            addrs: (IpAddr::V6(Ipv6Addr::UNSPECIFIED), IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            fresh: true,
        }
    }

    /// Whether the addresses of the slots read changed since the last
    /// call (true on the first): a reader that checks them may keep its
    /// verdict until they do, since a slot without [`FLAG_ADDRS`] has the
    /// addresses of the one before.
    pub fn take_fresh(&mut self) -> bool {
        std::mem::replace(&mut self.fresh, false)
    }

    /// `(slots read, slots freed)`.
    pub fn position(&self) -> (u64, u64) {
        (self.tail, self.freed)
    }

    /// Whether the producer published an impossible `seq` (the consumer
    /// then reads nothing more).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether the next slot is published; `None` if its `seq` is one no
    /// correct producer writes (the ring is then broken). Frees what was
    /// read when the ring turns out empty.
    fn ready(&mut self, region: &Region) -> Option<bool> {
        if self.broken {
            return None;
        }
        let seq = region.seq_word(self.ring, self.tail).load(Ordering::Acquire);
        if seq == seq_of(self.tail) {
            return Some(true);
        }
        // Not yet: the slot holds what it was published with a lap before
        // (nothing on the first lap).
        let before = if self.tail < SLOTS {
            0
        } else {
            seq_of(self.tail - SLOTS)
        };
        if seq != before {
            self.broken = true;
            return None;
        }
        if self.freed != self.tail {
            self.publish_tail(region);
        }
        Some(false)
    }

    /// Whether a slot is ready (or the ring just turned out broken).
    pub fn has_data(&mut self, region: &Region) -> bool {
        !matches!(self.ready(region), Some(false))
    }

    /// Copies the next datagram into `buf` (replacing its contents); slots
    /// of other kinds are skipped as [`Popped::BadLength`].
    /// `Ok(None)`: the ring is empty. `Err(())`: the producer published an
    /// impossible `seq`; the ring is broken for good.
    #[allow(clippy::result_unit_err)]
    pub fn pop(&mut self, region: &Region, buf: &mut Vec<u8>) -> Result<Option<Popped>, ()> {
        Ok(self.pop_slot(region, buf)?.map(|s| match s {
            Slot::Datagram(m) => Popped::Datagram(m),
            _ => Popped::BadLength,
        }))
    }

    /// Copies the next slot's bytes (datagram and extension) into `buf`
    /// (replacing its contents) and says what they are.
    /// `Ok(None)`: the ring is empty. `Err(())`: the producer published an
    /// impossible `seq`; the ring is broken for good.
    #[allow(clippy::result_unit_err)]
    pub fn pop_slot(&mut self, region: &Region, buf: &mut Vec<u8>) -> Result<Option<Slot>, ()> {
        match self.ready(region) {
            None => return Err(()),
            Some(false) => return Ok(None),
            Some(true) => {}
        }
        let slot = region.slot_ptr(self.ring, self.tail);
        // SAFETY: `slot` starts a slot inside the region (index modulo
        // SLOTS), 64-byte aligned; the header words (u32 at 4, u64 at 8)
        // are aligned, within its first 16 bytes. Ordered after the
        // acquire load of `seq` in `ready`.
        let (lens, rest) = unsafe {
            (
                at32(slot.add(SlotHeader::LENS)).load(Ordering::Relaxed),
                at64(slot.add(SlotHeader::REST)).load(Ordering::Relaxed),
            )
        };
        // From here on only the private copies of the words are used
        // (`seq` was checked in `ready`).
        let h = SlotHeader::from_words(0, lens, rest);
        let (len, ext) = (usize::from(h.len), usize::from(h.ext));
        let (kind, flags) = (h.kind, h.flags);
        let (src_port, dst_port) = (h.src_port, h.dst_port);
        self.tail += 1;
        crate::soft::probe::mark(crate::soft::probe::Point::RxLink);
        // Checked on our private copies of the words, once.
        let sane = len + ext <= MAX_PAYLOAD
            && flags & !FLAG_ADDRS == 0
            && match kind {
                KIND_DATAGRAM => ext == 0,
                KIND_TRAIN => true,
                KIND_FORGET => len == 0,
                KIND_CAPS => len == 0 && ext == 4,
                _ => false,
            };
        if !sane {
            self.publish_tail(region);
            return Ok(Some(Slot::Bad));
        }
        let total = len + ext;
        let at = if flags & FLAG_ADDRS != 0 {
            let mut a = [0u8; 32];
            // SAFETY: four aligned u64 words at 16..48 of the slot, inside
            // it as above, into the private array (32 bytes).
            unsafe { load_words(slot.add(SLOT_HDR), a.as_mut_ptr(), 4) };
            let (src, dst) = a.split_at(16);
            let ip = |b: &[u8]| ip_of(b.try_into().unwrap_or([0; 16]));
            self.addrs = (ip(src), ip(dst));
            self.fresh = true;
            SLOT_DATA_ADDRS
        } else {
            SLOT_HDR
        };
        // Whole words: the last may carry bytes past `total`, still in
        // the slot, which the length below leaves out.
        let words = total.div_ceil(8);
        // No zero fill: the copy below initializes the first `total` bytes.
        buf.clear();
        buf.reserve(8 * words);
        // SAFETY: the words start at `at` (16 or 48: 8-aligned) and end at
        // most at SLOT_DATA_ADDRS + MAX_PAYLOAD <= SLOT_LEN (total <=
        // MAX_PAYLOAD checked above on our private copies of the lengths,
        // and MAX_PAYLOAD is a whole number of words), inside the slot;
        // into `buf`, which has room for them (reserved) and does not
        // overlap the region; its length is set once the `total <= 8 *
        // words` bytes are written. One copy into private memory, which is
        // all the engine ever sees: a peer writing the slot meanwhile
        // garbles the copy, never its bounds.
        unsafe {
            load_words(slot.add(at), buf.as_mut_ptr(), words);
            buf.set_len(total);
        }
        if self.tail - self.freed >= FREE_EVERY {
            self.publish_tail(region);
        }
        let meta = SlotMeta {
            src: self.addrs.0,
            dst: self.addrs.1,
            src_port,
            dst_port,
        };
        Ok(Some(match kind {
            KIND_DATAGRAM => Slot::Datagram(meta),
            KIND_TRAIN => Slot::Train(meta, len),
            KIND_CAPS => Slot::Caps,
            _ => Slot::Forget,
        }))
    }

    /// Asks the CPU to fetch the first `PREFETCH_LINES` cache lines of
    /// the next slot (its `seq`, header and, for a train, the descriptor)
    /// without waiting for them. The producer wrote them on its core, so
    /// reading them costs a line transfer between cores each; a reader
    /// about to spend a while on other memory (a train's copy) hides that
    /// transfer behind it, and finds the slot in its cache when it polls
    /// next. A prefetch is only a hint: it never faults, and a line the
    /// producer writes afterwards is simply fetched again.
    pub fn prefetch_next(&self, region: &Region) {
        let slot = region.slot_ptr(self.ring, self.tail);
        for line in 0..PREFETCH_LINES {
            prefetch(slot.wrapping_add(64 * line));
        }
    }

    fn publish_tail(&mut self, region: &Region) {
        region.index(self.ring, OFF_TAIL).store(self.tail, Ordering::Release);
        self.freed = self.tail;
    }

    /// Announces that the reader is going to sleep; returns whether it
    /// may (`false`: data is already there). The producer rings the
    /// doorbell for anything it publishes after this.
    pub fn prepare_sleep(&mut self, region: &Region) -> bool {
        self.sleeping = true;
        region.sleep_flag(self.ring).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        !self.has_data(region)
    }

    /// The reader is awake again (cheap when it never slept).
    pub fn wake(&mut self, region: &Region) {
        if self.sleeping {
            self.sleeping = false;
            region.sleep_flag(self.ring).store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;
