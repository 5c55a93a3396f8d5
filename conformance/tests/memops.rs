//! Fast registration, memory windows and re-registration on the soft
//! provider (issue 6): the FREE/VALID state machine, every invalidation
//! path, key rotation, windows of both types, rereg of access, PD and
//! translation.

use std::time::Duration;

use softverbs::verbs::*;
use softverbs_conformance::harness::*;

const T: Duration = Duration::from_secs(5);

fn pair() -> Pair {
    let devs = softverbs::soft::embedded_default().unwrap();
    let cfg = PairConfig {
        mr_access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND,
        ..PairConfig::default()
    };
    Pair::new(&devs[0].open().unwrap(), &devs[1].open().unwrap(), cfg).unwrap()
}

fn post(side: &Side, wr: SendWr<'_>) -> WorkCompletion {
    side.qp
        .post_send(&[wr.flags(wr.send_flags | SendFlags::SIGNALED)])
        .unwrap();
    side.wait_send(T).unwrap()
}

/// A on B: RDMA write of `data` to `remote`; returns the status.
fn write(p: &Pair, remote: RemoteAddr, data: &[u8]) -> WcStatus {
    p.a.mr.write(0, data).unwrap();
    let sge = [p.a.mr.sge(0, data.len() as u32).unwrap()];
    post(&p.a, SendWr::new(9, SendOp::Write { remote }, &sge)).status
}

/// B registers a fast-registration MR over its buffer at `offset..+len`.
fn fast_reg(p: &Pair, offset: u64, len: u32, access: AccessFlags) -> (Mr, WorkCompletion) {
    let fmr = p.b.pd.alloc_fast_reg_mr(4).unwrap();
    let sge = [p.b.mr.sge(offset, len).unwrap()];
    assert_eq!(fmr.map_pages(&sge, 4096).unwrap(), 1);
    let key = fmr.next_key();
    let wc = post(&p.b, SendWr::new(1, SendOp::RegMr { mr: &fmr, key, access }, &[]));
    (fmr, wc)
}

#[test]
fn fast_registration_free_valid_free_with_key_rotation() {
    let p = pair();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let fmr = p.b.pd.alloc_fast_reg_mr(4).unwrap();
    // FREE: no access through it, even with the right key.
    assert_eq!(write(&p, fmr.remote(0), b"x"), WcStatus::RemAccessErr);
    let p = pair();
    let (fmr, wc) = fast_reg(&p, 4096, 8192, access);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::RegMr));
    let old_rkey = fmr.rkey();
    assert_eq!(fmr.addr(), p.b.mr.addr() + 4096);
    assert_eq!(write(&p, fmr.remote(10), b"through frmr"), WcStatus::Success);
    assert_eq!(p.b.mr.to_vec(4096 + 10, 12).unwrap(), b"through frmr");
    // LOCAL_INV makes it FREE again.
    let wc = post(&p.b, SendWr::new(2, SendOp::LocalInv { key: fmr.lkey() }, &[]));
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::LocalInv));
    assert_eq!(write(&p, fmr.remote(0), b"y"), WcStatus::RemAccessErr);
    // Re-register with a rotated key: the old rkey is dead, the new one works.
    let p = pair();
    let (fmr, _) = fast_reg(&p, 0, 4096, access);
    let first = fmr.rkey();
    post(&p.b, SendWr::new(3, SendOp::LocalInv { key: first }, &[]));
    let sge = [p.b.mr.sge(0, 4096).unwrap()];
    fmr.map_pages(&sge, 4096).unwrap();
    let key = fmr.next_key();
    assert_eq!(key >> 8, first >> 8);
    assert_ne!(key, first);
    assert_eq!(
        post(&p.b, SendWr::new(4, SendOp::RegMr { mr: &fmr, key, access }, &[])).status,
        WcStatus::Success
    );
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: fmr.addr(),
                rkey: first
            },
            b"z"
        ),
        WcStatus::RemAccessErr
    );
    let _ = old_rkey;
    let p2 = pair();
    let (fmr2, _) = fast_reg(&p2, 0, 4096, access);
    assert_eq!(write(&p2, fmr2.remote(0), b"ok"), WcStatus::Success);
}

#[test]
fn reg_mr_on_a_valid_mr_and_key_index_change_fail() {
    let p = pair();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (fmr, wc) = fast_reg(&p, 0, 4096, access);
    assert_eq!(wc.status, WcStatus::Success);
    // REG_MR on a VALID MR is a memory-management error and the QP goes to ERR.
    let key = fmr.next_key();
    let wc = post(&p.b, SendWr::new(5, SendOp::RegMr { mr: &fmr, key, access }, &[]));
    assert_eq!(wc.status, WcStatus::MwBindErr);
    assert_eq!(p.b.state().unwrap(), QpState::Err);
    // A key with another index is rejected at post time.
    let p = pair();
    let fmr = p.b.pd.alloc_fast_reg_mr(1).unwrap();
    let bad = fmr.lkey() ^ 0x100;
    let e =
        p.b.qp
            .post_send(&[SendWr::new(
                6,
                SendOp::RegMr {
                    mr: &fmr,
                    key: bad,
                    access,
                },
                &[],
            )])
            .unwrap_err();
    assert_eq!((e.index, e.error.kind()), (0, ErrorKind::InvalidArgument));
}

