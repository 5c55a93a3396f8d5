//! `verbs::Connect` end to end on in-process soft devices: endpoints swapped
//! over TCP with `verbs::exchange`, RC with the default rights (an RDMA
//! WRITE into the announced buffer), rights cut down to the MR's, UC and
//! UD, bring-up from INIT, and a QP in the wrong state refused.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs::soft::{SoftDevice, SoftDeviceConfig};
use softverbs::verbs::*;

fn devices() -> (Arc<SoftDevice>, Arc<SoftDevice>) {
    static N: AtomicU32 = AtomicU32::new(1);
    let mk = || {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let ip = IpAddr::V4(Ipv4Addr::new(10, 214, (n >> 8) as u8, n as u8));
        SoftDevice::create(SoftDeviceConfig::new(&format!("conn_{}_{n}", std::process::id()), ip)).unwrap()
    };
    (mk(), mk())
}

struct Side {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(dev: &Arc<SoftDevice>, qp_type: QpType, access: AccessFlags) -> Side {
    let ctx = dev.open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.cq_builder(32).create().unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(qp_type, &cq, &cq)).unwrap();
    let mr = pd.alloc_mr(4096, access).unwrap();
    Side { ctx, pd, cq, qp, mr }
}

/// Polls `cq` until one completion arrives (the in-process peers complete
/// inside the posting thread, so polling is all it takes).
fn one(cq: &Cq) -> WorkCompletion {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default()];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        std::thread::yield_now();
    }
}

fn write(from: &Side, to: RemoteAddr, byte: u8) -> WorkCompletion {
    from.mr.fill(0, 16, byte).unwrap();
    let sge = [from.mr.sge(0, 16).unwrap()];
    from.qp
        .post_send(&[SendWr::new(7, SendOp::Write { remote: to }, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    one(&from.cq)
}

#[test]
fn rc_over_a_tcp_exchange_with_default_rights_writes_into_the_announced_buffer() {
    let (da, db) = devices();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (a, b) = (side(&da, QpType::Rc, rw), side(&db, QpType::Rc, rw));
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap();
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap().with_buffer(&b.mr);

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let client = std::thread::spawn(move || exchange::connect(addr, &eb, Duration::from_secs(20)).unwrap().1);
    let (_s, got_b_side) = exchange::serve(&l, &ea, Some(Duration::from_secs(60)), &mut |_| {}).unwrap();
    let got_a_side = client.join().unwrap();
    assert_eq!(got_b_side, eb);
    assert_eq!(got_a_side, ea);

    a.qp.connect(&a.ctx, &ea, &got_b_side).unwrap();
    b.qp.connect(&b.ctx, &eb, &got_a_side).unwrap();
    let attr = a.qp.query().unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(attr.sq_psn, ea.psn);
    assert!(attr
        .qp_access_flags
        .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ));
    let dev = a.ctx.query_device().unwrap();
    assert_eq!(u32::from(attr.max_rd_atomic), dev.max_qp_init_rd_atom.min(255));

    let buf = got_b_side.buffer.unwrap();
    let wc = write(&a, buf.at(100), 0x3c);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(b.mr.to_vec(100, 16).unwrap(), vec![0x3c; 16]);
}

#[test]
fn rights_cut_to_the_mr_refuse_a_write_with_vendor_code_0x53() {
    let (da, db) = devices();
    let ro = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let (a, b) = (
        side(&da, QpType::Rc, AccessFlags::LOCAL_WRITE),
        side(&db, QpType::Rc, ro),
    );
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap();
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap().with_buffer(&b.mr);
    a.qp.connect(&a.ctx, &ea, &eb).unwrap();
    Connect::new().mr(&b.mr).apply(&b.ctx, &b.qp, &eb, Some(&ea)).unwrap();
    assert_eq!(b.qp.query().unwrap().qp_access_flags, AccessFlags::REMOTE_READ);
    let wc = write(&a, eb.buffer.unwrap().at(0), 1);
    assert_eq!((wc.status, wc.vendor_err), (WcStatus::RemAccessErr, 0x53), "{wc:?}");
}

#[test]
fn uc_from_init_and_ud_connect_and_carry_a_send() {
    let (da, db) = devices();
    let lw = AccessFlags::LOCAL_WRITE;
    // UC, with B taken to INIT first (receives posted before the peer is known).
    let (a, b) = (side(&da, QpType::Uc, lw), side(&db, QpType::Uc, lw));
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap();
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap();
    Connect::new().init(&b.ctx, &b.qp, &eb).unwrap();
    let rsge = [b.mr.sge(0, 64).unwrap()];
    b.qp.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    a.qp.connect(&a.ctx, &ea, &eb).unwrap();
    b.qp.connect(&b.ctx, &eb, &ea).unwrap();
    assert_eq!(b.qp.query().unwrap().qp_access_flags, AccessFlags::REMOTE_WRITE);
    let sge = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::new(2, SendOp::Send, &sge).flags(SendFlags::SIGNALED)])
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    assert_eq!((one(&b.cq).wr_id, one_more_is_none(&b.cq)), (1, true));

    // UD: RTS without a remote; the AV comes from the peer's endpoint.
    let (a, b) = (side(&da, QpType::Ud, lw), side(&db, QpType::Ud, lw));
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap();
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap();
    Connect::new().apply(&a.ctx, &a.qp, &ea, None).unwrap();
    Connect::new().apply(&b.ctx, &b.qp, &eb, None).unwrap();
    assert_eq!(b.qp.query().unwrap().qkey, DEFAULT_QKEY);
    let rsge = [b.mr.sge(0, 128).unwrap()];
    b.qp.post_recv(&[RecvWr::new(3, &rsge)]).unwrap();
    let ah = a.pd.create_ah(&eb.ah_attr(ea.gid_index, ea.port)).unwrap();
    let sge = [a.mr.sge(0, 8).unwrap()];
    a.qp.post_send(&[SendWr::new(4, SendOp::Send, &sge)
        .flags(SendFlags::SIGNALED)
        .ud(&ah, eb.qpn, eb.qkey)])
        .unwrap();
    assert_eq!(one(&a.cq).status, WcStatus::Success);
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status, r.src_qp), (3, WcStatus::Success, ea.qpn));
}

fn one_more_is_none(cq: &Cq) -> bool {
    let mut wc = [WorkCompletion::default()];
    cq.poll(&mut wc).unwrap() == 0
}

#[test]
fn rc_and_uc_need_a_remote_and_a_qp_past_init_is_refused() {
    let (da, db) = devices();
    let lw = AccessFlags::LOCAL_WRITE;
    let (a, b) = (side(&da, QpType::Rc, lw), side(&db, QpType::Rc, lw));
    let ea = Endpoint::local(&a.ctx, &a.qp, 1, 0).unwrap();
    let eb = Endpoint::local(&b.ctx, &b.qp, 1, 0).unwrap();
    let e = Connect::new().apply(&a.ctx, &a.qp, &ea, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    a.qp.connect(&a.ctx, &ea, &eb).unwrap();
    let e = a.qp.connect(&a.ctx, &ea, &eb).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.detail().contains("RTS"), "{e}");
}
