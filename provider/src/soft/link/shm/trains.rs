//! Trains on the shared-memory link (see the parent module's "Trains"):
//! passing the sender's buffers to the receiver, the receiver's mapping
//! table, and handing a received train to the engine.
//!
//! *Export.* The first time a train uses a buffer's file (its own memfd,
//! or the slab it was carved from: [`crate::verbs::SharedMemory`]) on a
//! channel, the sender passes the memfd over the channel's unix socket
//! (SCM_RIGHTS) in a 32-byte message: `SVSHMFD1`, the file's token (unique
//! in the sending process, never reused) and its length, then publishes
//! the slot. Descriptor offsets are offsets in the file. Below, "buffer"
//! means such a file.
//! The message is thus queued in the receiver's socket before the
//! receiver can see the slot, and reading it never blocks. A full socket
//! leaves the train in the channel's backlog, in order. The slot ([`ring`],
//! kind train) holds the ONLY packet and a descriptor: `npkts`, and per
//! piece (at most [`TRAIN_MAX_PIECES`](ring::TRAIN_MAX_PIECES)) token,
//! offset and length.
//!
//! *Mapping table.* A channel keeps at most [`EXPORT_MAX`] buffers exported
//! and mapped. The sender decides: before exporting past the limit, and
//! about every [`PRUNE_NS`] for buffers freed meanwhile, it publishes a
//! forget slot naming tokens the receiver unmaps (freed buffers first,
//! then the least recently used); a buffer forgotten and used again is
//! exported again. Since forget slots travel in the ring, in order with
//! the trains, the receiver never unmaps a buffer a later slot still
//! needs, and it reads buffer messages only up to the one it needs, so
//! its table never outgrows the sender's. A freed buffer's memory stays
//! mapped by the peer until the sender's next prune or export (about
//! [`PRUNE_NS`] while the sender's device runs receive turns) and the
//! peer reads the forget slot; everything is unmapped when the channel
//! ends. With more than [`EXPORT_MAX`] buffers in use in turn, trains
//! keep working but re-export buffers (a system call and an mmap each);
//! a process has at most [`SHARE_MAX_LIVE`](crate::verbs::memory::SHARE_MAX_LIVE)
//! shareable files alive, so this takes freed and reallocated ones.
//!
//! *Trust.* The receiver parses the descriptor from its private copy of
//! the slot: the piece count is capped, the lengths must add up to a
//! message (2^31 bytes at most), every token must name a buffer the peer
//! passed (looked up in the socket if it is new), and every piece must
//! lie in its mapping. A passed descriptor is accepted only if it is a
//! memfd sealed against shrinking and growing (`F_GET_SEALS`) of the
//! announced size (`fstat`), so that the read-only mapping can never
//! fault; extra descriptors are closed. A buffer message that is
//! malformed, carries no usable memfd, cannot be mapped, exceeds twice
//! [`EXPORT_MAX`] mapped buffers, or the device's limits
//! ([`ShmLimits`](super::ShmLimits), also `shm_refused_limit`), ends the
//! channel (`shm_rx_bad_export`):
//! trains from that buffer could never be read, and the sender would not
//! know. Any other fault (descriptor, unknown token, piece out of its
//! buffer) drops the train (`shm_rx_bad_train`). The peer
//! can still change the bytes while they are copied, as any RDMA sender
//! writing its buffer during a transfer can: that garbles the message,
//! never its bounds.
//!
//! *Process memory (CMA).* A piece with token [`PROCESS_TOKEN`](ring::PROCESS_TOKEN)
//! (0; buffer tokens start at 1) is `len` bytes at address `offset` of the
//! sender process. The sender builds such pieces only towards a channel
//! whose peer verified it can read this process (`cma_tx`, learnt from the
//! answer or the caps slot), and the receiver accepts them only on a
//! channel where it verified that itself (`cma_rx`) and only while the
//! process it verified is alive (its pidfd, opened at the rendezvous from
//! the `SO_PEERCRED` pid: a pid recycled after the peer died is never
//! read); otherwise the train is dropped (`shm_rx_bad_train`). A piece
//! whose `offset + len` wraps is refused when the descriptor is parsed.
//! Nothing else is checked here, and nothing needs to be: the engine
//! copies such a piece with `process_vm_readv(pid, local = destination,
//! remote = piece)`, where the destination is the range the responder
//! already validated against the rkey or the receive buffer, and the
//! kernel reads only the *peer's* address space and checks every page of
//! it. So a hostile sender can only make us copy its own memory (which it
//! could send as packets anyway) into a range it was allowed to write;
//! an address it does not have mapped fails the copy. The sender's memory
//! must stay valid until the work request completes, which is the verbs
//! contract for registered memory; the receiver reads it before it
//! acknowledges, i.e. before the work request can complete. A copy that
//! fails (the range was unmapped by an application that deregistered
//! with work in flight, the peer died, its ptrace protection changed) is
//! an error of the responder's placement: the responder answers as for
//! an access fault (NAK, both QPs in error; the requester's work request
//! completes with an error). Unlike a memfd mapping, a process range is
//! not kept alive by the train: an application that deregisters and
//! frees a buffer with a train in flight may have the peer copy whatever
//! the address holds then (its own memory, into the destination of that
//! work request). `shm_tx_trains_cma` and `shm_rx_trains_cma` count these
//! trains.
//!
//! A train whose destination has no train-capable channel any more (the
//! channel died, the route changed, UDP) is dropped
//! (`shm_tx_train_dropped`; never sent by UDP): the requester's
//! retransmission sends the message again. Trains and datagrams to one
//! destination share one ring and one backlog, so they stay in the order
//! the engine produced them. `shm_tx_trains` and `shm_rx_trains` count
//! the trains that went through; `shm_tx_exports`, `shm_rx_maps` and
//! `shm_tx_forgets` the buffers passed, mapped and forgotten.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use memmap2::{MmapOptions, MmapRaw};

