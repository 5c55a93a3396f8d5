//! The key checks of the memory verbs and local operations (registration,
//! re-registration, deregistration, memory window binds, fast
//! registration, invalidation), driven at the engine: each test names the
//! check it pins down, and each was written against a mutant of that
//! check that the rest of the suite let through (docs/testing.md,
//! "Mutation testing").

use crate::verbs::{ErrorKind, MwType};

use super::super::mr::KeyError;
use super::super::qp::LocalOp;
use super::*;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE);

/// A node (one RTS RC QP) with a bindable MR of 4 KiB.
struct Keys {
    n: Node,
    pd: PdId,
    mem: Arc<MemorySource>,
    /// lkey (= rkey) of the bindable MR.
    mr: u32,
}

fn keys() -> Keys {
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let pd = qp_pd(&mut n);
    let mem = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
    let (mr, _) = n
        .core
        .reg_mr(pd, mem.clone(), RW | AccessFlags::MW_BIND | AccessFlags::REMOTE_ATOMIC)
        .unwrap();
    Keys { n, pd, mem, mr }
}

fn qp_pd(n: &mut Node) -> PdId {
    let qp = n.core.take_qp(n.qpn).unwrap();
    let pd = qp.pd;
    n.core.put_qp(qp);
    pd
}

/// Runs a local operation (REG_MR, LOCAL_INV, BIND_MW) on `n`'s QP.
fn local(n: &mut Node, op: LocalOp) -> WcStatus {
    let qp = n.core.take_qp(n.qpn).unwrap();
    let (status, _) = n.core.execute_local_op(&qp, &op);
    n.core.put_qp(qp);
    status
}

/// The same key with its key byte changed (what a bind or REG_MR may do).
fn next_key(key: u32) -> u32 {
    (key & !0xff) | (key.wrapping_add(1) & 0xff)
}

impl Keys {
    fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// Binds window `mw` (its current key) onto `mr` at `off..off + len`;
    /// returns the status and the key the bind asked for.
    #[allow(clippy::too_many_arguments)]
    fn bind(&mut self, mw: u32, mr: u32, off: u64, len: u64, access: AccessFlags, type1: bool) -> (WcStatus, u32) {
        let new_key = next_key(mw);
        let op = LocalOp::Bind {
            mw_key: mw,
            new_key,
            mr_key: mr,
            addr: self.addr() + off,
            len,
            access,
            type1,
        };
        (local(&mut self.n, op), new_key)
    }

    fn remote(&self, rkey: u32, qpn: u32, off: u64, len: u64, need: AccessFlags) -> std::result::Result<(), KeyError> {
        let pd = self.pd;
        self.n
            .core
            .mrs
            .check_remote(rkey, pd, qpn, self.addr() + off, len, need)
            .map(|_| ())
    }

    fn window(&mut self, t: MwType) -> u32 {
        self.n.core.alloc_mw(self.pd, t).unwrap()
    }
}

fn kind<T: std::fmt::Debug>(r: crate::verbs::Result<T>) -> ErrorKind {
    r.expect_err("the verb must fail").kind()
}

