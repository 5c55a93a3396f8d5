//! The receive path of the UDP link, and when it uses GRO.
//!
//! With UDP GRO on, a run of equal-size datagrams (a GSO message from a
//! peer on this host) arrives as one buffer whose segment size comes in a
//! control message: fewer, larger copies for a stream. But only
//! `recvmsg`/`recvmmsg` return control messages, and they cost more than
//! `recvfrom`: in a loopback ping-pong (C, here) `recvmmsg` polling makes a
//! one-way trip ~0.35 µs slower than `recvfrom` polling, ~10 % of the trip.
//! So GRO is switched by the traffic ([`GroPolicy`]): off while the link
//! idles or sees datagrams one at a time (polls then probe with
//! `recvfrom`), on once a call finds a batch (a stream), and off again after
//! a quiet spell. Buffers queued while GRO was on may still be runs: after
//! switching off, the next polls use `recvmmsg` (which splits them) before
//! probing again. Should a run still reach a probe (a datagram the kernel
//! queued in the instant of the switch), its ICRC fails and it is dropped
//! and counted like any damaged packet; the sender resends it.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::{addr, bump, bump_held, lock, sys, Sock, UdpLink};
use crate::soft::proto::Datagram;
use crate::soft::wire::{IcrcPrefix, IpPseudoHeader, UdpPorts, MIN_PACKET_LEN};

/// A call that finds this many datagrams is a stream: GRO goes on.
const GRO_ON_AT: usize = 8;
/// Empty polls in a row after which GRO goes off again (about a
/// millisecond of busy polling; a sleeping engine polls far less often and
/// keeps GRO on).
const GRO_OFF_AFTER: u32 = 4096;
/// Polls after switching GRO off that still use `recvmmsg`, which splits
/// any run queued before the switch.
const CAREFUL_POLLS: u32 = 64;
/// Probes after which bound sockets that found nothing beside a live twin
/// count as quiet (see [`UdpLink::receive`]).
const QUIET_PROBES: u32 = 64;
/// How often a probe reads a quiet bound socket beside a live twin: every
/// 16th probe. Each read of it is an empty system call (~0.3–0.5 µs here)
/// in the loop that waits for the twin's next datagram.
pub const QUIET_EVERY: u32 = 16;

/// When the link's sockets have GRO on, and whether a poll may probe with
/// `recvfrom`.
#[derive(Debug)]
pub(super) struct GroPolicy {
    /// The kernel has UDP GRO and the policy may switch it.
    capable: bool,
    /// GRO is on now.
    on: bool,
    /// The last call found datagrams.
    found: bool,
    /// Polls read in batches: the last call found more than one datagram,
    /// or found one right after a call that found some (a stream).
    busy: bool,
    /// Empty polls in a row.
    empty: u32,
    /// Polls left before probing is safe again after switching off.
    careful: u32,
}

impl GroPolicy {
    /// The policy of sockets that support GRO (`capable`); GRO starts off.
    pub(super) fn new(capable: bool) -> GroPolicy {
        GroPolicy {
            capable,
            on: false,
            found: false,
            busy: false,
            empty: 0,
            careful: 0,
        }
    }

    /// Whether GRO is on (receive buffers may hold runs).
    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// Whether the next poll may probe with `recvfrom`.
    pub(super) fn probe(&self) -> bool {
        !self.on && !self.busy && self.careful == 0
    }

    /// Records a call that found `n` datagrams; returns `Some(on)` when
    /// GRO should be switched.
    pub(super) fn after_call(&mut self, n: usize) -> Option<bool> {
        // One datagram after an empty call is what a ping-pong receives:
        // its next datagram comes only after this side's reply, and a batch
        // call on every socket meanwhile (two empty `recvmmsg` calls, ~1 µs)
        // is what a reply arriving early waits for. A second find in a row
        // is a stream, read in batches.
        self.busy = n > 1 || (n == 1 && self.found);
        self.found = n > 0;
        if n > 0 {
            self.empty = 0;
            if !self.on && self.capable && n >= GRO_ON_AT {
                self.on = true;
                return Some(true);
            }
            return None;
        }
        self.careful = self.careful.saturating_sub(1);
        self.empty = self.empty.saturating_add(1);
        if self.on && self.empty >= GRO_OFF_AFTER {
            self.on = false;
            self.careful = CAREFUL_POLLS;
            return Some(false);
        }
        None
    }

    /// GRO stays on for good (a socket refused to switch).
    fn disable(&mut self) {
        self.capable = false;
        self.on = true;
    }
}