use super::channel::{Mapped, RxSide, TokenMaps, NO_META};
use super::ring::{self, DescPiece, Producer, SlotMeta, TrainDesc};
use super::wire::ExportRepr;
use super::{bump, sys, Channel, ShmLink, Stats, EXPORT_LEN, EXPORT_MAX, MAP_MAX, RX_MAPS_MAX};
use crate::soft::proto::train::{TrainIn, TrainOut, TrainPiece};
use crate::soft::proto::Datagram;
use crate::verbs::memory::SharedFile;
use crate::verbs::MappedPiece;

/// The buffers a channel's sender has passed to the peer, by token.
#[derive(Debug)]
pub(super) struct Exports {
    pub(super) map: HashMap<u64, Export>,
    /// Trains sent (the clock of `Export::last`).
    pub(super) seq: u64,
    /// Most exports kept ([`EXPORT_MAX`]; less in tests).
    pub(super) cap: usize,
}

impl Default for Exports {
    fn default() -> Exports {
        Exports {
            map: HashMap::new(),
            seq: 0,
            cap: EXPORT_MAX,
        }
    }
}

#[derive(Debug)]
pub(super) struct Export {
    /// Gone when the file is freed (every buffer in it): then the peer
    /// may unmap it.
    file: Weak<SharedFile>,
    /// `seq` of the last train that used it.
    last: u64,
}

impl Exports {
    /// Removes what the peer may forget so that `new` more exports fit:
    /// freed buffers, then the least recently used ones. Returns their
    /// tokens.
    pub(super) fn make_room(&mut self, new: usize) -> Vec<u64> {
        let mut out: Vec<u64> = self.freed();
        while !self.map.is_empty() && self.map.len() + new > self.cap {
            let Some(t) = self.map.iter().min_by_key(|(_, e)| e.last).map(|(t, _)| *t) else {
                break;
            };
            self.map.remove(&t);
            out.push(t);
        }
        out
    }