#[test]
fn short_mapping_reports_how_many_entries_fit() {
    let p = pair();
    let fmr = p.b.pd.alloc_fast_reg_mr(2).unwrap();
    let sges = [
        p.b.mr.sge(0, 4096).unwrap(),
        p.b.mr.sge(4096, 4096).unwrap(),
        p.b.mr.sge(8192, 4096).unwrap(),
    ];
    assert_eq!(fmr.map_pages(&sges, 4096).unwrap(), 2);
    assert_eq!(fmr.length(), 8192);
    // A gap that is not page aligned stops the mapping.
    let fmr = p.b.pd.alloc_fast_reg_mr(8).unwrap();
    let sges = [p.b.mr.sge(0, 100).unwrap(), p.b.mr.sge(4096, 4096).unwrap()];
    assert_eq!(fmr.map_pages(&sges, 4096).unwrap(), 1);
    assert!(p.b.pd.alloc_fast_reg_mr(100_000).is_err());
}

#[test]
fn send_with_invalidate_frees_the_responders_mr() {
    let p = pair();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (fmr, _) = fast_reg(&p, 0, 4096, access);
    p.b.post_recv(20, 16384, 64).unwrap();
    p.a.mr.write(0, b"bye").unwrap();
    let sge = [p.a.mr.sge(0, 3).unwrap()];
    let wc = post(&p.a, SendWr::new(7, SendOp::SendWithInv { rkey: fmr.rkey() }, &sge));
    assert_eq!(wc.status, WcStatus::Success);
    let wc = p.b.wait_recv(T).unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.invalidated_rkey(), Some(fmr.rkey()));
    assert_eq!(write(&p, fmr.remote(0), b"late"), WcStatus::RemAccessErr);
}

#[test]
fn failed_remote_invalidation_is_an_invalid_request() {
    let p = pair();
    p.b.post_recv(21, 16384, 64).unwrap();
    let sge = [p.a.mr.sge(0, 3).unwrap()];
    // A plain MR cannot be invalidated.
    let wc = post(&p.a, SendWr::new(8, SendOp::SendWithInv { rkey: p.b.mr.rkey() }, &sge));
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.wait_recv(T).unwrap().status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.state().unwrap(), QpState::Err);
}

#[test]
fn type1_window_bind_access_rebind_and_zero_length_unbind() {
    let p = pair();
    let mw = p.b.pd.alloc_mw(MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr: &p.b.mr,
        addr: p.b.mr.addr() + 1024,
        length: 512,
        access: AccessFlags::REMOTE_WRITE,
    };
    let rkey = p.b.qp.bind_mw(&mw, 30, &bind, SendFlags::SIGNALED).unwrap();
    assert_eq!(rkey, mw.rkey());
    let wc = p.b.wait_send(T).unwrap();
    assert_eq!(
        (wc.status, wc.opcode, wc.wr_id),
        (WcStatus::Success, WcOpcode::BindMw, 30)
    );
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr() + 1024,
                rkey
            },
            b"win"
        ),
        WcStatus::Success
    );
    assert_eq!(p.b.mr.to_vec(1024, 3).unwrap(), b"win");
    // Outside the window.
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr() + 1536,
                rkey
            },
            b"o"
        ),
        WcStatus::RemAccessErr
    );
    let p = pair();
    let mw = p.b.pd.alloc_mw(MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr: &p.b.mr,
        addr: p.b.mr.addr(),
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
    };
    let rkey = p.b.qp.bind_mw(&mw, 31, &bind, SendFlags::SIGNALED).unwrap();
    p.b.wait_send(T).unwrap();
    // Deregistering the MR with a bound window is EBUSY.
    let mr = p.b.mr.ops().clone();
    assert_eq!(mr.dereg().unwrap_err().kind(), ErrorKind::Busy);
    // Zero-length bind invalidates.
    let unbind = MwBindInfo { length: 0, ..bind };
    p.b.qp.bind_mw(&mw, 32, &unbind, SendFlags::SIGNALED).unwrap();
    assert_eq!(p.b.wait_send(T).unwrap().status, WcStatus::Success);
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr(),
                rkey
            },
            b"x"
        ),
        WcStatus::RemAccessErr
    );
}

