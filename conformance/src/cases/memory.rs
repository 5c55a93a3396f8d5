//! `mr.*`: registration, access-flag rules, dereg and rereg, fast
//! registration; `mw.*`: memory windows (docs/design.md §3.1, §3.6).
//!
//! Fast registration and memory windows skip with "not supported by this
//! backend" while the backend returns `EOPNOTSUPP` for them.

use softverbs::verbs::*;

use crate::case::{Cap, Case, Env, Stop};
use crate::harness::*;
use crate::{ensure, ensure_eq, fail};

type R<T> = std::result::Result<T, Stop>;

pub(crate) fn register(out: &mut Vec<Case>) {
    registration(out);
    fast_registration(out);
    windows(out);
}

/// A connected RC pair with the default configuration.
fn rc_pair(env: &Env) -> R<Pair> {
    Ok(Pair::new(&env.a, &env.b, PairConfig::default())?)
}

/// Posts a signaled `len`-byte RDMA write from A's MR (offset 0) to
/// `remote` and returns its completion.
fn write_from_a(p: &Pair, remote: RemoteAddr, len: u32, wr_id: u64) -> R<WorkCompletion> {
    let sge = [p.a.mr.sge(0, len)?];
    p.a.post(SendWr::new(wr_id, SendOp::Write { remote }, &sge).flags(SendFlags::SIGNALED))?;
    expect_one(&p.a.scq, "write completion")
}

/// Posts a signaled local operation on B's QP and checks it completes with
/// `opcode`.
fn local_op_on_b(p: &Pair, op: SendOp<'_>, wr_id: u64, opcode: WcOpcode) -> crate::case::Check {
    p.b.post(SendWr::new(wr_id, op, &[]).flags(SendFlags::SIGNALED))?;
    let wc = expect_one(&p.b.scq, "local operation completion")?;
    check_wc(&wc, wr_id, WcStatus::Success, Some(opcode), "local operation")
}