    /// Removes the exports whose buffers were freed; returns their tokens.
    pub(super) fn freed(&mut self) -> Vec<u64> {
        let out: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, e)| e.file.strong_count() == 0)
            .map(|(t, _)| *t)
            .collect();
        for t in &out {
            self.map.remove(t);
        }
        out
    }
}

impl Channel {
    /// Pushes a train: tells the peer to forget buffers if the exports
    /// would exceed [`EXPORT_MAX`], passes the memfds of buffers it does not
    /// have yet over the socket, then publishes the slot (ONLY packet and
    /// descriptor), so that the descriptors wait in the peer's socket
    /// before it can see the slot. `Err` as in [`Channel::push`].
    pub(super) fn push_train(
        &self,
        prod: &mut Producer,
        exports: &mut Exports,
        meta: &SlotMeta,
        data: &[u8],
        train: &TrainOut,
        stats: &Stats,
    ) -> Result<(), ()> {
        let cma = train.has_process_pieces();
        if !self.trains() || (cma && !self.cma_tx.load(Ordering::Relaxed)) {
            bump(&stats.tx_train_dropped);
            return Ok(());
        }
        let desc = TrainDesc {
            npkts: train.npkts,
            pieces: train
                .pieces
                .iter()
                .map(|p| match p {
                    TrainPiece::Shared { mem, offset, len } => DescPiece {
                        token: mem.token(),
                        // Offsets in the descriptor are in the file.
                        offset: mem.offset().saturating_add(*offset),
                        len: *len,
                    },
                    TrainPiece::Process { addr, len } => DescPiece {
                        token: ring::PROCESS_TOKEN,
                        offset: *addr,
                        len: *len,
                    },
                })
                .collect(),
        };
        let mut ext = Vec::with_capacity(desc.encoded_len());
        if desc.encode(&mut ext).is_none() || data.len() + ext.len() > ring::MAX_PAYLOAD {
            bump(&stats.tx_train_dropped);
            return Ok(());
        }
        exports.seq += 1;
        let seq = exports.seq;
        let mut new: Vec<&Arc<SharedFile>> = Vec::new();
        for p in &train.pieces {
            let TrainPiece::Shared { mem, .. } = p else { continue };
            let file = mem.file();
            match exports.map.get_mut(&file.token()) {
                Some(e) => e.last = seq,
                None if !new.iter().any(|f| Arc::ptr_eq(f, file)) => new.push(file),
                None => {}
            }
        }
        // Room for the train's slot, and for a forget slot before it.
        let want = if new.is_empty() { 1 } else { 2 };
        match prod.room(&self.region, want) {
            Ok(n) if n >= want => {}
            Ok(_) => return Err(()),
            Err(_) => {
                bump(&stats.rx_bad_index);
                self.kill();
                return Err(());
            }
        }
        if !new.is_empty() {
            let forget = exports.make_room(new.len());
            if !forget.is_empty() {
                let mut ext = Vec::with_capacity(8 * forget.len());
                ring::encode_forget(&forget, &mut ext);
                if prod
                    .push_ext(&self.region, &NO_META, ring::KIND_FORGET, &[], &ext)
                    .is_ok()
                {
                    stats.tx_forgets.fetch_add(forget.len() as u64, Ordering::Relaxed);
                }
            }
            for file in new {
                match self.export(file) {
                    Ok(()) => {
                        bump(&stats.tx_exports);
                        exports.map.insert(
                            file.token(),
                            Export {
                                file: Arc::downgrade(file),
                                last: seq,
                            },
                        );
                    }
                    // The peer's socket is full: later (what was exported
                    // stays exported).
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(()),
                    Err(_) => {
                        bump(&stats.tx_train_dropped);
                        self.kill();
                        return Ok(());
                    }
                }
            }
        }
        match prod.push_ext(&self.region, meta, ring::KIND_TRAIN, data, &ext) {
            Ok(()) => {
                bump(&stats.tx_trains);
                if cma {
                    bump(&stats.tx_trains_cma);
                }
                Ok(())
            }
            // Cannot happen (room and length checked above).
            Err(_) => {
                bump(&stats.tx_train_dropped);
                Ok(())
            }
        }
    }

