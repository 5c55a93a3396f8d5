//! The general services interface (GSI, QP1) of a soft device, as far as
//! the connection manager needs it: received UD SEND_ONLY packets for QP1
//! are handed to a registered [`GsiSink`] (the CM's MAD agent) instead of a
//! verbs QP, and [`Core::gsi_send`] sends a 256-byte MAD from QP1 to a
//! peer's QP1 (BTH + DETH with Q_Key [`GSI_QKEY`] + MAD + ICRC).
//!
//! QP1 is not a verbs object here: applications cannot create or post to
//! it. A device without a sink counts QP1 MADs as `rx_unknown_qp` and
//! answers connection requests and disconnects itself, as a kernel CM
//! answers for a service nobody listens on. The sink is called under the
//! engine lock and must only queue the MAD (it must not call back into
//! the device).

use std::net::IpAddr;
use std::sync::Arc;

use super::{Core, Datagram};
use crate::soft::wire::{BthRepr, DethRepr, Opcode, Packet, PacketRepr, Pkey, Psn, Qpn};
use crate::verbs::Gid;

/// The GSI's well-known Q_Key (IBTA 3.5.3; QP1 accepts only this one).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The GSI's QP number.
pub const GSI_QPN: u32 = 1;

/// Size of a MAD (IBTA 13.4.2).
pub const MAD_LEN: usize = 256;

/// A MAD received on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GsiMad {
    /// The sender's address.
    pub src: IpAddr,
    /// The address it was sent to (one of this device's).
    pub dst: IpAddr,
    /// The sender's QP (from the DETH; 1 for a CM peer).
    pub src_qpn: u32,
    /// The MAD itself.
    pub mad: [u8; MAD_LEN],
}

/// Receives the MADs a device's QP1 got (the CM's agent).
pub trait GsiSink: Send + Sync + std::fmt::Debug {
    /// One MAD arrived. Called with the engine lock held: queue it and
    /// return.
    fn receive(&self, mad: GsiMad);
}

/// Whether the UDP payload `data` is addressed to QP1 (a look at the BTH's
/// destination QP only; the full checks follow in [`Core::gsi_receive`]).
#[inline]
pub(super) fn is_qp1(data: &[u8]) -> bool {
    data.len() >= 8 && data[5] == 0 && data[6] == 0 && data[7] == GSI_QPN as u8
}

impl Core {
    /// Installs (or, with `None`, removes) the sink of QP1 MADs.
    pub fn set_gsi_sink(&mut self, sink: Option<Arc<dyn GsiSink>>) {
        self.gsi_sink = sink;
    }

    /// Whether a GSI sink is installed.
    pub fn has_gsi_sink(&self) -> bool {
        self.gsi_sink.is_some()
    }