impl UdpLink {
    /// Reads up to `budget` datagrams from the sockets and hands each to
    /// `f` (see the module docs for the GRO policy).
    pub(super) fn receive(&self, budget: usize, f: &mut dyn FnMut(Datagram<'_>)) -> usize {
        if self.detached.load(Ordering::Relaxed) {
            return 0;
        }
        let mut rx = lock(&self.rx);
        // Out of the buffers for the call, so that it can be updated
        // while a received datagram borrows them.
        let mut icrc = std::mem::take(&mut rx.icrc);
        let mut total = 0;
        // An idle poll of sockets without GRO probes with the cheapest
        // call; a probe that finds a datagram ends the call, so a
        // ping-pong's reply is not held up by a second system call. The
        // next call probes again, unless two calls in a row found
        // datagrams (a stream: see `GroPolicy::after_call`).
        // After a wake-up every socket is read until dry (see `armed`); if
        // the budget ran out first, the next call does it again.
        let woke = self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel);
        let probe = !woke && rx.policy.probe();
        // Each empty receive call is ~0.3–0.5 µs on our VMs, and a probe
        // of two sockets makes a datagram wait for the other one's call.
        // So once the bound sockets beside live twins found nothing for
        // QUIET_PROBES probes (the traffic comes by the twins), probes
        // read them every QUIET_EVERY-th time only: a datagram from
        // another peer then waits up to QUIET_EVERY - 1 more probes of the
        // twin (a few µs, once: then the bound socket is read on every
        // probe again).
        let skip_quiet = probe && rx.bound_quiet >= QUIET_PROBES && !rx.probes.is_multiple_of(QUIET_EVERY);
        rx.probes = rx.probes.wrapping_add(1);
        for s in &self.socks {
            // The connected twin first (see the module docs): a ping-pong's
            // peer sends to it. A probe that finds a datagram there leaves
            // the bound socket to the next call.
            let twin = s.twin.as_ref().filter(|_| s.twin_live.load(Ordering::Acquire));
            let mut found = false;
            for (fd, is_twin) in twin
                .map(|t| (t.as_raw_fd(), true))
                .into_iter()
                .chain(std::iter::once((s.sock.as_raw_fd(), false)))
            {
                if probe && (found || (skip_quiet && twin.is_some())) && !is_twin {
                    break;
                }
                if probe && total < budget {
                    bump_held(&self.stats.rx_syscalls, 1);
                    match sys::recv_one(fd, &mut rx) {
                        Ok(1) => {
                            total += 1;
                            found = true;
                            bump_held(&self.stats.rx_datagrams, 1);
                            self.deliver_one(s, &rx, 0, &mut icrc, f);
                            if !is_twin {
                                rx.bound_quiet = 0;
                            }
                        }
                        Ok(_) if !is_twin && twin.is_some() => {
                            rx.bound_quiet = rx.bound_quiet.saturating_add(1);
                        }
                        Ok(_) => {}
                        Err(e) => self.count_rx_error(&e, is_twin),
                    }
                    continue;
                }
                total += self.read_batches(s, fd, is_twin, budget - total, &mut rx, &mut icrc, f);
            }
        }
        rx.icrc = icrc;
        if woke && total >= budget {
            self.armed.store(true, Ordering::Release);
        }
        if let Some(on) = rx.policy.after_call(total) {
            self.switch_gro(on, &mut rx.policy);
        }
        total
    }

    /// Counts a failed receive call, except the `ECONNREFUSED` by which a
    /// connected twin reports that its peer is gone (see the module docs).
    fn count_rx_error(&self, e: &std::io::Error, twin: bool) {
        if !(twin && e.raw_os_error() == Some(libc::ECONNREFUSED)) {
            bump(&self.stats.rx_errors, 1);
        }
    }