fn registration(out: &mut Vec<Case>) {
    let l = AccessFlags::LOCAL_WRITE;
    for (id, access, what) in [
        (
            "mr.reg.remote_write_without_local_write",
            AccessFlags::REMOTE_WRITE,
            "REMOTE_WRITE without LOCAL_WRITE",
        ),
        (
            "mr.reg.remote_atomic_without_local_write",
            AccessFlags::REMOTE_ATOMIC,
            "REMOTE_ATOMIC without LOCAL_WRITE",
        ),
        (
            "mr.reg.remote_write_read_without_local_write",
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            "REMOTE_WRITE|REMOTE_READ without LOCAL_WRITE",
        ),
    ] {
        out.push(Case::new(
            id,
            format!("registering with {what} fails with EINVAL"),
            "docs/design.md §3.1; ibv_reg_mr(3) (remote write/atomic require local write)",
            &[],
            move |env: &Env| {
                let pd = env.a.alloc_pd()?;
                expect_err(pd.alloc_mr(4096, access), ErrorKind::InvalidArgument, "reg_mr")
            },
        ));
    }
    for (id, access, what) in [
        (
            "mr.reg.local_read_only",
            AccessFlags::empty(),
            "no access flags (local read)",
        ),
        ("mr.reg.remote_read_only", AccessFlags::REMOTE_READ, "REMOTE_READ alone"),
        ("mr.reg.local_write", l, "LOCAL_WRITE"),
        (
            "mr.reg.full_access",
            Env::full_access(),
            "LOCAL_WRITE and every remote right",
        ),
    ] {
        out.push(Case::new(
            id,
            format!("registering with {what} succeeds and reports the range and access given"),
            "ibv_reg_mr(3)",
            &[],
            move |env: &Env| {
                let pd = env.a.alloc_pd()?;
                let mr = pd.alloc_mr(8192, access)?;
                ensure_eq!(mr.length(), 8192, "MR length");
                ensure!(mr.addr() != 0, "MR address is 0");
                ensure_eq!(mr.access(), access, "MR access");
                ensure!(mr.lkey() != 0, "lkey is 0");
                if access.intersects(AccessFlags::REMOTE) {
                    ensure!(mr.rkey() != 0, "an MR with remote access has rkey 0");
                }
                Ok(())
            },
        ));
    }
    out.push(Case::new(
        "mr.reg.rkey_zero_without_remote_access",
        "an MR without remote access has no rkey (rkey 0)",
        "docs/design.md §3.1 (rkey only with remote access)",
        &[],
        move |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
            ensure_eq!(mr.rkey(), 0, "rkey of a local-only MR");
            Ok(())
        },
    ));
    out.push(Case::new(
        "mr.reg.keys_distinct",
        "16 MRs of one PD have 16 distinct lkeys",
        "IBTA 10.6.2 (L_Key identifies the region)",
        &[],
        move |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mrs: Vec<Mr> = (0..16).map(|_| pd.alloc_mr(4096, l)).collect::<Result<_>>()?;
            let mut keys: Vec<u32> = mrs.iter().map(Mr::lkey).collect();
            keys.sort_unstable();
            keys.dedup();
            ensure_eq!(keys.len(), 16, "distinct lkeys");
            Ok(())
        },
    ));
    out.push(Case::new(
        "mr.dereg.twice_is_idempotent",
        "deregistering an MR succeeds, and a second dereg of the same handle succeeds too",
        "softverbs::verbs::backend (destroy is idempotent once it succeeded)",
        &[],
        move |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, l)?;
            mr.ops().dereg()?;
            mr.ops().dereg()?;
            Ok(())
        },
    ));
    out.push(Case::new(
        "mr.dereg.lkey_invalid_after",
        "a send whose SGE names a deregistered MR completes with LOC_PROT_ERR",
        "docs/design.md §3.4 (bad lkey local); IBTA 10.6.2.1",
        &[],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.a.pd.alloc_mr(4096, l)?;
            let sge = [mr.sge(0, 64)?];
            mr.ops().dereg()?;
            p.b.post_recv(1, 0, 4096)?;
            p.a.post(SendWr::new(7, SendOp::Send, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 7, WcStatus::LocProtErr, None, "send from a deregistered MR")
        },
    ));
    out.push(Case::new(
        "mr.dereg.rkey_invalid_after",
        "an RDMA write to the rkey of a deregistered MR completes with REM_ACCESS_ERR",
        "docs/design.md §3.4 (bad rkey); IBTA 9.7.5.1.3",
        &[],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let target = p.b.pd.alloc_mr(4096, Env::full_access())?;
            let remote = target.remote(0);
            target.ops().dereg()?;
            let wc = write_from_a(&p, remote, 64, 3)?;
            check_wc(&wc, 3, WcStatus::RemAccessErr, None, "write to a deregistered rkey")
        },
    ));
    out.push(Case::new(
        "mr.rereg.grant_remote_write",
        "rereg with CHANGE_ACCESS adding REMOTE_WRITE lets a peer write with the (new) rkey",
        "ibv_rereg_mr(3)",
        &[],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let target = p.b.pd.alloc_mr(4096, l)?;
            target.rereg(ReregFlags::CHANGE_ACCESS, None, None, l | AccessFlags::REMOTE_WRITE)?;
            ensure!(target.rkey() != 0, "rkey still 0 after granting REMOTE_WRITE");
            p.a.mr.write(0, &pattern(64, 1))?;
            let wc = write_from_a(&p, target.remote(0), 64, 4)?;
            check_wc(
                &wc,
                4,
                WcStatus::Success,
                Some(WcOpcode::RdmaWrite),
                "write after rereg",
            )?;
            ensure_eq!(target.to_vec(0, 64)?, pattern(64, 1), "written data");
            Ok(())
        },
    ));
    out.push(Case::new(
        "mr.rereg.revoke_remote_write",
        "rereg with CHANGE_ACCESS removing REMOTE_WRITE makes a later peer write fail with REM_ACCESS_ERR",
        "ibv_rereg_mr(3); docs/design.md §3.4",
        &[],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let target = p.b.pd.alloc_mr(4096, Env::full_access())?;
            let remote = target.remote(0);
            target.rereg(ReregFlags::CHANGE_ACCESS, None, None, l | AccessFlags::REMOTE_READ)?;
            let remote = RemoteAddr {
                rkey: target.rkey(),
                ..remote
            };
            let wc = write_from_a(&p, remote, 64, 5)?;
            check_wc(
                &wc,
                5,
                WcStatus::RemAccessErr,
                None,
                "write after revoking REMOTE_WRITE",
            )
        },
    ));
    out.push(Case::new(
        "mr.rereg.invalid_access_changes_nothing",
        "rereg to REMOTE_WRITE without LOCAL_WRITE fails with EINVAL and the MR keeps its keys and access",
        "ibv_rereg_mr(3); docs/design.md §3.1",
        &[],
        move |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let mr = pd.alloc_mr(4096, Env::full_access())?;
            let before = (mr.lkey(), mr.rkey(), mr.access());
            expect_err(
                mr.rereg(ReregFlags::CHANGE_ACCESS, None, None, AccessFlags::REMOTE_WRITE),
                ErrorKind::InvalidArgument,
                "rereg",
            )?;
            ensure_eq!(
                (mr.lkey(), mr.rkey(), mr.access()),
                before,
                "keys and access after a failed rereg"
            );
            Ok(())
        },
    ));
}