    /// Takes a datagram for QP1: checks it is a UD SEND_ONLY with the GSI
    /// Q_Key, the default P_Key, a good ICRC (when checked) and a 256-byte
    /// MAD, and hands it to the sink. Anything else is dropped and
    /// counted. With no sink installed (no connection manager runs over
    /// this device), a valid MAD is counted as for an unknown QP, and a
    /// connection request or disconnect is answered as a host's kernel CM
    /// answers when nobody listens ([`CmMsg::answer_unattended`]): the
    /// peer learns at once instead of retrying until it times out.
    ///
    /// [`CmMsg::answer_unattended`]: crate::cm::mad::CmMsg::answer_unattended
    pub(super) fn gsi_receive(&mut self, d: &Datagram<'_>) {
        self.counters.rx_packets += 1;
        let Ok(pkt) = Packet::parse(d.data) else {
            self.counters.rx_malformed += 1;
            return;
        };
        if self.cfg.check_icrc {
            let ports = crate::soft::wire::UdpPorts {
                src: d.src_port,
                dst: d.dst_port,
            };
            let ok = crate::soft::wire::IpPseudoHeader::between(d.src, d.dst)
                .is_some_and(|ip| crate::soft::wire::check_icrc(&ip, ports, d.data));
            if !ok {
                self.counters.rx_bad_icrc += 1;
                return;
            }
        }
        if pkt.headers.bth.opcode != Opcode::UdSendOnly {
            self.counters.rx_wrong_transport += 1;
            return;
        }
        if !pkt.headers.bth.pkey.matches(Pkey::DEFAULT) {
            self.counters.rx_bad_pkey += 1;
            return;
        }
        let Some(deth) = pkt.headers.deth else {
            self.counters.rx_malformed += 1;
            return;
        };
        if deth.qkey != GSI_QKEY {
            self.counters.rx_bad_qkey += 1;
            return;
        }
        let Ok(mad) = <[u8; MAD_LEN]>::try_from(pkt.payload) else {
            self.counters.rx_malformed += 1;
            return;
        };
        let Some(sink) = self.gsi_sink.clone() else {
            self.counters.rx_unknown_qp += 1;
            if let Some(reply) = crate::cm::mad::CmMsg::answer_unattended(&mad) {
                let local = Gid::from_ip(d.dst);
                if let Some(i) = self.cfg.gids.iter().position(|g| *g == local) {
                    self.gsi_send(i as u8, d.src, &reply);
                }
            }
            return;
        };
        sink.receive(GsiMad {
            src: d.src,
            dst: d.dst,
            src_qpn: deth.src_qpn.value(),
            mad,
        });
    }