#[test]
fn reg_mr_enforces_the_registration_rule_and_gives_an_rkey_only_with_remote_rights() {
    let mut k = keys();
    let mem = || Arc::new(MemorySource::Owned(MrMemory::new(64).unwrap()));
    let (l, r) =
        k.n.core
            .reg_mr(k.pd, mem(), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
    assert_eq!(r, l, "remote rights: the rkey is the key");
    let (_, r) = k.n.core.reg_mr(k.pd, mem(), AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(r, 0, "no remote right: no rkey");
    // Remote write or atomic without local write breaks ibv_reg_mr(3)'s rule.
    for bad in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(kind(k.n.core.reg_mr(k.pd, mem(), bad)), ErrorKind::InvalidArgument);
        assert!(k.n.core.reg_mr(k.pd, mem(), bad | AccessFlags::LOCAL_WRITE).is_ok());
    }
    // Each access the soft provider cannot honour is refused on its own.
    for unsupported in [AccessFlags::ON_DEMAND, AccessFlags::ZERO_BASED, AccessFlags::HUGETLB] {
        let a = AccessFlags::LOCAL_WRITE | unsupported;
        assert_eq!(
            kind(k.n.core.reg_mr(k.pd, mem(), a)),
            ErrorKind::InvalidArgument,
            "{a:?}"
        );
        assert_eq!(
            kind(k.n.core.rereg_mr(k.mr, None, Some(a), None)),
            ErrorKind::InvalidArgument
        );
    }
}

#[test]
fn dereg_mr_refuses_unknown_keys_windows_and_mrs_with_bound_windows() {
    let mut k = keys();
    assert_eq!(kind(k.n.core.dereg_mr(next_key(k.mr))), ErrorKind::InvalidArgument);
    let mw = k.window(MwType::Type2);
    assert_eq!(
        kind(k.n.core.dereg_mr(mw)),
        ErrorKind::InvalidArgument,
        "a window is no MR"
    );
    let (s, bound) = k.bind(mw, k.mr, 0, 64, AccessFlags::REMOTE_READ, false);
    assert_eq!(s, WcStatus::Success);
    assert_eq!(kind(k.n.core.dereg_mr(k.mr)), ErrorKind::Busy);
    assert_eq!(local(&mut k.n, LocalOp::Inv { key: bound }), WcStatus::Success);
    // The invalidation unbound the window: the MR may go, and its key dies.
    k.n.core.dereg_mr(k.mr).unwrap();
    assert_eq!(
        k.remote(k.mr, k.n.qpn, 0, 8, AccessFlags::REMOTE_READ),
        Err(KeyError::BadKey)
    );
    // A plain MR without windows deregisters at once.
    let (l, _) = k.n.core.reg_mr(k.pd, k.mem.clone(), AccessFlags::LOCAL_WRITE).unwrap();
    k.n.core.dereg_mr(l).unwrap();
    assert_eq!(
        kind(k.n.core.dereg_mr(l)),
        ErrorKind::InvalidArgument,
        "deregistered twice"
    );
}

#[test]
fn rereg_mr_keeps_the_keys_applies_the_new_rights_and_refuses_fast_reg_and_bound_mrs() {
    let mut k = keys();
    let (l, r) =
        k.n.core
            .rereg_mr(k.mr, None, Some(AccessFlags::REMOTE_READ), None)
            .unwrap();
    assert_eq!((l, r), (k.mr, k.mr));
    assert_eq!(k.remote(k.mr, k.n.qpn, 0, 8, AccessFlags::REMOTE_READ), Ok(()));
    assert_eq!(
        k.remote(k.mr, k.n.qpn, 0, 8, AccessFlags::REMOTE_WRITE),
        Err(KeyError::Access)
    );
    let (l, r) =
        k.n.core
            .rereg_mr(k.mr, None, Some(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND), None)
            .unwrap();
    assert_eq!((l, r), (k.mr, 0), "no remote right left: no rkey");
    // A new PD moves the MR.
    let pd2 = k.n.core.alloc_pd(1).unwrap();
    k.n.core.rereg_mr(k.mr, Some(pd2), None, None).unwrap();
    let a = k.addr();
    assert_eq!(
        k.n.core
            .mrs
            .check(k.mr, k.pd, a, 8, AccessFlags::LOCAL_WRITE)
            .map(|_| ()),
        Err(KeyError::WrongPd)
    );
    assert!(k.n.core.mrs.check(k.mr, pd2, a, 8, AccessFlags::LOCAL_WRITE).is_ok());
    k.n.core
        .rereg_mr(k.mr, Some(k.pd), Some(RW | AccessFlags::MW_BIND), None)
        .unwrap();
    // Bound windows make it busy.
    let mw = k.window(MwType::Type1);
    let (s, w) = k.bind(mw, k.mr, 0, 64, AccessFlags::REMOTE_READ, true);
    assert_eq!(s, WcStatus::Success);
    assert_eq!(kind(k.n.core.rereg_mr(k.mr, None, Some(RW), None)), ErrorKind::Busy);
    // Only MRs from reg_mr can be re-registered.
    let fr = k.n.core.alloc_fast_reg_mr(k.pd, 1).unwrap();
    assert_eq!(
        kind(k.n.core.rereg_mr(fr, None, Some(RW), None)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(k.n.core.rereg_mr(w, None, Some(RW), None)),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn a_bound_window_grants_only_its_range_and_its_rights() {
    let mut k = keys();
    let mw = k.window(MwType::Type1);
    let (s, w) = k.bind(mw, k.mr, 512, 1024, AccessFlags::REMOTE_READ, true);
    assert_eq!(s, WcStatus::Success);
    let qpn = k.n.qpn;
    assert_eq!(
        k.remote(mw, qpn, 512, 8, AccessFlags::REMOTE_READ),
        Err(KeyError::BadKey),
        "old key"
    );
    assert_eq!(
        k.remote(w, qpn, 512, 1024, AccessFlags::REMOTE_READ),
        Ok(()),
        "the whole window"
    );
    // Inside the MR but outside the window, at either end.
    assert_eq!(
        k.remote(w, qpn, 511, 8, AccessFlags::REMOTE_READ),
        Err(KeyError::Bounds)
    );
    assert_eq!(
        k.remote(w, qpn, 512, 1025, AccessFlags::REMOTE_READ),
        Err(KeyError::Bounds)
    );
    assert_eq!(
        k.remote(w, qpn, 1536, 1, AccessFlags::REMOTE_READ),
        Err(KeyError::Bounds)
    );
    // Only the rights of the bind, however many the MR has.
    for need in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(k.remote(w, qpn, 512, 8, need), Err(KeyError::Access), "{need:?}");
    }
    // A type 1 window is not tied to a QP.
    assert_eq!(k.remote(w, qpn + 1, 512, 8, AccessFlags::REMOTE_READ), Ok(()));
    // The bind wrote nothing but the window: the MR's rights are unchanged.
    assert_eq!(k.remote(k.mr, qpn, 0, 8, AccessFlags::REMOTE_WRITE), Ok(()));
}

#[test]
fn a_type2_window_is_tied_to_its_qp_and_must_be_invalidated_before_a_rebind() {
    let mut k = keys();
    let mw = k.window(MwType::Type2);
    let (s, w) = k.bind(mw, k.mr, 0, 4096, AccessFlags::REMOTE_WRITE, false);
    assert_eq!(s, WcStatus::Success);
    let qpn = k.n.qpn;
    assert_eq!(k.remote(w, qpn, 0, 4096, AccessFlags::REMOTE_WRITE), Ok(()));
    assert_eq!(
        k.remote(w, qpn + 1, 0, 8, AccessFlags::REMOTE_WRITE),
        Err(KeyError::WrongPd)
    );
    // Bound: a second bind fails until the window is invalidated.
    assert_eq!(
        k.bind(w, k.mr, 0, 64, AccessFlags::REMOTE_WRITE, false).0,
        WcStatus::MwBindErr
    );
    // Remote invalidation only through the QP it is bound to.
    let pd = k.pd;
    assert_eq!(k.n.core.invalidate(pd, qpn + 1, w, true), Err(()));
    assert_eq!(k.n.core.invalidate(pd, qpn, w, true), Ok(()));
    assert_eq!(
        k.remote(w, qpn, 0, 8, AccessFlags::REMOTE_WRITE),
        Err(KeyError::BadKey),
        "unbound"
    );
    assert_eq!(k.n.core.invalidate(pd, qpn, w, true), Err(()), "already unbound");
    let (s, w2) = k.bind(w, k.mr, 0, 64, AccessFlags::REMOTE_READ, false);
    assert_eq!(s, WcStatus::Success);
    // A local invalidation may come through any QP of the PD.
    assert_eq!(k.n.core.invalidate(pd, qpn + 1, w2, false), Ok(()));
    // The MR counted the window once and uncounted it once: it may go.
    k.n.core.dereg_mr(k.mr).unwrap();
}

#[test]
fn a_type1_window_rebinds_and_a_zero_length_bind_invalidates_it() {
    let mut k = keys();
    let mw = k.window(MwType::Type1);
    let (s, w) = k.bind(mw, k.mr, 0, 64, AccessFlags::REMOTE_READ, true);
    assert_eq!(s, WcStatus::Success);
    let (s, w2) = k.bind(w, k.mr, 64, 64, AccessFlags::REMOTE_READ, true);
    assert_eq!(s, WcStatus::Success, "type 1 windows rebind without invalidation");
    let qpn = k.n.qpn;
    assert_eq!(k.remote(w2, qpn, 64, 64, AccessFlags::REMOTE_READ), Ok(()));
    assert_eq!(k.remote(w2, qpn, 0, 8, AccessFlags::REMOTE_READ), Err(KeyError::Bounds));
    let (s, w3) = k.bind(w2, k.mr, 0, 0, AccessFlags::REMOTE_READ, true);
    assert_eq!(s, WcStatus::Success);
    assert!(k.remote(w3, qpn, 0, 8, AccessFlags::REMOTE_READ).is_err());
    assert!(k.remote(w3, qpn, 64, 8, AccessFlags::REMOTE_READ).is_err());
    // Unbound twice over (rebind, then zero length): the MR may go.
    k.n.core.dereg_mr(k.mr).unwrap();
    // Type 1 windows cannot be invalidated by LOCAL_INV.
    let mut k = keys();
    let mw = k.window(MwType::Type1);
    let (_, w) = k.bind(mw, k.mr, 0, 64, AccessFlags::REMOTE_READ, true);
    assert_eq!(local(&mut k.n, LocalOp::Inv { key: w }), WcStatus::MwBindErr);
}

#[test]
fn a_bind_is_refused_for_each_broken_rule() {
    let mut k = keys();
    let whole = |k: &mut Keys, mw, t1| k.bind(mw, k.mr, 0, 4096, AccessFlags::REMOTE_READ, t1).0;
    // The whole MR, from its first to its last byte, is bindable.
    let t1 = k.window(MwType::Type1);
    assert_eq!(whole(&mut k, t1, true), WcStatus::Success);
    let t2 = k.window(MwType::Type2);
    // The window's type must match the path (verb for type 1, WR for type 2).
    assert_eq!(whole(&mut k, t2, true), WcStatus::MwBindErr);
    // The new key must keep the window's index.
    let op = LocalOp::Bind {
        mw_key: t2,
        new_key: t2 + 0x100,
        mr_key: k.mr,
        addr: k.addr(),
        len: 8,
        access: AccessFlags::REMOTE_READ,
        type1: false,
    };
    assert_eq!(local(&mut k.n, op), WcStatus::MwBindErr);
    // Not a window.
    let mr = k.mr;
    assert_eq!(
        k.bind(mr, mr, 0, 8, AccessFlags::REMOTE_READ, false).0,
        WcStatus::MwBindErr
    );
    // Onto a window rather than an MR.
    let next = next_key(t1);
    assert_eq!(
        k.bind(t2, next, 0, 8, AccessFlags::REMOTE_READ, false).0,
        WcStatus::MwBindErr
    );
    // Out of the MR at either end.
    let a = AccessFlags::REMOTE_READ;
    let op = |addr: u64, len: u64| LocalOp::Bind {
        mw_key: t2,
        new_key: next_key(t2),
        mr_key: k.mr,
        addr,
        len,
        access: a,
        type1: false,
    };
    let base = k.addr();
    assert_eq!(local(&mut k.n, op(base - 1, 8)), WcStatus::MwBindErr);
    assert_eq!(local(&mut k.n, op(base + 1, 4096)), WcStatus::MwBindErr);
    assert_eq!(local(&mut k.n, op(u64::MAX - 4, 8)), WcStatus::MwBindErr);
    // An MR without MW_BIND, or without LOCAL_WRITE for remote write or
    // atomic rights (a remote read right needs no local write).
    let (plain, _) = k.n.core.reg_mr(k.pd, k.mem.clone(), RW).unwrap();
    assert_eq!(k.bind(t2, plain, 0, 8, a, false).0, WcStatus::MwBindErr);
    let ro = AccessFlags::REMOTE_READ | AccessFlags::MW_BIND;
    let (ro_mr, _) = k.n.core.reg_mr(k.pd, k.mem.clone(), ro).unwrap();
    for need_lw in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(
            k.bind(t2, ro_mr, 0, 8, need_lw, false).0,
            WcStatus::MwBindErr,
            "{need_lw:?}"
        );
    }
    assert_eq!(
        k.bind(t2, ro_mr, 0, 8, AccessFlags::REMOTE_READ, false).0,
        WcStatus::Success
    );
    // A window or an MR of another PD.
    let pd2 = k.n.core.alloc_pd(1).unwrap();
    let other_mw = k.n.core.alloc_mw(pd2, MwType::Type2).unwrap();
    assert_eq!(k.bind(other_mw, k.mr, 0, 8, a, false).0, WcStatus::MwBindErr);
    let other = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::REMOTE_READ;
    let (other_mr, _) = k.n.core.reg_mr(pd2, k.mem.clone(), other).unwrap();
    let t2b = k.window(MwType::Type2);
    assert_eq!(k.bind(t2b, other_mr, 0, 8, a, false).0, WcStatus::MwBindErr);
}

#[test]
fn dealloc_mw_unbinds_and_frees_and_refuses_what_is_no_window() {
    let mut k = keys();
    let mw = k.window(MwType::Type1);
    let (_, w) = k.bind(mw, k.mr, 0, 64, AccessFlags::REMOTE_READ, true);
    assert_eq!(
        kind(k.n.core.dealloc_mw(k.mr)),
        ErrorKind::InvalidArgument,
        "an MR is no window"
    );
    k.n.core.dealloc_mw(w).unwrap();
    assert_eq!(kind(k.n.core.dealloc_mw(w)), ErrorKind::InvalidArgument, "freed twice");
    assert_eq!(
        k.remote(w, k.n.qpn, 0, 8, AccessFlags::REMOTE_READ),
        Err(KeyError::BadKey)
    );
    k.n.core.dereg_mr(k.mr).unwrap();
}

/// A fast-registration MR of one page mapped onto the first page of `k`'s
/// memory; returns its key (FREE).
fn mapped_fast_reg(k: &mut Keys) -> u32 {
    let fr = k.n.core.alloc_fast_reg_mr(k.pd, 2).unwrap();
    let sgl = [(k.addr(), 4096, k.mr)];
    assert_eq!(k.n.core.map_mr_pages(fr, &sgl, 4096).unwrap(), (k.addr(), 4096, 1));
    fr
}

#[test]
fn fast_registration_checks_its_access_and_pd_and_invalidation_frees_it() {
    let mut k = keys();
    let fr = mapped_fast_reg(&mut k);
    let qpn = k.n.qpn;
    assert_eq!(
        k.remote(fr, qpn, 0, 8, AccessFlags::REMOTE_READ),
        Err(KeyError::Access),
        "FREE"
    );
    let new = next_key(fr);
    // The registration rule holds for REG_MR too.
    let bad = LocalOp::Reg {
        mr_key: new,
        access: AccessFlags::REMOTE_WRITE,
    };
    assert_eq!(local(&mut k.n, bad), WcStatus::MwBindErr);
    let reg = LocalOp::Reg {
        mr_key: new,
        access: RW,
    };
    assert_eq!(local(&mut k.n, reg), WcStatus::Success);
    assert_eq!(k.remote(new, qpn, 0, 4096, AccessFlags::REMOTE_WRITE), Ok(()));
    assert_eq!(
        k.remote(fr, qpn, 0, 8, AccessFlags::REMOTE_WRITE),
        Err(KeyError::BadKey),
        "old key"
    );
    assert_eq!(
        k.remote(new, qpn, 0, 8, AccessFlags::REMOTE_ATOMIC),
        Err(KeyError::Access)
    );
    // VALID: neither mapped again nor registered again.
    assert_eq!(
        local(
            &mut k.n,
            LocalOp::Reg {
                mr_key: next_key(new),
                access: RW
            }
        ),
        WcStatus::MwBindErr
    );
    // LOCAL_INV of a key of another PD fails; of this one, frees it.
    let pd2 = k.n.core.alloc_pd(1).unwrap();
    assert_eq!(k.n.core.invalidate(pd2, qpn, new, false), Err(()));
    assert_eq!(local(&mut k.n, LocalOp::Inv { key: new }), WcStatus::Success);
    assert_eq!(
        k.remote(new, qpn, 0, 8, AccessFlags::REMOTE_WRITE),
        Err(KeyError::Access),
        "FREE again"
    );
    assert_eq!(
        local(&mut k.n, LocalOp::Inv { key: new }),
        WcStatus::MwBindErr,
        "FREE: nothing to invalidate"
    );
    // A plain MR cannot be invalidated.
    let mr = k.mr;
    assert_eq!(local(&mut k.n, LocalOp::Inv { key: mr }), WcStatus::MwBindErr);
    // REG_MR of another PD's fast-registration MR fails.
    let fr2 = k.n.core.alloc_fast_reg_mr(pd2, 1).unwrap();
    let (l2, _) = k.n.core.reg_mr(pd2, k.mem.clone(), RW).unwrap();
    k.n.core.map_mr_pages(fr2, &[(k.addr(), 4096, l2)], 4096).unwrap();
    let reg = LocalOp::Reg {
        mr_key: next_key(fr2),
        access: RW,
    };
    assert_eq!(local(&mut k.n, reg), WcStatus::MwBindErr);
    // An unmapped FREE MR cannot be registered.
    let fr3 = k.n.core.alloc_fast_reg_mr(k.pd, 1).unwrap();
    let reg = LocalOp::Reg {
        mr_key: next_key(fr3),
        access: RW,
    };
    assert_eq!(local(&mut k.n, reg), WcStatus::MwBindErr);
}

// ----- the responder's checks of remote requests and receive buffers -----

fn set_qp_access(n: &mut Node, access: AccessFlags) {
    let attr = QpAttr {
        qp_access_flags: access,
        ..QpAttr::default()
    };
    n.core.modify_qp(0, n.qpn, &attr, QpAttrMask::ACCESS_FLAGS).unwrap();
}

fn atomic_req(n: &Node, va_off: u64, rkey: u32) -> PacketRepr {
    let mut h = req(Opcode::RcFetchAdd, n.qpn, RQ_PSN);
    h.atomic_eth = Some(AtomicEthRepr {
        va: n.mem.addr() + va_off,
        rkey,
        swap_add: 5,
        compare: 0,
    });
    h
}

/// The request `n` answers with a NAK of `code`, its QP then in ERR.
fn naks(n: &mut Node, h: &PacketRepr, payload: &[u8], code: NakCode) {
    n.inject(0, h, payload);
    let out = n.sent();
    assert_eq!(out.len(), 1, "{:?}: one NAK", h.bth.opcode);
    assert_eq!(aeth_of(&out[0].0), Syndrome::Nak(code), "{:?}", h.bth.opcode);
    assert_eq!(n.state(), QpState::Err);
}

#[test]
fn each_remote_operation_needs_its_right_on_the_qp_unless_it_moves_no_byte() {
    let all = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let write = |n: &Node, len| reth_req(n, Opcode::RcRdmaWriteOnly, RQ_PSN, 0, len, n.rkey);
    let read = |n: &Node, len| reth_req(n, Opcode::RcRdmaReadRequest, RQ_PSN, 0, len, n.rkey);
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    set_qp_access(&mut n, all - AccessFlags::REMOTE_WRITE);
    let h = write(&n, 4);
    naks(&mut n, &h, b"evil", NakCode::RemoteAccessError);
    assert_eq!(n.mem.load_u64(0).unwrap(), 0, "nothing written");
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    set_qp_access(&mut n, all - AccessFlags::REMOTE_READ);
    let h = read(&n, 8);
    naks(&mut n, &h, &[], NakCode::RemoteAccessError);
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    set_qp_access(&mut n, all - AccessFlags::REMOTE_ATOMIC);
    let h = atomic_req(&n, 8, n.rkey);
    naks(&mut n, &h, &[], NakCode::RemoteAccessError);
    assert_eq!(n.mem.load_u64(8).unwrap(), 0, "not executed");
    // Zero-length writes and reads touch no memory and need no right.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    set_qp_access(&mut n, AccessFlags::empty());
    n.inject(0, &write(&n, 0), &[]);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
    let mut h = read(&n, 0);
    h.bth.psn = Psn::new(RQ_PSN + 1);
    n.inject(1, &h, &[]);
    let out = n.sent();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.bth.opcode, Opcode::RcRdmaReadResponseOnly);
    assert!(out[0].1.is_empty());
    assert_eq!(n.state(), QpState::Rts);
}

#[test]
fn key_errors_of_remote_requests_are_counted_by_kind() {
    type Case = (&'static str, fn(&mut Node) -> PacketRepr, fn(&Counters) -> u64);
    let cases: [Case; 6] = [
        (
            "bad rkey",
            |n| reth_req(n, Opcode::RcRdmaWriteOnly, RQ_PSN, 0, 4, n.rkey ^ 0x80),
            |c| c.rx_bad_rkey,
        ),
        (
            "bounds",
            |n| reth_req(n, Opcode::RcRdmaWriteOnly, RQ_PSN, MEM as u64 - 2, 4, n.rkey),
            |c| c.rx_rkey_bounds,
        ),
        (
            "MR without the right",
            |n| {
                let pd = qp_pd(n);
                let ro = Arc::new(MemorySource::Owned(MrMemory::new(64).unwrap()));
                let (_, rkey) = n.core.reg_mr(pd, ro.clone(), AccessFlags::REMOTE_READ).unwrap();
                let mut h = req(Opcode::RcRdmaWriteOnly, n.qpn, RQ_PSN);
                h.reth = Some(RethRepr {
                    va: ro.addr(),
                    rkey,
                    dma_len: 4,
                });
                h
            },
            |c| c.rx_rkey_access,
        ),
        (
            "MR of another PD",
            |n| {
                let pd = n.core.alloc_pd(1).unwrap();
                let m = Arc::new(MemorySource::Owned(MrMemory::new(64).unwrap()));
                let (_, rkey) = n.core.reg_mr(pd, m.clone(), RW).unwrap();
                let mut h = req(Opcode::RcRdmaWriteOnly, n.qpn, RQ_PSN);
                h.reth = Some(RethRepr {
                    va: m.addr(),
                    rkey,
                    dma_len: 4,
                });
                h
            },
            |c| c.rx_rkey_access,
        ),
        (
            "read, bad rkey",
            |n| reth_req(n, Opcode::RcRdmaReadRequest, RQ_PSN, 0, 8, n.rkey ^ 0x80),
            |c| c.rx_bad_rkey,
        ),
        (
            "atomic, bounds",
            |n| atomic_req(n, MEM as u64, n.rkey),
            |c| c.rx_rkey_bounds,
        ),
    ];
    for (label, make, counter) in cases {
        let mut n = node(QpType::Rc, Mtu::Mtu1024);
        let h = make(&mut n);
        let payload: &[u8] = if h.bth.opcode == Opcode::RcRdmaWriteOnly {
            b"evil"
        } else {
            &[]
        };
        n.inject(0, &h, payload);
        assert_eq!(
            aeth_of(&n.sent()[0].0),
            Syndrome::Nak(NakCode::RemoteAccessError),
            "{label}"
        );
        let c = n.core.counters();
        assert_eq!(counter(c), 1, "{label}");
        assert_eq!(
            c.rx_bad_rkey + c.rx_rkey_access + c.rx_rkey_bounds,
            1,
            "{label}: one kind"
        );
    }
    // A misaligned atomic is an invalid request, counted as such.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let h = atomic_req(&n, 12, n.rkey);
    naks(&mut n, &h, &[], NakCode::InvalidRequest);
    assert_eq!(n.core.counters().rx_misaligned_atomics, 1);
}

#[test]
fn write_packets_fill_the_mtu_and_end_exactly_at_the_dma_length() {
    let first = |n: &Node, dma| reth_req(n, Opcode::RcRdmaWriteFirst, RQ_PSN, 0, dma, n.rkey);
    let last = |n: &Node| req(Opcode::RcRdmaWriteLast, n.qpn, RQ_PSN + 1);
    let bytes = |k: usize, v: u8| vec![v; k];
    // Good: a full first packet, a short last one; both land in place.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.inject(0, &first(&n, 1500), &bytes(1024, 1));
    n.inject(1, &last(&n), &bytes(476, 2));
    assert_eq!(aeth_of(&n.sent().last().unwrap().0), Syndrome::ACK);
    let mut got = vec![0u8; 1502];
    n.mem.read_at(0, &mut got).unwrap();
    assert_eq!(&got[..1024], &bytes(1024, 1)[..]);
    assert_eq!(&got[1024..1500], &bytes(476, 2)[..]);
    assert_eq!(&got[1500..], &[0, 0], "nothing past the DMA length");
    // Bad: a short first packet, a last packet short of or past the DMA
    // length, an only packet of another length than its RETH says.
    #[allow(clippy::type_complexity)]
    let bad: [(&str, &dyn Fn(&mut Node)); 5] = [
        ("short first", &|n| {
            let h = first(n, 2048);
            naks(n, &h, &bytes(1000, 1), NakCode::InvalidRequest)
        }),
        ("short last", &|n| {
            n.inject(0, &first(n, 2048), &bytes(1024, 1));
            n.sent();
            let h = last(n);
            naks(n, &h, &bytes(1000, 1), NakCode::InvalidRequest)
        }),
        ("long last", &|n| {
            n.inject(0, &first(n, 1500), &bytes(1024, 1));
            n.sent();
            let h = last(n);
            naks(n, &h, &bytes(1024, 1), NakCode::InvalidRequest)
        }),
        ("short only", &|n| {
            let h = reth_req(n, Opcode::RcRdmaWriteOnly, RQ_PSN, 0, 8, n.rkey);
            naks(n, &h, b"four", NakCode::InvalidRequest)
        }),
        ("long only", &|n| {
            let h = reth_req(n, Opcode::RcRdmaWriteOnly, RQ_PSN, 0, 2, n.rkey);
            naks(n, &h, b"four", NakCode::InvalidRequest)
        }),
    ];
    for (label, f) in bad {
        let mut n = node(QpType::Rc, Mtu::Mtu1024);
        f(&mut n);
        assert_eq!(n.core.counters().rx_bad_length, 1, "{label}");
    }
}

#[test]
fn a_receive_buffer_is_checked_whole_and_a_message_may_not_overflow_it() {
    // A multi-packet send into a buffer with a bad lkey: LOC_PROT_ERR here,
    // REM_OP_ERR there.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    let sgl = [n.sge(0, 1024), Sge::checked(n.mem.addr() + 1024, 1024, n.lkey ^ 0x80)];
    n.core.post_recv(n.qpn, &[RecvWr::new(6, &sgl)]).unwrap();
    let h = req(Opcode::RcSendFirst, n.qpn, RQ_PSN);
    naks(&mut n, &h, &[1; 1024], NakCode::RemoteOperationalError);
    let wc = n.cqes();
    assert_eq!((wc[0].wr_id, wc[0].status), (6, WcStatus::LocProtErr));
    // Exactly the buffer's length fits; a byte more is a local length
    // error (RC: NAK invalid request; UC: the message is dropped).
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    n.inject(0, &req(Opcode::RcSendOnly, n.qpn, RQ_PSN), &[3; 64]);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
    assert_eq!(
        (n.cqes()[0].status, n.core.counters().rx_recv_too_long),
        (WcStatus::Success, 0)
    );
    n.post_recv(2, 0, 64);
    let h = req(Opcode::RcSendOnly, n.qpn, RQ_PSN + 1);
    naks(&mut n, &h, &[3; 65], NakCode::InvalidRequest);
    assert_eq!(n.cqes()[0].status, WcStatus::LocLenErr);
    assert_eq!(n.core.counters().rx_recv_too_long, 1);
    // Across packets: the second packet overflows.
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(1, 0, 1500);
    n.inject(0, &req(Opcode::RcSendFirst, n.qpn, RQ_PSN), &[1; 1024]);
    assert_eq!(aeth_of(&n.sent()[0].0), Syndrome::ACK);
    let h = req(Opcode::RcSendLast, n.qpn, RQ_PSN + 1);
    naks(&mut n, &h, &[1; 1024], NakCode::InvalidRequest);
    assert_eq!(n.cqes()[0].status, WcStatus::LocLenErr);
    let mut n = node(QpType::Uc, Mtu::Mtu1024);
    n.post_recv(1, 0, 64);
    n.inject(0, &req(Opcode::UcSendOnly, n.qpn, RQ_PSN), &[3; 65]);
    assert!(n.sent().is_empty(), "UC answers nothing");
    assert_eq!(n.cqes()[0].status, WcStatus::LocLenErr);
    assert_eq!(n.state(), QpState::Rts, "UC drops the message, the QP goes on");
}

#[test]
fn a_one_sge_receive_takes_the_same_checks_as_any_other() {
    // The usual receive (one SGE, a plain MR) is checked and placed in one
    // step; that step must refuse what the general path refuses.
    type Spoil = fn(&mut Node) -> (Sge<'static>, Arc<MemorySource>);
    let cases: [(&str, Spoil); 3] = [
        ("an MR of another PD", |n| {
            let pd = n.core.alloc_pd(1).unwrap();
            let m = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
            let (l, _) = n.core.reg_mr(pd, m.clone(), AccessFlags::LOCAL_WRITE).unwrap();
            (Sge::checked(m.addr(), 64, l), m)
        }),
        ("an MR without LOCAL_WRITE", |n| {
            let pd = qp_pd(n);
            let m = Arc::new(MemorySource::Owned(MrMemory::new(4096).unwrap()));
            let (l, _) = n.core.reg_mr(pd, m.clone(), AccessFlags::REMOTE_READ).unwrap();
            (Sge::checked(m.addr(), 64, l), m)
        }),
        ("an SGE starting below its MR", |n| {
            let m = n.mem.clone();
            (Sge::checked(m.addr() - 8, 64, n.lkey), m)
        }),
    ];
    for (label, spoil) in cases {
        let mut n = node(QpType::Rc, Mtu::Mtu1024);
        let (sge, mem) = spoil(&mut n);
        n.core.post_recv(n.qpn, &[RecvWr::new(9, &[sge])]).unwrap();
        let h = req(Opcode::RcSendOnly, n.qpn, RQ_PSN);
        naks(&mut n, &h, b"payload!", NakCode::RemoteOperationalError);
        let wc = n.cqes();
        assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::LocProtErr), "{label}");
        assert_eq!(mem.load_u64(0).unwrap(), 0, "{label}: nothing written");
    }
}

// ----- what a receive completion says -----

#[test]
fn receive_completions_carry_every_field() {
    // RC: a send with immediate, then a failed receive (its status).
    let mut n = node(QpType::Rc, Mtu::Mtu1024);
    n.post_recv(5, 0, 64);
    let mut h = req(Opcode::RcSendOnlyWithImmediate, n.qpn, RQ_PSN);
    h.immdt = Some(wire::ImmDtRepr::from_be_value(0xfeed));
    n.inject(0, &h, b"abc");
    let w = n.cqes()[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data),
        (5, WcStatus::Success, WcOpcode::Recv, 3, 0xfeed)
    );
    assert_eq!(
        (w.qp_num, w.src_qp, w.wc_flags),
        (n.qpn, REMOTE_QPN, crate::verbs::WcFlags::WITH_IMM)
    );
    // UD: the same fields, the GRH flag and the sender's QPN.
    let mut n = node(QpType::Ud, Mtu::Mtu1024);
    n.post_recv(6, 0, 1024);
    let mut h = req(Opcode::UdSendOnlyWithImmediate, n.qpn, 0);
    h.deth = Some(DethRepr {
        qkey: 0x1234,
        src_qpn: Qpn::new(0x42),
    });
    h.immdt = Some(wire::ImmDtRepr::from_be_value(0xbeef));
    n.inject(0, &h, b"datagram");
    let w = n.cqes()[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data),
        (6, WcStatus::Success, WcOpcode::Recv, 40 + 8, 0xbeef)
    );
    let flags = crate::verbs::WcFlags::GRH | crate::verbs::WcFlags::WITH_IMM;
    assert_eq!((w.qp_num, w.src_qp, w.wc_flags), (n.qpn, 0x42, flags));
}
