//! Receive dispatch: every check a packet passes before the responder or
//! completer sees it (parse, ICRC, QPN, transport, state, P_Key, source),
//! and the counters of what was dropped. A malformed or hostile packet is
//! dropped and counted, never a panic.

use crate::soft::wire::{
    check_icrc, has_soft_cap, AethRepr, BthRepr, Direction, IpPseudoHeader, OpKind, Opcode, Packet, Pkey, Position,
    Sack, Transport, UdpPorts, ICRC_LEN,
};
use crate::verbs::{QpState, QpType};

use super::requester::transport_of;
use super::{Core, Datagram, Nanos};

/// Per-device packet counters (shown by `softverbs devinfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(missing_docs)] // each name says what it counts
pub struct Counters {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub tx_responses: u64,
    pub tx_emit_errors: u64,
    pub rx_malformed: u64,
    pub rx_bad_icrc: u64,
    pub rx_unknown_qp: u64,
    pub rx_wrong_transport: u64,
    pub rx_bad_state: u64,
    pub rx_bad_pkey: u64,
    pub rx_bad_source: u64,
    pub rx_bad_qkey: u64,
    pub rx_duplicates: u64,
    pub rx_out_of_sequence: u64,
    pub rx_stale_responses: u64,
    pub rx_bad_opcode_sequence: u64,
    pub rx_bad_length: u64,
    pub rx_bad_rkey: u64,
    pub rx_rkey_access: u64,
    pub rx_rkey_bounds: u64,
    pub rx_misaligned_atomics: u64,
    pub rx_recv_too_long: u64,
    pub rx_no_recv_wqe: u64,
    pub uc_dropped_messages: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub seq_naks_duplicate: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub retransmits: u64,
    pub retransmit_timeouts: u64,
    pub cq_overruns: u64,
    pub tx_trains: u64,
    pub rx_trains: u64,
    pub rx_bad_train: u64,
    pub rx_fast: u64,
    pub tx_fast: u64,
    pub tx_eager: u64,
    pub rx_held: u64,
    pub reorder_detected: u64,
    pub sacks_sent: u64,
    pub sacks_received: u64,
    pub sacks_repeated: u64,
    pub sr_resent_packets: u64,
    pub probes: u64,
    pub tx_acks_held: u64,
}

impl Counters {
    /// `(name, value)` pairs, for display.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("rx_packets", self.rx_packets),
            ("tx_packets", self.tx_packets),
            ("tx_responses", self.tx_responses),
            ("tx_emit_errors", self.tx_emit_errors),
            ("rx_malformed", self.rx_malformed),
            ("rx_bad_icrc", self.rx_bad_icrc),
            ("rx_unknown_qp", self.rx_unknown_qp),
            ("rx_wrong_transport", self.rx_wrong_transport),
            ("rx_bad_state", self.rx_bad_state),
            ("rx_bad_pkey", self.rx_bad_pkey),
            ("rx_bad_source", self.rx_bad_source),
            ("rx_bad_qkey", self.rx_bad_qkey),
            ("rx_duplicates", self.rx_duplicates),
            ("rx_out_of_sequence", self.rx_out_of_sequence),
            ("rx_stale_responses", self.rx_stale_responses),
            ("rx_bad_opcode_sequence", self.rx_bad_opcode_sequence),
            ("rx_bad_length", self.rx_bad_length),
            ("rx_bad_rkey", self.rx_bad_rkey),
            ("rx_rkey_access", self.rx_rkey_access),
            ("rx_rkey_bounds", self.rx_rkey_bounds),
            ("rx_misaligned_atomics", self.rx_misaligned_atomics),
            ("rx_recv_too_long", self.rx_recv_too_long),
            ("rx_no_recv_wqe", self.rx_no_recv_wqe),
            ("uc_dropped_messages", self.uc_dropped_messages),
            ("seq_naks_sent", self.seq_naks_sent),
            ("seq_naks_received", self.seq_naks_received),
            ("seq_naks_duplicate", self.seq_naks_duplicate),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_received", self.rnr_naks_received),
            ("retransmits", self.retransmits),
            ("retransmit_timeouts", self.retransmit_timeouts),
            ("cq_overruns", self.cq_overruns),
            ("tx_trains", self.tx_trains),
            ("rx_trains", self.rx_trains),
            ("rx_bad_train", self.rx_bad_train),
            ("rx_fast", self.rx_fast),
            ("tx_fast", self.tx_fast),
            ("tx_eager", self.tx_eager),
            ("rx_held", self.rx_held),
            ("reorder_detected", self.reorder_detected),
            ("sacks_sent", self.sacks_sent),
            ("sacks_received", self.sacks_received),
            ("sacks_repeated", self.sacks_repeated),
            ("sr_resent_packets", self.sr_resent_packets),
            ("probes", self.probes),
            ("tx_acks_held", self.tx_acks_held),
        ]
        .into_iter()
    }

    /// Packets dropped by receive checks.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_malformed
            + self.rx_bad_icrc
            + self.rx_unknown_qp
            + self.rx_wrong_transport
            + self.rx_bad_state
            + self.rx_bad_pkey
            + self.rx_bad_source
            + self.rx_bad_qkey
            + self.rx_bad_train
    }
}