    /// Queues a MAD from QP1 (source address: GID `sgid_index`) to the QP1
    /// at `dst`. Returns `false` if the device has no such GID or is
    /// revoked (nothing is sent).
    pub fn gsi_send(&mut self, sgid_index: u8, dst: IpAddr, mad: &[u8; MAD_LEN]) -> bool {
        if self.revoked {
            return false;
        }
        let mut bth = BthRepr::new(Opcode::UdSendOnly, Qpn::new(GSI_QPN), Psn::new(0));
        bth.pkey = Pkey::DEFAULT;
        let mut h = PacketRepr::new(bth);
        h.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qpn: Qpn::new(GSI_QPN),
        });
        if self.cfg.gids.get(sgid_index as usize).is_none() {
            return false;
        }
        let Some(mut data) = self.new_packet(&h, MAD_LEN) else {
            return false;
        };
        data.extend_from_slice(mad);
        let before = self.tx.len();
        self.queue_packet(GSI_QPN, GSI_QPN, sgid_index, dst, MAD_LEN, data);
        self.tx.len() > before
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::soft::proto::CoreConfig;
    use crate::soft::SoftDevice;
    use crate::verbs::Guid;

    #[derive(Debug, Default)]
    struct Catch(Mutex<Vec<GsiMad>>);

    impl GsiSink for Catch {
        fn receive(&self, mad: GsiMad) {
            self.0.lock().unwrap().push(mad);
        }
    }

    fn core(ip: &str) -> Core {
        Core::new(CoreConfig::new(
            SoftDevice::default_attr(Guid(1)),
            SoftDevice::default_port_attr(),
            vec![Gid::from_ip(ip.parse().unwrap())],
            1,
        ))
    }

    fn deliver(to: &mut Core, t: &crate::soft::proto::Transmit) {
        to.handle_datagram(
            0,
            Datagram {
                src: t.src,
                dst: t.dst,
                src_port: t.src_port,
                dst_port: t.dst_port,
                data: &t.data,
                train: None,
            },
        );
    }

    #[test]
    fn a_mad_goes_from_qp1_to_the_peer_s_sink() {
        let (mut a, mut b) = (core("10.1.1.1"), core("10.1.1.2"));
        let sink = Arc::new(Catch::default());
        b.set_gsi_sink(Some(sink.clone()));
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[255] = 0xee;
        assert!(a.gsi_send(0, "10.1.1.2".parse().unwrap(), &mad));
        assert!(!a.gsi_send(3, "10.1.1.2".parse().unwrap(), &mad), "no such GID");
        let t = a.poll_transmit().unwrap();
        // BTH (12) + DETH (8) + MAD (256) + ICRC (4).
        assert_eq!(t.data.len(), 12 + 8 + MAD_LEN + 4);
        assert_eq!(t.data[0], 0x64); // UD SEND_ONLY
        assert_eq!(&t.data[5..8], &[0, 0, 1]); // to QP1
        assert_eq!(&t.data[12..16], &GSI_QKEY.to_be_bytes());
        deliver(&mut b, &t);
        let got = sink.0.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].src_qpn, got[0].mad), (1, mad));
        assert_eq!(got[0].src, "10.1.1.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn wrong_qkey_bad_icrc_and_no_sink_are_dropped_and_counted() {
        let (mut a, mut b) = (core("10.1.1.1"), core("10.1.1.2"));
        let mad = [0u8; MAD_LEN];
        a.gsi_send(0, "10.1.1.2".parse().unwrap(), &mad);
        let t = a.poll_transmit().unwrap();
        // Nobody owns QP1: an unknown QP, as before the GSI.
        deliver(&mut b, &t);
        assert_eq!(b.counters().rx_unknown_qp, 1);
        let sink = Arc::new(Catch::default());
        b.set_gsi_sink(Some(sink.clone()));
        let mut bad = t.clone();
        bad.data[12] ^= 1; // the Q_Key (and so the ICRC)
        deliver(&mut b, &bad);
        assert_eq!(b.counters().rx_bad_icrc, 1);
        b.cfg.check_icrc = false;
        deliver(&mut b, &bad);
        assert_eq!(b.counters().rx_bad_qkey, 1);
        assert!(sink.0.lock().unwrap().is_empty());
    }

    #[test]
    fn without_a_cm_a_request_is_refused_at_once() {
        use crate::cm::mad::{rej, CmMsg, Ids};
        let (mut a, mut b) = (core("10.1.1.1"), core("10.1.1.2"));
        let ask = |a: &mut Core, b: &mut Core, m: &CmMsg| {
            assert!(a.gsi_send(0, "10.1.1.2".parse().unwrap(), &m.encode(0x42)));
            deliver(b, &a.poll_transmit().unwrap());
            b.poll_transmit()
        };
        let dreq = CmMsg::Dreq(Ids {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: 0,
            private_data: Vec::new(),
        });
        // No sink: the device answers the DREQ itself, from the address
        // it was sent to, back to the sender's QP1.
        let t = ask(&mut a, &mut b, &dreq).expect("a DREP");
        assert_eq!(
            (t.src, t.dst),
            ("10.1.1.2".parse().unwrap(), "10.1.1.1".parse().unwrap())
        );
        assert_eq!(&t.data[5..8], &[0, 0, 1]);
        deliver(&mut a, &t);
        assert_eq!(a.counters().rx_unknown_qp, 1);
        let mad: [u8; MAD_LEN] = t.data[20..20 + MAD_LEN].try_into().unwrap();
        let (tid, got) = CmMsg::decode(&mad).unwrap();
        assert_eq!(tid, 0x42);
        assert!(matches!(
            got,
            CmMsg::Drep(Ids {
                local_comm_id: 6,
                remote_comm_id: 5,
                ..
            })
        ));
        assert_eq!(b.counters().rx_unknown_qp, 1);
        // A REJ (or anything but a request) is not answered.
        let rej = CmMsg::Rej(crate::cm::mad::Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: crate::cm::mad::MsgRef::Req,
            reason: rej::TIMEOUT,
            private_data: Vec::new(),
        });
        assert!(ask(&mut a, &mut b, &rej).is_none());
        // With a sink, the CM answers: the device does not.
        b.set_gsi_sink(Some(Arc::new(Catch::default())));
        assert!(ask(&mut a, &mut b, &dreq).is_none());
    }
}
