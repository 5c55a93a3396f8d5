//! The send path of the UDP link: where a datagram goes (its socket,
//! endpoint and GSO choice, its ICRC against the real headers), single
//! datagrams by `sendto` or the connected twin, batches by `sendmmsg` with
//! GSO, and the backlog of what the socket could not take yet.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::{addr, bump, bump_held, lock, sys, GsoMode, Resolved, TxFlow, TxState, UdpLink};
use crate::soft::proto::Transmit;
use crate::soft::wire::{IpPseudoHeader, UdpPorts};
use crate::verbs::Gid;

/// Datagrams the send backlog holds before it drops.
const BACKLOG_MAX: usize = 8192;

impl UdpLink {
    /// The socket a datagram from engine address `src` leaves by.
    fn sock_for(&self, src: IpAddr, dst: SocketAddr) -> Option<usize> {
        self.socks
            .iter()
            .position(|s| s.view == src && s.local.is_ipv6() == dst.is_ipv6())
            .or_else(|| self.socks.iter().position(|s| s.local.is_ipv6() == dst.is_ipv6()))
    }

    fn gso_towards(&self, dst: SocketAddr, gid_private: bool) -> bool {
        match self.gso_mode {
            GsoMode::Off => false,
            GsoMode::On => true,
            GsoMode::Auto => gid_private || dst.ip().is_loopback(),
        }
    }

    /// Resolves, re-checksums (ICRC for the real headers) and sends
    /// `txs`, in order; what the socket cannot take now goes to the
    /// backlog.
    pub(super) fn transmit(&self, txs: &mut Vec<Transmit>, spent: &mut dyn FnMut(Vec<u8>)) {
        let mut st = lock(&self.tx);
        let st = &mut *st;
        if !st.backlog.is_empty() {
            self.flush_backlog_locked(st);
        }
        // Routed (and so given their ICRC) whether they go now or wait:
        // the backlog sends what it holds as it is.
        st.route.clear();
        for t in txs.iter_mut() {
            let route = self.route_of(t, &mut st.flow);
            st.route.push(route);
        }
        // Keep order: new datagrams queue behind what is still backlogged.
        let sent = if st.backlog.is_empty() {
            self.send_routed(st, txs, 0)
        } else {
            0
        };
        if sent < txs.len() {
            let rest: Vec<Transmit> = txs.drain(sent..).collect();
            // Unroutable ones were counted already; keep the others.
            let keep = rest
                .into_iter()
                .zip(st.route[sent..].iter())
                .filter_map(|(t, r)| r.map(|_| t))
                .collect::<Vec<_>>();
            self.backlog_push(st, keep.into_iter());
        }
        // The kernel copied them: their buffers are free again.
        for t in txs.drain(..) {
            spent(t.data);
        }
    }

    /// Where `t` goes (its socket, destination, and whether GSO may carry
    /// it there), with its ICRC filled in against the real addresses and
    /// ports; `None`, counted, if it cannot go anywhere.
    /// An injected loss
    /// ([`UdpConfig::drop`](super::UdpConfig::drop)) is `None` too,
    /// counted as such.
    fn route_of(&self, t: &mut Transmit, flow: &mut TxFlow) -> Option<(usize, SocketAddr, bool)> {
        if let Some(loss) = &mut flow.loss {
            if loss.drop_next() {
                bump_held(&self.stats.tx_injected_drops, 1);
                return None;
            }
        }
        // The kept destination is used in place: copying it out and back
        // cost ~30 instructions a datagram.
        if !flow.last.as_ref().is_some_and(|r| r.src == t.src && r.dst == t.dst) {
            if let Some(r) = self.resolve(t.src, t.dst) {
                flow.last = Some(r);
            } else {
                bump(&self.stats.tx_unroutable, 1);
                return None;
            }
        }
        let route = flow.last.as_ref().and_then(|r| {
            flow.icrc.fill(&r.ip, r.ports, &mut t.data).ok()?;
            Some((r.sock, r.to, r.gso))
        });
        if route.is_none() {
            bump(&self.stats.tx_unroutable, 1);
        }
        route
    }

    /// The socket, endpoint, GSO choice and ICRC headers for datagrams
    /// from engine address `src` to `dst`; `None` if no socket reaches it.
    fn resolve(&self, src: IpAddr, dst: IpAddr) -> Option<Resolved> {
        let dgid = Gid::from_ip(dst);
        let to = self.endpoint_of(dgid)?;
        let sock = self.sock_for(src, to)?;
        let s = &self.socks[sock];
        if to == s.local {
            // To itself: a parked twin is connected to this very address
            // and port, and takes these datagrams.
            s.twin_live.store(true, Ordering::Release);
        }
        let private = addr::is_private(dgid);
        Some(Resolved {
            src,
            dst,
            sock,
            to,
            gso: self.gso_towards(to, private),
            ip: IpPseudoHeader::between(s.local.ip(), to.ip())?,
            ports: UdpPorts {
                src: s.local.port(),
                dst: to.port(),
            },
            connectable: s.twin.is_some() && to != s.local && (to.is_ipv6() || private || to.ip().is_loopback()),
            streak: 0,
        })
    }