    /// Sends `file`'s memfd to the peer.
    pub(super) fn export(&self, file: &SharedFile) -> io::Result<()> {
        let m = ExportRepr {
            token: file.token(),
            len: file.len() as u64,
        }
        .emit();
        sys::send_fds(self.stream.as_raw_fd(), &m, &[file.fd().as_raw_fd()])
    }

    /// Tells the peer to forget the exported buffers that were freed
    /// meanwhile (if the ring has room and nobody is sending).
    pub(super) fn prune_exports(&self, stats: &Stats) {
        let Ok(mut tx) = self.tx.try_lock() else { return };
        let tx = &mut *tx;
        if tx.exports.map.is_empty() || !matches!(tx.prod.room(&self.region, 1), Ok(n) if n > 0) {
            return;
        }
        let forget = tx.exports.freed();
        if forget.is_empty() {
            return;
        }
        let mut ext = Vec::with_capacity(8 * forget.len());
        ring::encode_forget(&forget, &mut ext);
        if tx
            .prod
            .push_ext(&self.region, &NO_META, ring::KIND_FORGET, &[], &ext)
            .is_ok()
        {
            stats.tx_forgets.fetch_add(forget.len() as u64, Ordering::Relaxed);
        }
    }

    /// Reads exported-buffer messages from the socket (without blocking)
    /// until the one for `want`, mapping each buffer; returns whether
    /// `want` is mapped now. The sender queues a buffer's message before
    /// it publishes the first slot using it, so it is there to read.
    pub(super) fn import_until(&self, maps: &mut TokenMaps, want: u64, stats: &Stats) -> bool {
        for _ in 0..EXPORT_MAX {
            let mut m = [0u8; EXPORT_LEN];
            let (n, fds) = match sys::recv_fds(self.stream.as_raw_fd(), &mut m, 1) {
                Ok(r) => r,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            let Some(ExportRepr { token, len }) = m.get(..n).and_then(ExportRepr::parse) else {
                // The stream is out of step: nothing more can be trusted.
                bump(&stats.rx_bad_export);
                self.kill();
                return false;
            };
            // Descriptors beyond the first are closed here.
            let fd = fds.into_iter().next();
            let full = maps.len() >= RX_MAPS_MAX && !maps.contains_key(&token);
            // The device's limits (`ShmLimits`): beyond them the peer is
            // refused like one whose buffer cannot be mapped.
            let charge = fd.as_ref().filter(|_| !full).and_then(|_| {
                let c = self.budget.charge(len, 1);
                if c.is_none() {
                    self.budget.refuse(format!(
                        "ended the channel with pid {}: its buffer of {len} bytes is over the limits of mapped memory",
                        self.pid
                    ));
                }
                c
            });
            match charge
                .and_then(|c| Some((fd?, c)))
                .map(|(fd, c)| (map_export(fd, len), c))
            {
                Some((Ok(map), _charge)) => {
                    bump(&stats.rx_maps);
                    maps.insert(token, Mapped { map, _charge });
                    if token == want {
                        return true;
                    }
                }
                // A buffer that cannot be mapped here would fail every
                // train from it, and the sender cannot know: end the
                // channel (its destinations go back to UDP or reconnect).
                _ => {
                    bump(&stats.rx_bad_export);
                    self.kill();
                    return false;
                }
            }
        }
        false
    }
}

impl ShmLink {
    /// Hands the train in `rx.buf` (ONLY packet of `len` bytes, then the
    /// descriptor) to `f` with its payload in the peer's mapped buffers,
    /// and returns the payload's length; `None` if the descriptor is
    /// invalid, names a buffer the peer did not pass, or reaches outside
    /// one.
    pub(super) fn deliver_train(
        &self,
        c: &Channel,
        rx: &mut RxSide,
        m: &SlotMeta,
        len: usize,
        f: &mut dyn FnMut(Datagram<'_>),
    ) -> Option<u32> {
        let RxSide { buf, maps, desc, .. } = rx;
        if !buf.get(len..).is_some_and(|b| desc.decode_from(b)) {
            return None;
        }
        let cma = desc.pieces.iter().any(|p| p.token == ring::PROCESS_TOKEN);
        // Process memory only where we verified we may read the peer, and
        // only while the process we verified is the one behind the pid.
        if cma && !(c.cma_rx.load(Ordering::Relaxed) && c.pidfd.as_ref().is_some_and(|p| sys::pid_alive(p.as_raw_fd())))
        {
            return None;
        }
        for p in &desc.pieces {
            if p.token != ring::PROCESS_TOKEN
                && !maps.contains_key(&p.token)
                && !c.import_until(maps, p.token, &self.stats)
            {
                return None;
            }
        }
        // On the stack: the receive path allocates nothing per train.
        let mut pieces = [MappedPiece::remote(0, 0, 0); ring::TRAIN_MAX_PIECES];
        for (slot, p) in pieces.iter_mut().zip(&desc.pieces) {
            if p.token == ring::PROCESS_TOKEN {
                // The peer's own address space: the kernel checks every
                // read against the peer's mappings (`TrainDesc::decode`
                // already refused ranges that wrap).
                *slot = MappedPiece::remote(c.pid, p.offset, p.len as usize);
                continue;
            }
            let map = maps.get(&p.token)?;
            match p.offset.checked_add(u64::from(p.len)) {
                Some(end) if end <= map.len() as u64 => {}
                _ => return None,
            }
            // SAFETY: `offset..offset + len` lies inside the mapping
            // (checked just above), which stays mapped while `rx` is
            // borrowed: only a forget slot or the channel's end unmaps,
            // both with `rx` borrowed mutably, after `f` returned. The
            // peer cannot shrink the buffer (seals checked in
            // `map_export`), so reading it cannot fault. The mapping is
            // address space of its own, never registered with a device, so
            // it overlaps no memory the engine copies into.
            *slot = unsafe { MappedPiece::new(map.as_ptr().add(p.offset as usize), p.len as usize) };
        }
        let train = TrainIn::new(desc.npkts, &pieces[..desc.pieces.len()])?;
        // The next slot's lines cross from the producer's core while the
        // engine copies this train, instead of after it, when the reader
        // would wait for them.
        rx.cons.prefetch_next(&c.region);
        let bytes = train.len();
        bump(&self.stats.rx_trains);
        if cma {
            bump(&self.stats.rx_trains_cma);
        }
        f(Datagram {
            src: m.src,
            dst: m.dst,
            src_port: m.src_port,
            dst_port: m.dst_port,
            data: &buf[..len],
            train: Some(train),
        });
        Some(bytes)
    }
}

/// Maps a buffer the peer exported, read-only, after checking that it is
/// a sealed memfd (it cannot shrink under the mapping, so reading never
/// faults) of the announced, sane size. The descriptor is closed after.
pub(super) fn map_export(fd: OwnedFd, len: u64) -> io::Result<MmapRaw> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let file = std::fs::File::from(fd);
    // Only memfds (shmem, hugetlbfs) have seals: anything else fails here.
    let seals = sys::seals(&file)?;
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    if seals & need != need {
        return Err(bad("exported buffer is not sealed"));
    }
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() != len || len == 0 || len > MAP_MAX {
        return Err(bad("exported buffer of another size"));
    }
    let len = usize::try_from(len).map_err(|_| bad("exported buffer too large"))?;
    MmapOptions::new().len(len).map_raw_read_only(&file)
}
