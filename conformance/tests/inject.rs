//! The harness's raw packet injection (`inject_packet`, soft devices only):
//! a crafted packet reaches the device's QP through its receive path, one
//! that fails a check is dropped and counted like any datagram from the
//! link, and other backends skip.

use std::sync::Arc;
use std::time::Duration;

use softverbs::soft::wire::{BthRepr, DethRepr, Opcode, PacketRepr, Psn, Qpn, ROCEV2_UDP_PORT};
use softverbs::verbs::*;
use softverbs_conformance::case::Stop;
use softverbs_conformance::harness::*;

/// A UD QP in RTS on `ctx`, with its side's objects.
fn ud_side(ctx: &Context, cfg: &PairConfig) -> Side {
    let side = Side::new(ctx, cfg, cfg.psn).unwrap();
    qp_to_init(&side.qp, cfg).unwrap();
    qp_to_rtr(&side.qp, cfg, side.gid_index, side.gid, 0, 0).unwrap();
    qp_to_rts(&side.qp, cfg, cfg.psn).unwrap();
    side
}

#[test]
fn an_injected_packet_reaches_the_qp_and_one_failing_a_check_is_counted() {
    let devs = softverbs::soft::embedded_default().unwrap();
    let (dev_a, dev_b) = (devs[0].device(), devs[1].device());
    let shared: &Arc<softverbs::soft::DeviceShared> = devs[1].shared();
    assert_eq!(shared.roce_port(), ROCEV2_UDP_PORT);
    let (ca, cb) = (dev_a.open().unwrap(), dev_b.open().unwrap());
    let cfg = PairConfig {
        qp_type: QpType::Ud,
        ..PairConfig::default()
    };
    let b = ud_side(&cb, &cfg);
    let (_, a_gid) = first_gid(&ca).unwrap();
    b.post_recv(1, 0, 256).unwrap();
    let mut h = PacketRepr::new(BthRepr::new(Opcode::UdSendOnly, Qpn::new(b.qp.qp_num()), Psn::new(0)));
    h.deth = Some(DethRepr {
        qkey: cfg.qkey,
        src_qpn: Qpn::new(0x42),
    });
    inject_packet(&dev_b, a_gid, &h, b"crafted").unwrap();
    let wc = wait_one(&b.rcq, Duration::from_secs(5)).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.src_qp), (1, WcStatus::Success, 0x42));
    assert_eq!(wc.byte_len, 40 + 7);
    assert_eq!(b.mr.to_vec(40, 7).unwrap(), b"crafted");
    // The receive path's checks apply: a wrong Q_Key is dropped and
    // counted, and nothing completes.
    b.post_recv(2, 0, 256).unwrap();
    h.deth = Some(DethRepr {
        qkey: cfg.qkey ^ 1,
        src_qpn: Qpn::new(0x42),
    });
    let before = shared.counters().rx_bad_qkey;
    inject_packet(&dev_b, a_gid, &h, b"wrong qkey").unwrap();
    assert_eq!(shared.counters().rx_bad_qkey, before + 1);
    assert!(stays_empty(&b.rcq, Duration::from_millis(20)).unwrap());
}

/// A device of another backend, as a device list would hold it (it is never
/// opened here).
struct OtherDevice;

impl softverbs::verbs::backend::DeviceOps for OtherDevice {
    fn name(&self) -> &str {
        "mlx5_9"
    }

    fn node_guid(&self) -> Guid {
        Guid(9)
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Hardware
    }

    fn open(&self) -> Result<Arc<dyn softverbs::verbs::backend::ContextOps>> {
        Err(Error::new(Verb::OpenDevice, ErrorKind::NoDevice, "not a real device"))
    }
}

#[test]
fn injection_skips_on_a_device_of_another_backend() {
    let devs = softverbs::soft::embedded_default().unwrap();
    assert_eq!(require_injection(&devs[0].device()), Ok(()));
    let other = Device::from_ops(Arc::new(OtherDevice));
    let h = PacketRepr::new(BthRepr::new(Opcode::UdSendOnly, Qpn::new(1), Psn::new(0)));
    for r in [
        require_injection(&other),
        inject_packet(&other, Gid::from_ip("127.0.0.1".parse().unwrap()), &h, &[]),
    ] {
        match r {
            Err(Stop::Skip(why)) => assert!(
                why.contains("only the soft provider") && why.contains("mlx5_9"),
                "{why}"
            ),
            other => panic!("expected a skip, got {other:?}"),
        }
    }
}