impl Core {
    /// Handles one received UDP payload.
    pub fn handle_datagram(&mut self, now: Nanos, d: Datagram<'_>) {
        self.acks.note_time(now);
        if self.cfg.fast_paths && self.fast_request(&d) {
            return;
        }
        if super::gsi::is_qp1(d.data) {
            // QP1 is the GSI, not a verbs QP (see `gsi`).
            self.gsi_receive(&d);
            return;
        }
        self.counters.rx_packets += 1;
        // A sequence NAK with the SACK extension (`wire::sack`): the
        // standard packet is its first 16 bytes; the ICRC is checked over
        // the whole datagram below.
        let mut short = [0u8; BthRepr::LEN + AethRepr::LEN + ICRC_LEN];
        let mut data = d.data;
        self.rx_sack = None;
        let sack_len = d.data.len().saturating_sub(short.len());
        if sack_len > 0 && d.data[0] == u8::from(Opcode::RcAcknowledge) && has_soft_cap(d.data) {
            let ext = &d.data[BthRepr::LEN + AethRepr::LEN..d.data.len() - ICRC_LEN];
            match Sack::parse(ext) {
                Ok(s) => self.rx_sack = Some(s),
                Err(_) => {
                    self.counters.rx_malformed += 1;
                    return;
                }
            }
            short[..BthRepr::LEN + AethRepr::LEN].copy_from_slice(&d.data[..BthRepr::LEN + AethRepr::LEN]);
            data = &short;
        }
        let pkt = match Packet::parse(data) {
            Ok(p) => p,
            Err(_) => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        if self.cfg.check_icrc {
            let ports = UdpPorts {
                src: d.src_port,
                dst: d.dst_port,
            };
            let ok = IpPseudoHeader::between(d.src, d.dst).is_some_and(|ip| check_icrc(&ip, ports, d.data));
            if !ok {
                self.counters.rx_bad_icrc += 1;
                return;
            }
        }
        let qpn = pkt.headers.bth.dest_qpn.value();
        let Some(mut qp) = self.take_qp(qpn) else {
            self.counters.rx_unknown_qp += 1;
            return;
        };
        self.dispatch(&mut qp, now, &pkt, d);
        self.rx_sack = None;
        self.put_qp(qp);
    }

    fn dispatch(
        &mut self,
        qp: &mut super::qp::Qp,
        now: Nanos,
        pkt: &crate::soft::wire::ParsedPacket<'_>,
        d: Datagram<'_>,
    ) {
        if pkt.info.transport != transport_of(qp.qp_type) {
            self.counters.rx_wrong_transport += 1;
            return;
        }
        if !pkt.headers.bth.pkey.matches(Pkey::DEFAULT) {
            self.counters.rx_bad_pkey += 1;
            return;
        }
        let state = qp.state();
        let request = pkt.info.direction == Direction::Request;
        let state_ok = if request {
            matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
        } else {
            matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        };
        if !state_ok {
            self.counters.rx_bad_state += 1;
            return;
        }
        if qp.qp_type != QpType::Ud {
            // A connected QP only accepts packets from its peer's address
            // and QP (IBTA 9.6.1.5.1; the source QPN is not on the wire for
            // RC/UC, so the address is what we can check).
            if d.src != qp.attr.ah_attr.grh.dgid.to_ip() {
                self.counters.rx_bad_source += 1;
                return;
            }
        }
        if qp.qp_type == QpType::Rc && has_soft_cap(d.data) {
            // The peer announced selective repeat (`recovery`).
            if request {
                qp.resp.peer_sr = true;
            } else {
                qp.req.peer_sr = true;
            }
        }
        if let Some(t) = d.train {
            // Only RC SEND/WRITE messages (and READ responses) travel as
            // trains, as an ONLY packet standing for all their packets; a
            // train of one packet is taken (see `TrainCaps::one_packet`),
            // one without payload is not.
            let kind_ok = if request {
                matches!(pkt.info.kind, OpKind::Send | OpKind::Write)
            } else {
                pkt.info.kind == OpKind::ReadResponse
            };
            let ok = kind_ok
                && qp.qp_type == QpType::Rc
                && pkt.info.position == Position::Only
                && t.fits(pkt.payload.len(), qp.mtu());
            if !ok {
                self.counters.rx_bad_train += 1;
                return;
            }
            self.counters.rx_trains += 1;
            if request {
                self.handle_request(qp, now, pkt, d.src, d.dst, Some(&t), d.data);
                self.drain_held(qp, now);
            } else {
                self.handle_response(qp, now, pkt, Some(&t));
            }
        } else if request {
            self.handle_request(qp, now, pkt, d.src, d.dst, None, d.data);
            if qp.resp.ooo.is_some() {
                self.drain_held(qp, now);
            }
        } else if pkt.info.transport == Transport::Rc {
            self.handle_response(qp, now, pkt, None);
        }
    }
}