    /// [`Link::send_one`](super::Link::send_one): one `sendto`, without
    /// the batch's lists.
    pub(super) fn transmit_one(&self, mut t: Transmit, spent: &mut dyn FnMut(Vec<u8>)) {
        let mut st = lock(&self.tx);
        if !st.backlog.is_empty() {
            // Behind the backlog, in order: the batch path.
            drop(st);
            let mut txs = vec![t];
            self.transmit(&mut txs, spent);
            return;
        }
        let Some((si, dst, _)) = self.route_of(&mut t, &mut st.flow) else {
            return;
        };
        let (fd, dst) = match self.twin_for(&mut st.flow) {
            Some(fd) => (fd, None),
            None => (self.socks[si].sock.as_raw_fd(), Some(dst)),
        };
        let mut refused = false;
        loop {
            bump_held(&self.stats.tx_syscalls, 1);
            match sys::send_single(fd, &t.data, dst) {
                sys::SendOutcome::Sent(_) => {
                    bump_held(&self.stats.tx_datagrams, 1);
                    bump_held(&self.stats.tx_messages, 1);
                    if dst.is_none() {
                        bump_held(&self.stats.tx_connected, 1);
                    }
                    break;
                }
                sys::SendOutcome::Failed(e) => match e.raw_os_error() {
                    // A connected socket reports an earlier datagram's
                    // ICMP port unreachable (the peer is gone) on this
                    // call, which then sent nothing: once more.
                    Some(libc::ECONNREFUSED) if dst.is_none() && !refused => refused = true,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        self.backlog_push(&mut st, std::iter::once(t));
                        return;
                    }
                    Some(libc::EINTR) => {}
                    _ => {
                        // Unreachable network, message too long: lost (RC
                        // retransmits), as in the batch path.
                        bump(&self.stats.tx_errors, 1);
                        break;
                    }
                },
            }
        }
        drop(st);
        // The kernel copied it: the buffer is free again.
        spent(t.data);
    }

    /// Sends `txs[from..]` along `st.route`; returns the index of the first
    /// datagram not sent (`txs.len()` when all went).
    fn send_routed(&self, st: &mut TxState, txs: &[Transmit], from: usize) -> usize {
        let mut i = from;
        while i < txs.len() {
            // The next batch: consecutive datagrams by one socket.
            let Some((si, _, _)) = st.route[i] else {
                i += 1;
                continue;
            };
            st.msgs.clear();
            let mut j = i;
            let gso = self.gso_ok.load(Ordering::Relaxed);
            while j < txs.len() && st.msgs.len() < sys::TX_BATCH {
                let Some((sj, dst, gso_here)) = st.route[j] else { break };
                if sj != si {
                    break;
                }
                let seg = txs[j].data.len();
                let mut count = 1;
                let mut bytes = seg;
                if gso && gso_here {
                    while j + count < txs.len() && count < sys::GSO_MAX_SEGMENTS {
                        let Some((sk, dk, _)) = st.route[j + count] else { break };
                        let len = txs[j + count].data.len();
                        if sk != si || dk != dst || len > seg || bytes + len > sys::GSO_MAX_BYTES {
                            break;
                        }
                        count += 1;
                        bytes += len;
                        if len < seg {
                            break; // a shorter segment ends a GSO message
                        }
                    }
                }
                st.msgs.push(sys::TxMsg {
                    dst,
                    first: j,
                    count,
                    seg,
                });
                j += count;
            }
            if st.msgs.is_empty() {
                // Unroutable datagram inside the range: skip it.
                i = j.max(i + 1);
                continue;
            }
            let fd = self.socks[si].sock.as_raw_fd();
            let mut done = 0;
            while done < st.msgs.len() {
                bump_held(&self.stats.tx_syscalls, 1);
                match sys::send_batch(fd, txs, &st.msgs[done..]) {
                    sys::SendOutcome::Sent(n) => {
                        for m in &st.msgs[done..done + n] {
                            bump_held(&self.stats.tx_datagrams, m.count as u64);
                            if m.count > 1 {
                                bump_held(&self.stats.tx_gso_messages, 1);
                            }
                        }
                        bump_held(&self.stats.tx_messages, n as u64);
                        done += n;
                    }
                    sys::SendOutcome::Failed(e) => {
                        let m = st.msgs[done];
                        match e.raw_os_error() {
                            Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                                return m.first;
                            }
                            Some(libc::EINTR) => {}
                            Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) if m.count > 1 => {
                                // GSO refused (no checksum offload on the
                                // route, or an old kernel): send this and
                                // everything later one datagram at a time.
                                self.gso_ok.store(false, Ordering::Relaxed);
                                return self.send_routed_plain(st, txs, m.first);
                            }
                            _ => {
                                // Unreachable network, message too long: the
                                // packet is lost (RC retransmits).
                                bump(&self.stats.tx_errors, m.count as u64);
                                done += 1;
                            }
                        }
                    }
                }
            }
            i = j;
        }
        txs.len()
    }

    /// [`UdpLink::send_routed`] after GSO was switched off.
    fn send_routed_plain(&self, st: &mut TxState, txs: &[Transmit], from: usize) -> usize {
        debug_assert!(!self.gso_ok.load(Ordering::Relaxed));
        self.send_routed(st, txs, from)
    }

    fn backlog_push(&self, st: &mut TxState, txs: impl Iterator<Item = Transmit>) {
        for t in txs {
            if st.backlog.len() >= BACKLOG_MAX {
                bump(&self.stats.tx_backlog_drops, 1);
                continue;
            }
            bump(&self.stats.tx_backlogged, 1);
            st.backlog.push_back(t);
        }
    }

    pub(super) fn flush_backlog_locked(&self, st: &mut TxState) {
        while !st.backlog.is_empty() {
            let mut batch: Vec<Transmit> = st.backlog.drain(..).collect();
            st.route.clear();
            for t in &batch {
                // The ICRC was filled in when the datagram was first routed.
                let r = self.resolve(t.src, t.dst).map(|r| (r.sock, r.to, r.gso));
                st.route.push(r);
            }
            let sent = self.send_routed(st, &batch, 0);
            if sent < batch.len() {
                let rest: Vec<Transmit> = batch.drain(sent..).collect();
                for t in rest.into_iter().rev() {
                    st.backlog.push_front(t);
                }
                return;
            }
        }
    }
}