fn fast_registration(out: &mut Vec<Case>) {
    out.push(Case::new(
        "mr.fast_reg.alloc_above_max_pages",
        "allocating a fast-registration MR above max_fast_reg_page_list_len fails with EINVAL",
        "docs/design.md §3.6; kernel ib_alloc_mr(IB_MR_TYPE_MEM_REG)",
        &[Cap::FastReg],
        |env: &Env| {
            let pd = env.a.alloc_pd()?;
            let max = env.caps.device.max_fast_reg_page_list_len;
            expect_err(
                pd.alloc_fast_reg_mr(max + 1),
                ErrorKind::InvalidArgument,
                "alloc_fast_reg_mr",
            )
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.free_mr_access_denied",
        "a fast-registration MR is allocated FREE: a peer write to its key fails with REM_ACCESS_ERR",
        "docs/design.md §3.6 (access to a FREE MR is an access error)",
        &[Cap::FastReg],
        |env: &Env| {
            let p = rc_pair(env)?;
            let fr = p.b.pd.alloc_fast_reg_mr(4)?;
            let remote = RemoteAddr {
                addr: fr.addr(),
                rkey: fr.lkey(),
            };
            let wc = write_from_a(&p, remote, 64, 1)?;
            check_wc(
                &wc,
                1,
                WcStatus::RemAccessErr,
                None,
                "write to a FREE fast-registration MR",
            )
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.register_then_access",
        "map_pages + a REG_MR work request make the MR VALID: the peer writes and reads through the new key",
        "docs/design.md §3.6; IBTA 10.6.3.3 (fast registration)",
        &[Cap::FastReg],
        |env: &Env| {
            let (p, fr, _buf, key) = fast_registered(env)?;
            p.a.mr.write(0, &pattern(256, 2))?;
            let remote = RemoteAddr {
                addr: fr.addr(),
                rkey: key,
            };
            let wc = write_from_a(&p, remote, 256, 10)?;
            check_wc(
                &wc,
                10,
                WcStatus::Success,
                Some(WcOpcode::RdmaWrite),
                "write through the fast-registered key",
            )?;
            let sge = [p.a.mr.sge(4096, 256)?];
            p.a.post(SendWr::new(11, SendOp::Read { remote }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "read completion")?;
            check_wc(&wc, 11, WcStatus::Success, Some(WcOpcode::RdmaRead), "read back")?;
            ensure_eq!(
                p.a.mr.to_vec(4096, 256)?,
                pattern(256, 2),
                "data read back through the MR"
            );
            Ok(())
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.local_inv_frees",
        "LOCAL_INV of a VALID fast-registration MR makes it FREE: a later peer write fails with REM_ACCESS_ERR",
        "docs/design.md §3.6; IBTA 10.6.5 (local invalidate)",
        &[Cap::FastReg],
        |env: &Env| {
            let (p, fr, _buf, key) = fast_registered(env)?;
            local_op_on_b(&p, SendOp::LocalInv { key }, 20, WcOpcode::LocalInv)?;
            let wc = write_from_a(
                &p,
                RemoteAddr {
                    addr: fr.addr(),
                    rkey: key,
                },
                64,
                21,
            )?;
            check_wc(&wc, 21, WcStatus::RemAccessErr, None, "write after LOCAL_INV")
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.send_with_invalidate",
        "SEND_WITH_INV of a fast-registered rkey invalidates it: the receive reports WITH_INV and the key",
        "docs/design.md §3.5, §3.6; IBTA 9.4.1.1.2 (send with invalidate)",
        &[Cap::FastReg],
        |env: &Env| {
            let (p, fr, _buf, key) = fast_registered(env)?;
            p.b.post_recv(30, 8192, 1024)?;
            let sge = [p.a.mr.sge(0, 16)?];
            p.a.post(SendWr::new(31, SendOp::SendWithInv { rkey: key }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 31, WcStatus::Success, Some(WcOpcode::Send), "send with invalidate")?;
            let wc = expect_one(&p.b.rcq, "receive completion")?;
            check_wc(&wc, 30, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(
                wc.invalidated_rkey(),
                Some(key),
                "invalidated rkey in the receive completion"
            );
            let wc = write_from_a(
                &p,
                RemoteAddr {
                    addr: fr.addr(),
                    rkey: key,
                },
                64,
                32,
            )?;
            check_wc(
                &wc,
                32,
                WcStatus::RemAccessErr,
                None,
                "write after send with invalidate",
            )
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.key_byte_rotates",
        "after invalidate and re-registration with the next key byte, the previous key is refused",
        "docs/design.md §3.6 (key bytes rotate on every registration)",
        &[Cap::FastReg],
        |env: &Env| {
            let (p, fr, buf, key) = fast_registered(env)?;
            local_op_on_b(&p, SendOp::LocalInv { key }, 40, WcOpcode::LocalInv)?;
            let sgl = [buf.sge(0, 8192)?];
            ensure_eq!(fr.map_pages(&sgl, 4096)?, 1, "entries mapped");
            let key2 = inc_key(key);
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            local_op_on_b(
                &p,
                SendOp::RegMr {
                    mr: &fr,
                    key: key2,
                    access,
                },
                41,
                WcOpcode::RegMr,
            )?;
            let wc = write_from_a(
                &p,
                RemoteAddr {
                    addr: fr.addr(),
                    rkey: key2,
                },
                64,
                42,
            )?;
            check_wc(&wc, 42, WcStatus::Success, None, "write with the new key")?;
            let wc = write_from_a(
                &p,
                RemoteAddr {
                    addr: fr.addr(),
                    rkey: key,
                },
                64,
                43,
            )?;
            check_wc(&wc, 43, WcStatus::RemAccessErr, None, "write with the previous key")
        },
    ));
    out.push(Case::new(
        "mr.fast_reg.reg_may_change_only_key_byte",
        "a REG_MR whose key differs from the MR's in the index bits is rejected (EINVAL or an error completion)",
        "docs/design.md §3.6 (REG_MR may change only the key byte)",
        &[Cap::FastReg],
        |env: &Env| {
            let p = rc_pair(env)?;
            let buf = p.b.pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE)?;
            let fr = p.b.pd.alloc_fast_reg_mr(2)?;
            fr.map_pages(&[buf.sge(0, 8192)?], 4096)?;
            let bad = fr.lkey() ^ 0x100;
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let r = p.b.post(
                SendWr::new(
                    50,
                    SendOp::RegMr {
                        mr: &fr,
                        key: bad,
                        access,
                    },
                    &[],
                )
                .flags(SendFlags::SIGNALED),
            );
            match r {
                Err(e) if e.error.kind() == ErrorKind::InvalidArgument => Ok(()),
                Err(e) => Err(Stop::from(e)),
                Ok(()) => {
                    let wc = expect_one(&p.b.scq, "REG_MR completion")?;
                    ensure!(!wc.is_success(), "a REG_MR changing the key index succeeded");
                    Ok(())
                }
            }
        },
    ));
}

/// A pair whose side B has a two-page buffer fast-registered (VALID) with
/// LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ; returns the pair, the
/// fast-registration MR, the buffer and the key.
fn fast_registered(env: &Env) -> R<(Pair, Mr, Mr, u32)> {
    let p = rc_pair(env)?;
    let buf = p.b.pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE)?;
    let fr = p.b.pd.alloc_fast_reg_mr(2)?;
    let n = fr.map_pages(&[buf.sge(0, 8192)?], 4096)?;
    ensure_eq!(n, 1, "entries mapped");
    let key = fr.next_key();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    local_op_on_b(&p, SendOp::RegMr { mr: &fr, key, access }, 99, WcOpcode::RegMr)?;
    Ok((p, fr, buf, key))
}

fn windows(out: &mut Vec<Case>) {
    let mw_access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    out.push(Case::new(
        "mw.type1.bind_and_access",
        "a type 1 window bound with bind_mw grants remote write inside it; a write outside fails REM_ACCESS_ERR",
        "docs/design.md §3.6; IBTA 10.6.7 (memory windows); ibv_bind_mw(3)",
        &[Cap::MwType1],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            let rkey = bind1(&p, &mw, &mr, 4096, 4096, AccessFlags::REMOTE_WRITE)?;
            p.a.mr.write(0, &pattern(128, 3))?;
            let inside = RemoteAddr {
                addr: mr.addr() + 4096,
                rkey,
            };
            let wc = write_from_a(&p, inside, 128, 2)?;
            check_wc(
                &wc,
                2,
                WcStatus::Success,
                Some(WcOpcode::RdmaWrite),
                "write inside the window",
            )?;
            ensure_eq!(
                mr.to_vec(4096, 128)?,
                pattern(128, 3),
                "data written through the window"
            );
            let outside = RemoteAddr { addr: mr.addr(), rkey };
            let wc = write_from_a(&p, outside, 128, 3)?;
            check_wc(&wc, 3, WcStatus::RemAccessErr, None, "write outside the window")
        },
    ));
    out.push(Case::new(
        "mw.type1.dereg_mr_busy",
        "deregistering an MR with a bound window fails with EBUSY",
        "docs/design.md §3.6 (dereg of an MR with a bound window fails)",
        &[Cap::MwType1],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            bind1(&p, &mw, &mr, 0, 4096, AccessFlags::REMOTE_READ)?;
            match mr.destroy() {
                Ok(()) => fail!("dereg succeeded with a bound window"),
                Err(e) if e.error.kind() == ErrorKind::Busy => Ok(()),
                Err(e) => fail!("expected EBUSY, got {}", e.error),
            }
        },
    ));
    out.push(Case::new(
        "mw.type1.dealloc_invalidates",
        "deallocating a bound window invalidates its rkey: a later write fails with REM_ACCESS_ERR",
        "docs/design.md §3.6 (invalidation by dealloc)",
        &[Cap::MwType1],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            let rkey = bind1(&p, &mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE)?;
            mw.destroy()?;
            let wc = write_from_a(&p, RemoteAddr { addr: mr.addr(), rkey }, 64, 4)?;
            check_wc(
                &wc,
                4,
                WcStatus::RemAccessErr,
                None,
                "write through a deallocated window",
            )
        },
    ));
    out.push(Case::new(
        "mw.type1.zero_length_bind_unbinds",
        "binding a type 1 window with length 0 invalidates it: a later write fails with REM_ACCESS_ERR",
        "ibv_bind_mw(3) (a zero-length bind unbinds)",
        &[Cap::MwType1],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            let rkey = bind1(&p, &mw, &mr, 0, 4096, AccessFlags::REMOTE_WRITE)?;
            bind1(&p, &mw, &mr, 0, 0, AccessFlags::REMOTE_WRITE)?;
            let wc = write_from_a(&p, RemoteAddr { addr: mr.addr(), rkey }, 64, 5)?;
            check_wc(&wc, 5, WcStatus::RemAccessErr, None, "write through an unbound window")
        },
    ));
    out.push(Case::new(
        "mw.type1.bind_needs_mw_bind_access",
        "binding onto an MR registered without MW_BIND fails (EINVAL or an MW_BIND_ERR completion)",
        "ibv_bind_mw(3); IBTA 10.6.7.2",
        &[Cap::MwType1],
        |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            let bind = MwBindInfo {
                mr: &mr,
                addr: mr.addr(),
                length: 4096,
                access: AccessFlags::REMOTE_READ,
            };
            match p.b.qp.bind_mw(&mw, 6, &bind, SendFlags::SIGNALED) {
                Err(e) if e.kind() == ErrorKind::InvalidArgument => Ok(()),
                Err(e) => Err(Stop::from(e)),
                Ok(_) => {
                    let wc = expect_one(&p.b.scq, "bind completion")?;
                    ensure!(!wc.is_success(), "bind onto an MR without MW_BIND succeeded");
                    Ok(())
                }
            }
        },
    ));
    out.push(Case::new(
        "mw.type2.bind_verb_rejected",
        "bind_mw (the type 1 verb) on a type 2 window fails with EINVAL",
        "ibv_bind_mw(3) (type 2 windows are bound by a BIND_MW work request)",
        &[Cap::MwType2],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type2)?;
            let bind = MwBindInfo {
                mr: &mr,
                addr: mr.addr(),
                length: 4096,
                access: AccessFlags::REMOTE_READ,
            };
            expect_err(
                p.b.qp.bind_mw(&mw, 7, &bind, SendFlags::SIGNALED),
                ErrorKind::InvalidArgument,
                "bind_mw",
            )
        },
    ));
    out.push(Case::new(
        "mw.type2.bind_wr_and_access",
        "a BIND_MW work request binds a type 2 window with the next rkey; the peer writes through it",
        "docs/design.md §3.6; IBTA 10.6.7.2.2 (type 2 windows)",
        &[Cap::MwType2],
        move |env: &Env| {
            let (p, mr, _mw, rkey) = bound2(env, mw_access)?;
            p.a.mr.write(0, &pattern(64, 4))?;
            let wc = write_from_a(&p, RemoteAddr { addr: mr.addr(), rkey }, 64, 8)?;
            check_wc(
                &wc,
                8,
                WcStatus::Success,
                Some(WcOpcode::RdmaWrite),
                "write through the window",
            )?;
            ensure_eq!(mr.to_vec(0, 64)?, pattern(64, 4), "data written through the window");
            Ok(())
        },
    ));
    out.push(Case::new(
        "mw.type2.local_inv",
        "LOCAL_INV of a bound type 2 window's rkey invalidates it",
        "docs/design.md §3.6 (invalidation by LOCAL_INV)",
        &[Cap::MwType2],
        move |env: &Env| {
            let (p, mr, _mw, rkey) = bound2(env, mw_access)?;
            local_op_on_b(&p, SendOp::LocalInv { key: rkey }, 9, WcOpcode::LocalInv)?;
            let wc = write_from_a(&p, RemoteAddr { addr: mr.addr(), rkey }, 64, 10)?;
            check_wc(
                &wc,
                10,
                WcStatus::RemAccessErr,
                None,
                "write after LOCAL_INV of the window",
            )
        },
    ));
    out.push(Case::new(
        "mw.type2.send_with_invalidate",
        "SEND_WITH_INV of a type 2 window's rkey invalidates it and the receive reports it",
        "docs/design.md §3.5, §3.6",
        &[Cap::MwType2],
        move |env: &Env| {
            let (p, mr, _mw, rkey) = bound2(env, mw_access)?;
            p.b.post_recv(11, 0, 1024)?;
            let sge = [p.a.mr.sge(0, 16)?];
            p.a.post(SendWr::new(12, SendOp::SendWithInv { rkey }, &sge).flags(SendFlags::SIGNALED))?;
            let wc = expect_one(&p.b.rcq, "receive completion")?;
            check_wc(&wc, 11, WcStatus::Success, Some(WcOpcode::Recv), "receive")?;
            ensure_eq!(wc.invalidated_rkey(), Some(rkey), "invalidated rkey");
            let wc = expect_one(&p.a.scq, "send completion")?;
            check_wc(&wc, 12, WcStatus::Success, Some(WcOpcode::Send), "send with invalidate")?;
            let wc = write_from_a(&p, RemoteAddr { addr: mr.addr(), rkey }, 64, 13)?;
            check_wc(
                &wc,
                13,
                WcStatus::RemAccessErr,
                None,
                "write after send with invalidate",
            )
        },
    ));
    out.push(Case::new(
        "mw.type2.bind_wr_with_type1_rejected",
        "a BIND_MW work request naming a type 1 window is rejected with EINVAL",
        "IBTA 10.6.7.2 (type 1 windows are bound by the verb)",
        &[Cap::MwType1],
        move |env: &Env| {
            let p = rc_pair(env)?;
            let mr = p.b.pd.alloc_mr(8192, mw_access)?;
            let mw = p.b.pd.alloc_mw(MwType::Type1)?;
            let bind = MwBindInfo {
                mr: &mr,
                addr: mr.addr(),
                length: 4096,
                access: AccessFlags::REMOTE_READ,
            };
            let op = SendOp::BindMw {
                mw: &mw,
                rkey: mw.next_rkey(),
                bind,
            };
            let r = p.b.post(SendWr::new(14, op, &[]).flags(SendFlags::SIGNALED));
            expect_post_err(r, 0, ErrorKind::InvalidArgument, "BIND_MW of a type 1 window")
        },
    ));
}