    /// Reads `fd` (socket `s` or its twin) with `recvmmsg` until it is dry
    /// or `budget` datagrams came; returns how many came.
    #[allow(clippy::too_many_arguments)]
    fn read_batches(
        &self,
        s: &Sock,
        fd: std::os::fd::RawFd,
        twin: bool,
        budget: usize,
        rx: &mut sys::RxBufs,
        icrc: &mut IcrcPrefix,
        f: &mut dyn FnMut(Datagram<'_>),
    ) -> usize {
        let mut total = 0;
        // A small first call (see `sys::RX_FIRST`), larger ones after
        // a full one.
        let mut ask = sys::RX_FIRST;
        while total < budget {
            bump_held(&self.stats.rx_syscalls, 1);
            let ask_now = ask.min(budget - total);
            ask = sys::RX_BATCH;
            let n = match sys::recv_batch(fd, rx, ask_now) {
                Ok(n) => n,
                Err(e) => {
                    self.count_rx_error(&e, twin);
                    0
                }
            };
            if n == 0 {
                break;
            }
            total += n;
            if !twin {
                rx.bound_quiet = 0;
            }
            bump_held(&self.stats.rx_datagrams, n as u64);
            for i in 0..n {
                self.deliver_one(s, rx, i, icrc, f);
            }
            if n < ask_now {
                break;
            }
        }
        total
    }

    /// Turns GRO on or off on every socket (see [`GroPolicy`]); a socket
    /// that refuses keeps the policy from switching again.
    fn switch_gro(&self, on: bool, policy: &mut GroPolicy) {
        let ok = self.socks.iter().flat_map(Sock::fds).all(|fd| sys::set_gro(fd, on));
        bump(&self.stats.rx_gro_switches, 1);
        if !ok {
            // Leave it on, as a socket that cannot switch may have.
            for fd in self.socks.iter().flat_map(Sock::fds) {
                let _ = sys::set_gro(fd, true);
            }
            policy.disable();
        }
    }

    /// Checks and hands over the datagram(s) of receive buffer `i`: one,
    /// or with GRO a run of `segment`-byte datagrams (the last may be
    /// shorter).
    fn deliver_one(
        &self,
        s: &Sock,
        rx: &sys::RxBufs,
        i: usize,
        icrc: &mut IcrcPrefix,
        f: &mut dyn FnMut(Datagram<'_>),
    ) {
        let (data, from) = rx.get(i);
        let Some(from) = from else {
            bump(&self.stats.rx_errors, 1);
            return;
        };
        if rx.truncated[i] {
            bump(&self.stats.rx_oversized, 1);
            return;
        }
        let seg = match rx.segment[i] {
            0 => data.len().max(1),
            n => n,
        };
        if rx.segment[i] != 0 {
            // The kernel counted one datagram; count them all.
            bump_held(
                &self.stats.rx_datagrams,
                data.len().div_ceil(seg).saturating_sub(1) as u64,
            );
        }
        for d in data.chunks(seg) {
            self.deliver_datagram(s, from, d, icrc, f);
        }
        if data.is_empty() {
            self.deliver_datagram(s, from, data, icrc, f);
        }
    }

    fn deliver_datagram(
        &self,
        s: &Sock,
        from: SocketAddr,
        data: &[u8],
        icrc: &mut IcrcPrefix,
        f: &mut dyn FnMut(Datagram<'_>),
    ) {
        if data.len() > sys::MAX_DATAGRAM {
            bump(&self.stats.rx_oversized, 1);
            return;
        }
        if data.len() < MIN_PACKET_LEN {
            bump(&self.stats.rx_truncated, 1);
            return;
        }
        let Some(ip) = IpPseudoHeader::between(from.ip(), s.local.ip()) else {
            bump(&self.stats.rx_errors, 1);
            return;
        };
        let ports = UdpPorts {
            src: from.port(),
            dst: s.local.port(),
        };
        if !icrc.check(&ip, ports, data) {
            bump(&self.stats.rx_bad_icrc, 1);
            return;
        }
        let src = addr::source_gid(from, s.local_v6).to_ip();
        f(Datagram {
            src,
            dst: s.view,
            src_port: from.port(),
            dst_port: s.local.port(),
            data,
            train: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gro_follows_the_traffic() {
        let mut p = GroPolicy::new(true);
        assert!(p.probe(), "an idle link probes");
        assert_eq!(p.after_call(1), None, "one at a time: no GRO");
        assert!(p.probe(), "one find after an empty call: a ping-pong, still probing");
        assert_eq!(p.after_call(1), None);
        assert!(!p.probe(), "a second find in a row: a batch call");
        assert_eq!(p.after_call(2), None);
        assert!(!p.probe(), "more than one: still batches");
        assert_eq!(p.after_call(0), None);
        assert!(p.probe());
        assert_eq!(p.after_call(GRO_ON_AT), Some(true), "a stream: GRO on");
        assert!(p.on() && !p.probe());
        for _ in 1..GRO_OFF_AFTER {
            assert_eq!(p.after_call(0), None);
        }
        assert_eq!(p.after_call(0), Some(false), "quiet: GRO off");
        for _ in 0..CAREFUL_POLLS {
            assert!(!p.probe(), "runs queued before the switch are split first");
            assert_eq!(p.after_call(0), None);
        }
        assert!(p.probe());
    }

    #[test]
    fn without_gro_support_nothing_switches() {
        let mut p = GroPolicy::new(false);
        assert_eq!(p.after_call(sys::RX_BATCH), None);
        assert!(!p.on());
        assert_eq!(p.after_call(0), None);
        assert!(p.probe());
    }
}