#[test]
fn type2_window_bind_wr_local_and_remote_invalidation_and_dealloc() {
    let p = pair();
    let mw = p.b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = MwBindInfo {
        mr: &p.b.mr,
        addr: p.b.mr.addr(),
        length: 4096,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    };
    let rkey = mw.next_rkey();
    let wc = post(&p.b, SendWr::new(40, SendOp::BindMw { mw: &mw, rkey, bind }, &[]));
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::BindMw));
    assert_eq!(mw.rkey(), rkey);
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr(),
                rkey
            },
            b"t2"
        ),
        WcStatus::Success
    );
    // Binding a bound type 2 window again fails.
    let p2 = pair();
    let mw2 = p2.b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind2 = MwBindInfo {
        mr: &p2.b.mr,
        addr: p2.b.mr.addr(),
        ..bind
    };
    let k = mw2.next_rkey();
    let wc = post(
        &p2.b,
        SendWr::new(
            41,
            SendOp::BindMw {
                mw: &mw2,
                rkey: k,
                bind: bind2,
            },
            &[],
        ),
    );
    assert_eq!(wc.status, WcStatus::Success);
    let k2 = mw2.next_rkey();
    assert_eq!(
        post(
            &p2.b,
            SendWr::new(
                42,
                SendOp::BindMw {
                    mw: &mw2,
                    rkey: k2,
                    bind: bind2
                },
                &[]
            )
        )
        .status,
        WcStatus::MwBindErr
    );
    // LOCAL_INV unbinds.
    let wc = post(&p.b, SendWr::new(43, SendOp::LocalInv { key: rkey }, &[]));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr(),
                rkey
            },
            b"x"
        ),
        WcStatus::RemAccessErr
    );
    // Remote invalidation through SEND_WITH_INV.
    let p = pair();
    let mw = p.b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = MwBindInfo {
        mr: &p.b.mr,
        addr: p.b.mr.addr(),
        ..bind
    };
    let rkey = mw.next_rkey();
    post(&p.b, SendWr::new(44, SendOp::BindMw { mw: &mw, rkey, bind }, &[]));
    p.b.post_recv(45, 16384, 64).unwrap();
    let sge = [p.a.mr.sge(0, 1).unwrap()];
    assert_eq!(
        post(&p.a, SendWr::new(46, SendOp::SendWithInv { rkey }, &sge)).status,
        WcStatus::Success
    );
    assert_eq!(p.b.wait_recv(T).unwrap().invalidated_rkey(), Some(rkey));
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr(),
                rkey
            },
            b"x"
        ),
        WcStatus::RemAccessErr
    );
    // Dealloc of a bound window invalidates it and releases the MR.
    let p = pair();
    let mw = p.b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = MwBindInfo {
        mr: &p.b.mr,
        addr: p.b.mr.addr(),
        ..bind
    };
    let rkey = mw.next_rkey();
    post(&p.b, SendWr::new(47, SendOp::BindMw { mw: &mw, rkey, bind }, &[]));
    mw.destroy().unwrap();
    assert_eq!(
        write(
            &p,
            RemoteAddr {
                addr: p.b.mr.addr(),
                rkey
            },
            b"x"
        ),
        WcStatus::RemAccessErr
    );
}

#[test]
fn window_bind_needs_mw_bind_access_on_the_mr() {
    let p = pair();
    let plain = p.b.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mw = p.b.pd.alloc_mw(MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr: &plain,
        addr: plain.addr(),
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    p.b.qp.bind_mw(&mw, 50, &bind, SendFlags::SIGNALED).unwrap();
    assert_eq!(p.b.wait_send(T).unwrap().status, WcStatus::MwBindErr);
}

#[test]
fn rereg_access_pd_and_translation_apply_to_later_traffic() {
    let p = pair();
    assert_eq!(write(&p, p.b.mr.remote(0), b"before"), WcStatus::Success);
    p.b.mr
        .rereg(
            ReregFlags::CHANGE_ACCESS,
            None,
            None,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    assert_eq!(write(&p, p.b.mr.remote(0), b"after"), WcStatus::RemAccessErr);

    // CHANGE_PD: a receive WQE whose lkey now belongs to another PD fails
    // with the remote-operation error.
    let p = pair();
    let other = p.b.ctx.alloc_pd().unwrap();
    p.b.post_recv(60, 0, 64).unwrap();
    p.b.mr
        .rereg(ReregFlags::CHANGE_PD, Some(&other), None, AccessFlags::empty())
        .unwrap();
    let sge = [p.a.mr.sge(0, 4).unwrap()];
    assert_eq!(
        post(&p.a, SendWr::new(61, SendOp::Send, &sge)).status,
        WcStatus::RemOpErr
    );
    assert_eq!(p.b.wait_recv(T).unwrap().status, WcStatus::LocProtErr);

    // CHANGE_TRANSLATION: new memory under the same keys.
    let p = pair();
    let mem = MrMemory::new(8192).unwrap();
    let new_addr = mem.addr();
    p.b.mr
        .rereg(
            ReregFlags::CHANGE_TRANSLATION,
            None,
            Some(MemorySource::Owned(mem)),
            AccessFlags::empty(),
        )
        .unwrap();
    assert_eq!(p.b.mr.addr(), new_addr);
    assert_eq!(write(&p, p.b.mr.remote(100), b"moved"), WcStatus::Success);
    assert_eq!(p.b.mr.to_vec(100, 5).unwrap(), b"moved");
}