/// Binds a type 1 window over `len` bytes at `offset` of `mr` through B's
/// QP and waits for the bind's completion; returns the new rkey.
fn bind1(p: &Pair, mw: &Mw, mr: &Mr, offset: u64, len: u64, access: AccessFlags) -> R<u32> {
    let bind = MwBindInfo {
        mr,
        addr: mr.addr() + offset,
        length: len,
        access,
    };
    let rkey = p.b.qp.bind_mw(mw, 77, &bind, SendFlags::SIGNALED)?;
    let wc = expect_one(&p.b.scq, "bind completion")?;
    check_wc(&wc, 77, WcStatus::Success, Some(WcOpcode::BindMw), "bind_mw")?;
    ensure_eq!(mw.rkey(), rkey, "window rkey after the bind");
    Ok(rkey)
}

/// A pair whose side B has a type 2 window bound (remote write) over the
/// first 4 KiB of an MR; returns the pair, the MR, the window and the rkey.
fn bound2(env: &Env, mr_access: AccessFlags) -> R<(Pair, Mr, Mw, u32)> {
    let p = rc_pair(env)?;
    let mr = p.b.pd.alloc_mr(8192, mr_access)?;
    let mw = p.b.pd.alloc_mw(MwType::Type2)?;
    let rkey = mw.next_rkey();
    {
        let bind = MwBindInfo {
            mr: &mr,
            addr: mr.addr(),
            length: 4096,
            access: AccessFlags::REMOTE_WRITE,
        };
        local_op_on_b(&p, SendOp::BindMw { mw: &mw, rkey, bind }, 88, WcOpcode::BindMw)?;
    }
    Ok((p, mr, mw, rkey))
}
